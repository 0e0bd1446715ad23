"""Sharded Parquet stores: per-token arrays as typed list columns, committed shard by shard — and their reader.

The layout, the commit and the checks are ``stores.layout``'s: a shard is written whole under a hidden name and
fsynced, the manifest listing it (rows, bytes, sha256, ids) is renamed into place — the commit —, then the shard is
renamed to its visible ``part-N.parquet``, a name never used before in the store. Every shard carries the store's
run id and settings in its Parquet metadata, so shards of other runs are never read as this store's. One writer at
a time (``stores.lock``); readers follow the manifest they read first, so they see one committed state.

This module reads a store (``iter_store``, ``read_shard``, ``store_manifest``) and says which of a manifest's keys
are a shard's settings; the writer (``ShardWriter``, a regrade's ``rewrite_store``) is ``stores.shard_writer``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from depthlens.errors import StoreError
from depthlens.stores import layout, shard_checks
from depthlens.stores.arrow import table_records, to_table
from depthlens.stores.commits import COMMITTED, committed_problem
from depthlens.stores.files import read_json, settings_differ
from depthlens.stores.jsonl_checks import iter_jsonl_checked
from depthlens.stores.layout import MANIFEST, is_store, manifest_file
from depthlens.stores.meaning import Facts
from depthlens.stores.meaning import table_problem as table_meaning
from depthlens.stores.validate import bounds, table_fault

__all__ = [
    "MANIFEST",
    "is_store",
    "iter_store",
    "iter_store_located",
    "read_shard",
    "store_manifest",
    "table_records",
    "to_table",
]

# Keys that neither change a record's result nor belong in a shard's settings.
_UNCOMPARED = {
    "command",
    "started",
    "input_hashes",
    "shards",
    "n_layers",
    "precision",  # the model as loaded (models.precision), recorded, not compared: its name is compared
    "vocab_rows",  # like n_layers, a fact of the model (compared by name), recorded since issue 51
    "regraded",
    "derived_from",  # a copy's source (studies.regrade --out, export): not a setting of its records
    "skipped",  # the input records ``score --skip-bad`` skipped: a count, not a setting
    "layout",
    "run_id",
    "next_shard",
    "superseded",
    COMMITTED,
}


def _settings(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest.items() if k not in _UNCOMPARED}


def committed_shards(path: Path) -> list[Path]:
    """The committed shard files of the store ``path``, in order, each checked for presence and size."""
    manifest = store_manifest(path)
    found = []
    for shard in layout.entries(path, manifest):
        file, problem = shard_checks.shard_problem(path, manifest, shard, verify=False)
        if problem is not None or file is None:
            raise StoreError(problem.message() if problem else f"{path / shard['file']}: missing")
        found.append(file)
    return found


def _check_settings(path: Path, table: pa.Table, settings: dict[str, Any]) -> None:
    stored, free = layout.shard_settings(table)
    differ = settings_differ(stored, settings, free)
    if differ:
        raise StoreError(
            f"{path}: this shard was written with other settings than its store ({'; '.join(differ)}); move it "
            "out of the store (`depthlens check` lists every such file)"
        )


def settings_problem(
    store: Path, path: Path, manifest: dict[str, Any], table: pa.Table
) -> layout.Problem | None:
    """A shard whose recorded settings differ from its manifest's. A shard of this very run (its run id is the
    manifest's) was written with the settings the run had, so then the manifest is the fault (edited outside
    depthlens), and the remedy puts the shard's values back in it; a shard of no known run is the fault."""
    try:
        stored, free = layout.shard_settings(table)
    except ValueError:  # a bit flipped in the footer's key-value metadata: no page checksum covers it
        return layout.Problem(
            path,
            "changed",
            "its footer's recorded settings (depthlens.settings) are not readable: bytes changed in place",
            shard_checks.resume_remedy(store, manifest, _entry(manifest, path)),
        )
    differ = settings_differ(stored, _settings(manifest), free)
    if not differ:
        return None
    run = (table.schema.metadata or {}).get(layout.RUN_KEY, b"").decode()
    if run and run == manifest.get("run_id") and _sibling_agrees(store, path, manifest):
        return layout.Problem(  # its run's other shards say what the manifest says: this footer changed
            path,
            "changed",
            f"its recorded settings differ from its store's and its run's other shards' ({'; '.join(differ)}): "
            "bytes changed in place",
            shard_checks.resume_remedy(store, manifest, _entry(manifest, path)),
        )
    if run and run == manifest.get("run_id"):
        said = "; ".join(
            d.replace("stored", "the shards say").replace("this run", "the manifest") for d in differ
        )
        return layout.Problem(
            manifest_file(store),
            "manifest",
            f"the manifest's settings differ from those its own run's shards were written with ({said}): the "
            "manifest was edited outside depthlens, the shards are not at fault",
            "put the shards' values back in the manifest (or restore it from a copy of the store); "
            f"`depthlens check {store}` then says ok",
        )
    return layout.Problem(
        path,
        "foreign",
        f"this shard was written with other settings than its store ({'; '.join(differ)})",
        "move it out of the store; `--resume` then computes the records the manifest lists under this name",
    )


def _entry(manifest: dict[str, Any], path: Path) -> dict[str, Any]:
    """The manifest's entry of the shard at ``path`` ({} where it lists none)."""
    shards = manifest.get("shards", [])
    return next((s for s in shards if isinstance(s, dict) and s.get("file") == path.name), {})


def _sibling_agrees(store: Path, path: Path, manifest: dict[str, Any]) -> bool:
    """Whether another shard of the store, its footer read, was written with the manifest's settings."""
    for entry in manifest.get("shards", []):
        listed = isinstance(entry, dict) and isinstance(entry.get("file"), str)
        other = layout.locate(store, entry) if listed and entry["file"] != path.name else None
        if other is None:
            continue
        try:
            stored, free = layout.shard_settings(pq.read_schema(other).empty_table())
        except (OSError, ValueError, pa.ArrowException):
            continue
        return not settings_differ(stored, _settings(manifest), free)
    return False


def shard_fault(
    store: Path, path: Path, manifest: dict[str, Any], shard: dict[str, Any], table: pa.Table
) -> layout.Problem | None:
    """Everything a reader checks of one read shard, in the order it checks it: its run, rows and ids
    (``shard_checks.table_problem``), its settings against the manifest, and every ranged value. ``depthlens check``
    runs this same function, so it lists every shard a reader refuses."""
    problem = shard_checks.table_problem(store, path, manifest, shard, table) or settings_problem(
        store, path, manifest, table
    )
    if problem is not None:
        return problem
    return range_problem(store, path, manifest, shard, table)


def range_problem(
    store: Path, path: Path, manifest: dict[str, Any], shard: dict[str, Any], table: pa.Table
) -> layout.Problem | None:
    """The first value of a shard out of its range (``stores.validate``), or whose values disagree with each other
    or the store (``stores.meaning``: a layer's top-k summing past 1, an id twice, past the vocabulary), named by
    row, record id and field."""
    fault = table_fault(table, bounds(manifest))
    ids = table.column("id") if "id" in table.column_names else None
    if fault is not None:
        rid = ids[fault.row - 1].as_py() if ids is not None and fault.row else None
        detail = f"row {fault.row}, {fault.detail(rid)}"
    else:
        found = table_meaning(table, Facts.of(manifest))
        if found is None:
            return None
        row, said = found
        rid = ids[row - 1].as_py() if ids is not None else None
        detail = f"row {row}, record {rid!r}: {said} — the record is damaged"
    return layout.Problem(path, "damaged", detail, shard_checks.resume_remedy(store, manifest, shard))


def read_shard(path: Path, settings: dict[str, Any] | None = None) -> pa.Table:
    """One shard file; refused when it was written with other ``settings`` than its store's (naming each)."""
    table = layout.read_table(
        path, "move it out of the store and rerun the command that wrote it with --resume"
    )
    if settings is not None:
        _check_settings(path, table, settings)
    return table


def _changed_while_read(path: Path, snapshot: dict[str, Any]) -> str | None:
    """Why a listed shard vanished during a read: the store committed another state since (a regrade)."""
    try:
        now = json.loads(manifest_file(path).read_bytes())
    except (OSError, ValueError):
        return None
    if now.get("shards") != snapshot.get("shards"):
        return f"{path}: the store was rewritten while it was read (by a regrade or a resumed run); read it again"
    return None


_verify: contextvars.ContextVar[bool] = contextvars.ContextVar("verify_shards", default=False)


@contextlib.contextmanager
def verifying(on: bool = True) -> Iterator[None]:
    """Readers in the block also check every shard's sha256 against the manifest (``--verify``)."""
    token = _verify.set(on)
    try:
        yield
    finally:
        _verify.reset(token)


def iter_store(path: Path, verify: bool = False) -> Iterator[dict[str, Any]]:
    """The records of a results store: a JSONL file, or a sharded Parquet store read as one."""
    for _, record in iter_store_located(path, verify):
        yield record


def iter_store_located(path: Path, verify: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) for every committed record of a results store, as ``iter_store``; ``where`` names the file
    and line (JSONL) or the shard and row (Parquet). A shard that is missing, cut (size, rows), changed (its hash,
    with ``verify``), of another run, or holding ids listed elsewhere is refused naming it and the safe remedy; so
    is a data file the manifest does not list. Files a writer has not committed yet are not looked at."""
    verify = verify or _verify.get()
    if not path.is_dir():
        yield from iter_jsonl_checked(path, verify)
        return
    manifest, extra = shard_checks.snapshot(path, lambda: store_manifest(path))
    shards = layout.entries(path, manifest)
    if extra:
        raise layout.Refused(extra[0])
    lost = committed_problem(path, manifest)
    if lost is not None:
        raise layout.Refused(lost)
    seen: dict[str, str] = {}
    for shard in shards:
        file, table = _read_listed(path, manifest, shard, verify)
        problem = shard_fault(path, file, manifest, shard, table) or duplicate_problem(
            path, manifest, shard, table, seen
        )
        if problem is not None:
            raise layout.Refused(problem)
        where = path / shard["file"]
        for i, record in enumerate(table_records(table), start=1):
            yield f"{where} row {i}", record


def duplicate_problem(
    store: Path, manifest: dict[str, Any], shard: dict[str, Any], table: pa.Table, seen: dict[str, str]
) -> layout.Problem | None:
    """An id of this shard that an earlier shard (``seen``: id → file) also holds; adds this shard's ids."""
    ids = [str(i) for i in table.column("id").to_pylist()] if "id" in table.column_names else []
    for row, rid in enumerate(ids, start=1):
        if rid in seen:
            return layout.Problem(
                store / shard["file"],
                "ids",
                f"row {row}: id {rid!r} is also in {seen[rid]}",
                shard_checks.resume_remedy(store, manifest, shard),
            )
        seen[rid] = shard["file"]
    return None


def _read_listed(
    path: Path, manifest: dict[str, Any], shard: dict[str, Any], verify: bool
) -> tuple[Path, pa.Table]:
    """A listed shard, found and read; a writer publishing it (a rename) meanwhile makes the reader look again."""
    for attempt in range(3):
        file, problem = shard_checks.shard_problem(path, manifest, shard, verify)
        if problem is not None or file is None:
            if problem is not None and problem.kind == "missing" and attempt < 2:
                continue
            found = problem.message() if problem is not None else f"{path / shard['file']}: not found"
            raise StoreError(_changed_while_read(path, manifest) or found)
        try:
            return file, layout.read_table(file, shard_checks.resume_remedy(path, manifest, shard))
        except FileNotFoundError:
            continue
    raise StoreError(f"{path / shard['file']}: kept moving while it was read; read the store again")


def store_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a JSONL results file or of a Parquet store."""
    from depthlens.stores.files import manifest_path

    if path.is_dir() and not is_store(path):
        responses = [p for p in (path / "samples", path / "samples.jsonl") if is_store(p) or p.is_file()]
        if responses:  # a sample store's directory given whole: its responses are the store
            raise StoreError(
                f"{path}: a sample store's directory; give its responses, {' or '.join(map(str, responses))}"
            )
        damaged = layout.without_manifest(path) or layout.without_manifest(path / "samples")
        raise StoreError(damaged or f"{path}: a directory without {MANIFEST}; not a depthlens Parquet store")
    meta = manifest_file(path) if path.is_dir() else manifest_path(path)
    return read_json(
        meta,
        "manifest",
        "a manifest is written whole, so something outside depthlens changed it: "
        f"restore it from a copy of the store (`depthlens check {path}` lists what is there)",
    )
