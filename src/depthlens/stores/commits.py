"""What a store has committed, kept in its manifest beside what it lists (issue 51).

A JSONL store: kept in its manifest as a Parquet store keeps its shards' rows and hashes
(issue 51): ``committed`` = the number of records, their bytes and the sha256 of those bytes. Appended records are
fsynced one by one and the manifest follows them at each batch and at the end, so a file holding fewer records
than its manifest committed lost some (emptied, or cut at a line boundary) and is refused by every reader, where
before it read as a smaller, whole store; ``--verify`` (and ``check``, unless ``--quick``) also hashes the
committed bytes. Lines past the commit are those of a writer that stopped before its next commit (kept:
``--resume`` reads them). A Parquet store: ``committed`` = its records and shards, so shards deleted together with
their manifest entries are refused too. A store written before this has no ``committed`` and is read as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from depthlens.stores import layout

COMMITTED = "committed"
_CHUNK = 1 << 20


class Running:
    """The commit of a JSONL file as it grows: fed each appended line, or the whole file at once."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        self._sha = hashlib.sha256()

    @classmethod
    def of(cls, path: Path) -> Running:
        """The commit of every whole line ``path`` holds now (a missing file: nothing)."""
        running = cls()
        if path.is_file():
            with path.open("rb") as f:
                for raw in f:
                    if raw.endswith(b"\n"):
                        running.add(raw)
        return running

    def add(self, line: bytes) -> None:
        self._sha.update(line)
        self.bytes += len(line)
        self.records += bool(line.strip())

    def entry(self) -> dict[str, Any]:
        return {"records": self.records, "bytes": self.bytes, "sha256": self._sha.hexdigest()}


def _prefix_sha(path: Path, size: int) -> str:
    sha, left = hashlib.sha256(), size
    with path.open("rb") as f:
        while left > 0:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                break
            sha.update(chunk)
            left -= len(chunk)
    return sha.hexdigest()


def commit_problem(
    path: Path, manifest: dict[str, Any], verify: bool, held: int | None = None
) -> tuple[str, str] | None:
    """(kind, what is wrong) where the JSONL store ``path`` holds fewer records than its manifest committed
    (``cut``: ``held`` records, counted here where None), or (``verify``) other bytes where they were
    (``changed``: the sha256 of the committed bytes, as ``--verify`` hashes a Parquet store's shards); None where
    it holds them, or the manifest records no commit. Records past the commit (a writer stopped before its next
    commit) are no fault."""
    committed = manifest.get(COMMITTED)
    if committed is None:
        return None
    entry = committed if isinstance(committed, dict) else {}
    records, size, sha = entry.get("records"), entry.get("bytes"), entry.get("sha256")
    if not (
        isinstance(records, int) and isinstance(size, int) and isinstance(sha, str) and 0 <= records <= size
    ):
        return "manifest", f"its manifest's {COMMITTED} entry is damaged ({committed!r})"
    held = Running.of(path).records if held is None else held
    if held < records:
        return "cut", (
            f"holds {held} record(s), fewer than the {records} its manifest committed: records were removed (the "
            "file was emptied or cut)"
        )
    if verify and (path.stat().st_size < size or _prefix_sha(path, size) != sha):
        return "changed", "its committed records changed since they were written (sha256 differs)"
    return None


def committed_entry(manifest: dict[str, Any]) -> dict[str, int]:
    """A Parquet manifest's count of what it commits (records, shards), written by every commit
    (``recover.publish``): shards deleted together with their entries leave fewer listed than committed."""
    shards = [s for s in manifest.get("shards") or [] if isinstance(s, dict)]
    return {"records": sum(int(s.get("rows") or 0) for s in shards), "shards": len(shards)}


def committed_problem(store: Path, manifest: dict[str, Any]) -> layout.Problem | None:
    """The manifest listing fewer records or shards than it committed (entries removed with their shards), or a
    damaged count; None where it lists them, or it records no count (a store from before)."""
    committed = manifest.get(COMMITTED)
    if committed is None:
        return None
    listed = committed_entry(manifest)
    counts = committed if isinstance(committed, dict) else {}
    if not all(isinstance(counts.get(k), int) and counts[k] >= 0 for k in listed):
        return layout.Problem(
            layout.manifest_file(store),
            "manifest",
            f"its {COMMITTED} entry is damaged ({committed!r})",
            "restore it from a copy of the store",
        )
    if listed["records"] >= counts["records"] and listed["shards"] >= counts["shards"]:
        return None
    return layout.Problem(
        layout.manifest_file(store),
        "cut",
        f"lists {listed['shards']} shard(s) holding {listed['records']} record(s), fewer than the "
        f"{counts['shards']} shard(s) and {counts['records']} record(s) it committed: shards were removed "
        "together with their entries",
        "restore the store from a copy, or rerun the command that wrote it with --resume: it computes the missing "
        "records again",
    )
