"""How one file of a sharded Parquet store is checked against its manifest, without reading its rows or with them:
each finding a ``stores.layout.Problem`` (with its one safe remedy): a listed
shard's place, size and hash (``shard_problem``), its table against its entry (``table_problem``), and the data
files no commit lists (``unlisted``, ``snapshot``). The layout they check is ``stores.layout``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from depthlens.stores.layout import (
    MANIFEST,
    RUN_KEY,
    Problem,
    entries,
    file_sha256,
    locate,
    manifest_file,
    outside,
    symlinked,
    visible_files,
)


def resume_remedy(store: Path, manifest: dict[str, Any], shard: dict[str, Any]) -> str:
    rows = shard.get("rows", "its")
    return (
        f"rerun the command that wrote the store with --resume: it sets this file aside and computes its {rows} "
        f"record(s) again (`depthlens check {store}` lists every problem)"
    )


def _link_problem(store: Path, path: Path, target: str) -> Problem:
    return Problem(
        path,
        "outside",
        f"a symlink (to {target}), not a file of the store: a store holds its own files, and no reader follows a "
        "link out of it",
        f"put the file itself in its place (`cp --remove-destination {target} {path}`), or move the link out of "
        "the store and rerun the command that wrote it with --resume: it computes its records again",
    )


def shard_problem(
    store: Path, manifest: dict[str, Any], shard: dict[str, Any], verify: bool
) -> tuple[Path | None, Problem | None]:
    """Check one listed shard without reading its rows: inside the store and no symlink, present, its size (and
    with ``verify`` its hash)."""
    why = outside(store, shard["file"])
    if why is not None:
        return None, Problem(
            manifest_file(store),
            "outside",
            f"lists {shard['file']!r} as a shard, {why}: a store holds its own files, and no reader follows a "
            "path out of it (the manifest was edited outside depthlens)",
            "restore the manifest from a copy of the store",
        )
    path = locate(store, shard)
    target = symlinked(path) if path is not None else None
    if path is not None and target is not None:
        return None, _link_problem(store, path, target)
    if path is None:
        return None, Problem(
            store / shard["file"],
            "missing",
            "a shard the manifest lists is missing",
            resume_remedy(store, manifest, shard).replace("sets this file aside and ", ""),
        )
    try:
        size = path.stat().st_size
    except FileNotFoundError:  # published (renamed) between finding and reading it: the caller looks again
        return None, Problem(
            store / shard["file"],
            "missing",
            "a shard the manifest lists is missing",
            resume_remedy(store, manifest, shard).replace("sets this file aside and ", ""),
        )
    if isinstance(shard.get("bytes"), int) and size != shard["bytes"]:
        run = _run_of(path)
        if run is not None and manifest.get("run_id") and run != manifest["run_id"]:
            return path, _foreign(path, run, manifest)
        what = (
            f"cut short ({size} bytes, fewer than committed)"
            if size < shard["bytes"] or run is None
            else "changed since it was committed (its size differs)"
        )
        return path, Problem(path, "cut", what, resume_remedy(store, manifest, shard))
    if verify and isinstance(shard.get("sha256"), str) and file_sha256(path) != shard["sha256"]:
        return path, Problem(
            path,
            "changed",
            "its content changed since it was committed (sha256 differs)",
            resume_remedy(store, manifest, shard),
        )
    return path, None


def table_problem(
    store: Path, path: Path, manifest: dict[str, Any], shard: dict[str, Any], table: pa.Table
) -> Problem | None:
    """Check a read shard against its entry: its run, its row count, the ids it holds."""
    run = (table.schema.metadata or {}).get(RUN_KEY)
    if run is not None and manifest.get("run_id") and run.decode() != manifest["run_id"]:
        return _foreign(path, run.decode(), manifest)
    if table.num_rows != shard.get("rows", table.num_rows):
        return Problem(
            path,
            "cut",
            f"{table.num_rows} rows, {shard['rows']} when committed",
            resume_remedy(store, manifest, shard),
        )
    listed = shard.get("ids")
    if isinstance(listed, list) and "id" in table.column_names:
        ids = [str(i) for i in table.column("id").to_pylist()]
        if ids != listed:
            return Problem(
                path,
                "ids",
                "holds other ids than the manifest lists for it",
                resume_remedy(store, manifest, shard),
            )
    return None


def _run_of(path: Path) -> str | None:
    """The run id a Parquet file carries ('' for none); None when it is not readable Parquet."""
    try:
        return (pq.read_schema(path).metadata or {}).get(RUN_KEY, b"").decode()
    except (OSError, pa.ArrowException, UnicodeDecodeError):
        return None


def _foreign(path: Path, run: str, manifest: dict[str, Any]) -> Problem:
    return Problem(
        path,
        "foreign",
        f"a shard of another run ({run}), not of this store's",
        "move it out of the store; `--resume` then computes the records the manifest lists under this name",
    )


def unlisted_problem(store: Path, name: str, manifest: dict[str, Any]) -> Problem:
    """A visible data file the manifest does not list: copied in, or of another run (a symlink: not followed)."""
    path = store / name
    target = symlinked(path)
    if target is not None:
        return Problem(
            path,
            "unlisted",
            f"a symlink (to {target}) the manifest does not list: Parquet readers of the directory would follow it",
            "move it out of the store",
        )
    run = _run_of(path)
    whose = (
        f"of another run ({run})"
        if run and run != manifest.get("run_id")
        else "of this run"
        if run
        else "of unknown origin"
    )
    if run and run == manifest.get("run_id") and _lost_from(path, manifest):
        # a committed shard of this very run whose records the manifest no longer lists anywhere: its shard list
        # was edited, and moving the good shard out (what a copy needs) would drop its records from the store
        return Problem(
            store / MANIFEST,
            "manifest",
            f"does not list {path}, a shard of this store's own run holding records it lists nowhere else: the "
            "manifest's shard list was edited outside depthlens (the shard is not at fault)",
            "restore the manifest from a copy of the store; leave the shard where it is",
        )
    return Problem(
        path,
        "unlisted",
        f"a data file the manifest does not list ({whose}): Parquet readers of the directory would read it",
        "move it out of the store",
    )


def _lost_from(path: Path, manifest: dict[str, Any]) -> bool:
    """Whether none of the ids the shard ``path`` holds is listed by the manifest (a copy of a listed shard holds
    listed ids)."""
    listed = {str(i) for s in manifest.get("shards") or [] if isinstance(s, dict) for i in s.get("ids") or []}
    try:
        ids = {str(i) for i in pq.read_table(path, columns=["id"]).column("id").to_pylist()}
    except (OSError, KeyError, pa.ArrowException):
        return False
    return bool(ids) and not ids & listed


def unlisted(store: Path, listed: Iterable[str], manifest: dict[str, Any]) -> list[Problem]:
    skip = {*listed, *manifest.get("superseded", [])}
    return [unlisted_problem(store, name, manifest) for name in visible_files(store) if name not in skip]


def snapshot(
    store: Path, read_manifest: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], list[Problem]]:
    """The manifest and the data files it does not list, as of one moment.

    A writer renames its manifest in, then gives the new shard its visible name, so a reader that read the manifest
    just before a commit can list a shard that manifest does not hold. Unlisted files therefore count only when the
    manifest read again after the listing is unchanged; else the listing is taken again under the newer one."""
    manifest = read_manifest()
    for _ in range(_SNAPSHOT_TRIES):
        problems = unlisted(store, [s["file"] for s in entries(store, manifest)], manifest)
        again = read_manifest() if problems else manifest
        if again == manifest:
            break
        manifest = again
    return manifest, problems


# A writer commits at most every few milliseconds: eight commits during one listing would be a stuck store.
_SNAPSHOT_TRIES = 8
