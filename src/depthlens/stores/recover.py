"""What a writer does to a Parquet store under its lock: write a shard under its hidden name, commit and publish
(``publish``), and, when it resumes, take stock (``recover``): finish a commit a kill interrupted, remove what was
in flight, set aside lost or cut shards so their records are computed again, and move a store written before
the current layout to it. Nothing here runs without the store's write lock (``stores.lock``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from depthlens.errors import StoreError
from depthlens.stores import layout, shard_checks
from depthlens.stores.arrow import not_utf8
from depthlens.stores.commits import COMMITTED, committed_entry
from depthlens.stores.files import settings_differ, write_error, write_json
from depthlens.stores.lock import LOCK
from depthlens.stores.parquet import range_problem, settings_problem


def write_staged(store: Path, name: str, table: pa.Table, meta: dict[bytes, bytes]) -> dict[str, Any]:
    """Write ``table`` whole under the hidden name of shard ``name`` (fsynced); returns its manifest entry."""
    data = layout.encode(table, meta)
    path = layout.staged(store, name)
    try:
        with path.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        path.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_error(store / name, exc) from exc
        raise
    return layout.entry(name, table, data)


def publish(
    store: Path, manifest: dict[str, Any], new: list[dict[str, Any]], replaced: list[dict[str, Any]]
) -> None:
    """Commit ``manifest`` (its rename is the commit), then publish: the ``replaced`` shards get hidden names
    (readers of the state before keep finding them), the ``new`` ones (written by ``write_staged``) their own."""
    manifest = {k: v for k, v in manifest.items() if k != "superseded"}
    manifest[COMMITTED] = committed_entry(manifest)  # what a reader must find listed
    if replaced:
        manifest["superseded"] = [s["file"] for s in replaced]
    write_json(store / layout.MANIFEST, manifest)
    layout.fsync_dir(store)
    for shard in replaced:
        old = store / shard["file"]
        if old.is_file():
            old.replace(layout.superseded(store, shard["file"]))
    for shard in new:
        layout.staged(store, shard["file"]).replace(store / shard["file"])
    (store / layout.LEGACY_MANIFEST).unlink(
        missing_ok=True
    )  # a store moved to this layout: the new one rules
    layout.fsync_dir(store)


def replace_store_files(store: Path) -> None:
    """``--overwrite``: remove every file of the store depthlens wrote (shards, hidden ones, manifests)."""
    if not store.is_dir():
        return
    for path in store.iterdir():
        ours = path.suffix == ".parquet" or path.name.startswith(
            (".part-", "part-", "._manifest", "_manifest")
        )
        if path.is_file() and path.name != LOCK and (ours or path.name == layout.LEGACY_MANIFEST):
            path.unlink()


@dataclasses.dataclass(frozen=True)
class Recovered:
    kept: list[dict[str, Any]]  # whole shards, published, with full entries
    dropped: list[str]  # shards lost or cut: their records are computed again


def _leftovers(store: Path, listed: set[str], replaced: set[str], legacy: bool) -> None:
    """Remove what a dead writer had in flight: hidden shards no commit lists, shards a regrade replaced, and (a
    store of the earlier layout) shards renamed into place but never listed — set aside, not deleted."""
    for path in list(store.iterdir()):
        name = path.name
        in_flight = (
            (name in replaced and name not in listed)  # a regrade died between its commit and its renames
            or (name.startswith(".part-") and name.endswith((".tmp", ".old")) and name[1:-4] not in listed)
            or (legacy and name.startswith("part-") and name.endswith(".parquet.tmp"))
        )
        if in_flight:
            path.unlink()
        elif legacy and name.startswith("part-") and name.endswith(".parquet") and name not in listed:
            path.replace(store / f".{name}.unlisted")


def _read_whole(path: Path) -> pa.Table:
    """A shard read whole, each page's checksum verified: its ids, rows and values are what a reader would see
    (a resumed run sets aside what a reader would refuse)."""
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as exc:
        raise _Unreadable(" ".join(str(exc).split())) from None
    column = not_utf8(table)
    if column is not None:  # as every reader refuses it (``layout.read_table``)
        raise _Unreadable(f"its {column!r} column holds bytes that are not UTF-8")
    return table


class _Unreadable(Exception):
    pass


def _check_one(
    store: Path, stored: dict[str, Any], shard: dict[str, Any], settings: dict[str, Any] | None
) -> tuple[Path | None, layout.Problem | None, pa.Table | None]:
    # verified against its sha256: a shard changed in place is set aside and recomputed, as `check` promises
    path, problem = shard_checks.shard_problem(store, stored, shard, verify=True)
    if problem is not None or path is None:
        return path, problem, None
    try:
        table = _read_whole(path)
    except _Unreadable as exc:
        return (
            path,
            layout.Problem(
                path,
                "cut",
                f"not a readable Parquet shard ({exc})",
                shard_checks.resume_remedy(store, stored, shard),
            ),
            None,
        )
    problem = shard_checks.table_problem(store, path, stored, shard, table)
    problem = problem or range_problem(store, path, stored, shard, table)
    if problem is None and settings is not None:
        try:
            shard_settings, free = layout.shard_settings(table)
        except ValueError:  # its footer's settings changed in place: named by settings_problem
            return path, settings_problem(store, path, stored, table), table
        differ = settings_differ(shard_settings, settings, free)
        if differ:  # an edited manifest is the fault, named as such; else the shard is another run's
            problem = settings_problem(store, path, stored, table) or layout.Problem(
                path,
                "foreign",
                f"written with other settings than its store ({'; '.join(differ)})",
                "move it out of the store",
            )
    return path, problem, table


def recover(
    store: Path, stored: dict[str, Any], settings: dict[str, Any] | None, strict: bool = False
) -> Recovered:
    """Take stock of a store before writing to it (under its lock; nothing is committed here).

    A shard of another run, a data file the manifest does not list, or a shard that is a symlink (a store holds
    its own files) stops the run naming it (it is not ours to move). A lost, cut or changed (sha256) shard is
    dropped from the store — a cut or changed one renamed to ``.part-N.parquet.damaged`` — so a resumed run
    computes its records again; ``strict`` (a regrade, which cannot recompute) refuses instead.
    """
    legacy = layout.is_legacy(store)
    shards = layout.entries(store, stored)
    listed = {s["file"] for s in shards}
    _leftovers(store, listed, set(stored.get("superseded") or []), legacy)
    extra = shard_checks.unlisted(store, listed, stored)
    if extra:
        raise StoreError(extra[0].message())
    kept, dropped = [], []
    for shard in shards:
        path, problem, table = _check_one(store, stored, shard, settings)
        if problem is not None and (problem.kind in ("foreign", "manifest", "outside") or strict):
            raise StoreError(problem.message())
        if problem is not None or path is None or table is None:
            if path is not None:
                path.replace(layout.damaged_copy(store, shard["file"]))
            dropped.append(shard["file"])
            continue
        if path != store / shard["file"]:  # committed, not yet published when the writer died
            path.replace(store / shard["file"])
        if not all(k in shard for k in ("bytes", "sha256", "ids")):  # a shard of the earlier layout
            ids = [str(i) for i in table.column("id").to_pylist()] if "id" in table.column_names else []
            file = store / shard["file"]
            shard = {**shard, "bytes": file.stat().st_size, "sha256": layout.file_sha256(file), "ids": ids}
        kept.append(shard)
    return Recovered(kept, dropped)
