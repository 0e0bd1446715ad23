"""What a JSONL store has committed, kept in its manifest as a Parquet store keeps its shards' rows and hashes
(issue 51): ``committed`` = the number of records, their bytes and the sha256 of those bytes. Appended records are
fsynced one by one and the manifest follows them at each batch and at the end, so a file holding fewer bytes than
its manifest committed lost records (emptied, or cut at a line boundary) and is refused, where before it read as a
smaller, whole store. Lines past the committed bytes are those of a writer that stopped before its next commit
(kept: ``--resume`` reads them). A store written before this has no ``committed`` and is read as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

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


def commit_problem(path: Path, manifest: dict[str, Any], verify: bool) -> tuple[str, str] | None:
    """(kind, what is wrong) where the JSONL store ``path`` holds less than its manifest committed (``cut``), or
    (``verify``) other bytes (``changed``); None where it holds them, or the manifest records no commit."""
    committed = manifest.get(COMMITTED)
    if committed is None:
        return None
    records, size, sha = (
        (committed.get(k) for k in ("records", "bytes", "sha256"))
        if isinstance(committed, dict)
        else (None, None, None)
    )
    if not (
        isinstance(records, int) and isinstance(size, int) and isinstance(sha, str) and 0 <= records <= size
    ):
        return "manifest", f"its manifest's {COMMITTED} entry is damaged ({committed!r})"
    held = path.stat().st_size
    if held < size:
        lines = Running.of(path).records
        if lines < records:
            return "cut", (
                f"holds {lines} record(s) ({held} bytes), fewer than the {records} ({size} bytes) its manifest "
                "committed: records were removed (the file was emptied or cut)"
            )
        return "changed", (
            f"holds {held} bytes, fewer than the {size} its manifest committed: its committed records were "
            "edited since they were written"
        )
    if verify and _prefix_sha(path, size) != sha:
        return "changed", "its committed records changed since they were written (sha256 differs)"
    return None
