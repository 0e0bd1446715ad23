"""The on-disk layout of a sharded Parquet store, and how one shard is checked against the manifest.

A store is a directory that Parquet readers (``pd.read_parquet``, ``pyarrow.dataset``, DuckDB's
``read_parquet('STORE/*.parquet')``, Polars) read as a table of exactly its committed records:

- ``part-NNNNNN.parquet`` — committed shards, numbered from a counter that never goes back, so a name is never
  used twice (``next_shard`` in the manifest; a resumed run also skips every number present on disk);
- ``_manifest.json`` — the index and the commit: settings, the store's ``run_id``, and per shard its ``file``,
  ``rows``, ``bytes``, ``sha256`` and ``ids``. Each shard carries the run id in its own Parquet metadata;
- hidden files no Parquet reader looks at (a ``_`` or ``.`` prefix, and no ``.parquet`` suffix):
  ``.part-N.parquet.tmp`` (a shard being written, or committed and not yet published under its name),
  ``.part-N.parquet.old`` (replaced by a regrade, kept for readers that started before it until the next write),
  ``.part-N.parquet.damaged`` (a cut shard ``--resume`` moved aside before recomputing it), ``_depthlens.lock``.

A commit (Delta Lake's and Iceberg's rule): the shard is written whole under its hidden name and fsynced, then the
manifest that lists it is renamed into place (the commit), then the shard is renamed to its visible name. So a
Parquet reader never sees a file no commit lists, and depthlens's readers, which follow the manifest, read a
committed shard from its hidden name in the moment before it is published. Stores written before this layout
(``manifest.json`` among the shards, entries with ``file`` and ``rows`` only) are read as they are and moved to
this layout by the next ``--resume``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from depthlens.errors import StoreError
from depthlens.stores.arrow import not_utf8

MANIFEST = "_manifest.json"
LEGACY_MANIFEST = "manifest.json"  # stores written before the layout above
SETTINGS_KEY = b"depthlens.settings"
FREE_KEY = b"depthlens.free"  # settings a resumed run may change (batch size, more questions): not compared
RUN_KEY = b"depthlens.run_id"
_NUMBER = re.compile(r"^\.?part-(\d+)(?:\.r\d+)?\.parquet")


def manifest_file(store: Path) -> Path:
    """The manifest of the store ``store``: ``_manifest.json``, or a store's from before it, ``manifest.json``."""
    new = store / MANIFEST
    return store / LEGACY_MANIFEST if not new.is_file() and (store / LEGACY_MANIFEST).is_file() else new


def is_store(path: Path) -> bool:
    """Whether ``path`` is a Parquet store directory (one with a manifest)."""
    return path.is_dir() and manifest_file(path).is_file()


def without_manifest(store: Path) -> str | None:
    """Where ``store`` is a directory of shards whose manifest (the commit) is gone: what every reader says — the
    store is damaged, not missing (``generate`` into it would start it over) — else None."""
    if store.is_dir() and not is_store(store):
        shards = len(list(store.glob("part-*.parquet")))
        if shards:
            return (
                f"{store / MANIFEST}: missing, and {shards} shard(s) are without it (the manifest is the store's "
                "commit): the store is damaged; restore the manifest from a copy of the store"
            )
    return None


def is_legacy(store: Path) -> bool:
    return manifest_file(store).name == LEGACY_MANIFEST


def shard_name(number: int) -> str:
    return f"part-{number:06d}.parquet"


def staged(store: Path, name: str) -> Path:
    return store / f".{name}.tmp"


def superseded(store: Path, name: str) -> Path:
    return store / f".{name}.old"


def damaged_copy(store: Path, name: str) -> Path:
    return store / f".{name}.damaged"


def numbers_present(store: Path) -> list[int]:
    """The shard numbers of every shard file in ``store``, hidden ones included."""
    return (
        [int(m.group(1)) for p in store.iterdir() if (m := _NUMBER.match(p.name))] if store.is_dir() else []
    )


def next_number(store: Path, manifest: dict[str, Any]) -> int:
    """The next shard number: after every one ever committed (``next_shard``), listed, or present on disk."""
    listed = [int(m.group(1)) for s in manifest.get("shards", []) if (m := _NUMBER.match(str(s.get("file"))))]
    return max([int(manifest.get("next_shard", 0)) - 1, *listed, *numbers_present(store)], default=-1) + 1


def visible_files(store: Path) -> list[str]:
    """The data files a Parquet reader of the directory sees: every ``*.parquet`` without a ``_``/``.`` prefix."""
    return sorted(p.name for p in store.iterdir() if p.suffix == ".parquet" and p.name[0] not in "._")


def fsync_dir(path: Path) -> None:
    """Make the renames in ``path`` survive a power cut (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def encode(table: pa.Table, meta: dict[bytes, bytes]) -> bytes:
    """``table`` as the bytes of one Parquet file with ``meta`` in its schema metadata (zstd)."""
    sink = pa.BufferOutputStream()
    pq.write_table(
        table.replace_schema_metadata({**(table.schema.metadata or {}), **meta}),
        sink,
        compression="zstd",
        write_page_checksum=True,  # every read verifies each page's CRC: a changed byte is refused, not read
    )
    return sink.getvalue().to_pybytes()


def entry(name: str, table: pa.Table, data: bytes) -> dict[str, Any]:
    """The manifest's entry of a shard: name, rows, bytes, content hash and the ids it holds."""
    ids = [str(i) for i in table.column("id").to_pylist()] if "id" in table.column_names else []
    return {
        "file": name,
        "rows": table.num_rows,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "ids": ids,
    }


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def entries(store: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's shard entries, checked for shape and for ids listed under two shards."""
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not all(
        isinstance(s, dict) and isinstance(s.get("file"), str) for s in shards
    ):
        raise StoreError(f"{manifest_file(store)}: no list of shards; not a depthlens Parquet store")
    for s in shards:
        wrong = [k for k in ("rows", "bytes") if k in s and not (isinstance(s[k], int) and s[k] >= 0)]
        if wrong:
            raise Refused(
                Problem(
                    manifest_file(store),
                    "manifest",
                    f"the entry of {s['file']} holds {', '.join(f'{k} {s[k]!r}' for k in wrong)}, not a count "
                    "(a whole number ≥ 0): the manifest was edited outside depthlens",
                    "restore it from a copy of the store",
                )
            )
    for s in shards:
        why = outside(store, s["file"])
        if why is not None:  # refused before any file is looked at
            raise Refused(
                Problem(
                    manifest_file(store),
                    "outside",
                    f"lists {s['file']!r} as a shard, {why}: a store holds its own files, and no reader follows a "
                    "path out of it (the manifest was edited outside depthlens)",
                    "restore the manifest from a copy of the store",
                )
            )
    owner: dict[str, str] = {}
    for s in shards:
        for i in s.get("ids") or []:
            if i in owner:
                twice = (
                    "lists the shard twice"
                    if owner[i] == s["file"]
                    else f"lists id {i!r} under {owner[i]} too"
                )
                raise Refused(
                    Problem(
                        manifest_file(store),
                        "manifest",
                        f"{twice} (the entry of {s['file']}): a reader would count its records twice; the manifest "
                        "was edited outside depthlens",
                        "restore the manifest from a copy of the store",
                    )
                )
            owner[i] = s["file"]
    return shards


def outside(store: Path, name: str) -> str | None:
    """Why the shard path ``name`` a manifest lists is not a file of the store ``store`` itself — an absolute
    path, a path through ``..``, or through a symlink —, or None. A store holds its own files: a manifest edited to
    point elsewhere, or a shard replaced by a link to a file outside, is refused by name before any read."""
    path = Path(name)
    if path.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if not path.parts or any(part in ("..", ".", "") for part in path.parts) or "\\" in name:
        return "a path through '..'" if ".." in path.parts else "not a file name"
    here = store
    for part in path.parts[:-1]:
        here = here / part
        if here.is_symlink():
            return f"a path through the symlink {here}"
    return None


def symlinked(path: Path) -> str | None:
    """Where the symlink ``path`` points, or None when it is no symlink (a shard is a file of its own store)."""
    if not path.is_symlink():
        return None
    try:
        return str(os.readlink(path))
    except OSError:
        return "somewhere unreadable"


@dataclasses.dataclass(frozen=True)
class Problem:
    """What is wrong with one file of a store, and the one safe remedy."""

    path: Path
    kind: str  # missing, cut, changed, foreign, unlisted, ids, unreadable
    detail: str
    remedy: str

    def message(self) -> str:
        return f"{self.path}: {self.detail}; {self.remedy}"


class Refused(StoreError):
    """A reader's refusal of one file of a store, with the ``Problem`` that ``depthlens check`` lists for it."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message())
        self.problem = problem


def locate(store: Path, shard: dict[str, Any]) -> Path | None:
    """Where a committed shard is: its name, its hidden name in the moment before it is published, or (replaced
    by a regrade while a reader read the store before it) its superseded name. None for a name outside the store
    (``outside``); a symlink is found as itself (``shard_problem`` refuses it)."""
    if outside(store, shard["file"]) is not None:
        return None
    for path in (store / shard["file"], staged(store, shard["file"]), superseded(store, shard["file"])):
        if path.is_file() or path.is_symlink():
            return path
    return None


def read_table(path: Path, fix: str) -> pa.Table:
    """One shard file as a table, each page's checksum verified (shards written before checksums read as they
    are); an unreadable one raises StoreError naming it and ``fix``."""
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        detail = " ".join(re.sub(r"^Could not open Parquet input source '[^']*': ", "", str(exc)).split())
        raise StoreError(f"{path}: not a readable Parquet shard ({detail}); {fix}") from None
    column = not_utf8(table)
    if column is not None:
        raise StoreError(
            f"{path}: not a readable Parquet shard (its {column!r} column holds bytes that are not UTF-8: written "
            f"outside depthlens); {fix}"
        )
    return table


def shard_settings(table: pa.Table) -> tuple[dict[str, Any], list[str]]:
    meta = table.schema.metadata or {}
    return json.loads(meta.get(SETTINGS_KEY, b"{}")), json.loads(meta.get(FREE_KEY, b"[]"))
