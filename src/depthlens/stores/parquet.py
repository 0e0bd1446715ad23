"""Sharded Parquet stores: per-token arrays as typed list columns, committed shard by shard.

A store is a directory: ``part-NNNNNN.parquet`` shards and ``manifest.json`` (settings, input hashes and the list
of committed shards). A shard is written whole under a temporary name, fsynced and renamed, then the manifest is
rewritten (also whole, then renamed): the manifest is the commit, so a crash loses at most the shards in flight.
Every shard also carries the settings it was written with in its Parquet metadata, so shards of runs with
different settings are never read as one store. Per-token divergences ``[T × L]`` are a
``list<fixed_size_list<float32, L>>`` column (float16 on request); other per-token floats ``list<float32>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from depthlens.errors import StoreError
from depthlens.stores.files import (
    ResumeRules,
    changed_settings,
    manifest_path,
    read_json,
    resume_check,
    settings_differ,
    write_error,
    write_json,
)
from depthlens.stores.jsonl import KILL_AFTER, iter_jsonl_located

MANIFEST = "manifest.json"
_PART = "part-{:06d}.parquet"
_SETTINGS_KEY = b"depthlens.settings"
_FREE_KEY = b"depthlens.free"  # settings a resumed run may change (batch size, more questions): not compared
# Keys that neither change a record's result nor belong in a shard's settings.
_UNCOMPARED = {"command", "started", "input_hashes", "shards", "n_layers", "regraded"}


def is_store(path: Path) -> bool:
    """Whether ``path`` is a Parquet store directory (one with a manifest.json)."""
    return path.is_dir() and (path / MANIFEST).is_file()


def _float_list(values: list[Any], width: pa.DataType) -> pa.Array:
    return pa.array([None if v is None else np.asarray(v, dtype=width.to_pandas_dtype()) for v in values],
                    type=pa.list_(width))  # fmt: skip


def _matrix_list(values: list[Any], width: pa.DataType) -> pa.Array:
    """Rows of ``[T × L]`` matrices as ``list<fixed_size_list<width, L>>`` (L from the first non-empty row)."""
    n_layers = next((len(v[0]) for v in values if v), 0)
    dtype = width.to_pandas_dtype()
    offsets, flat = [0], []
    for v in values:
        rows = np.asarray(v, dtype=dtype).reshape(-1, n_layers) if v else np.zeros((0, n_layers), dtype)
        # a record without the matrix (None) is stored as an empty list: readers see no rows either way
        flat.append(rows.reshape(-1))
        offsets.append(offsets[-1] + len(rows))
    inner = pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(flat), type=width), n_layers)
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), inner)


def _kind(values: list[Any]) -> str:
    """``matrix`` for rows of float rows, ``floats`` for float lists, else ``other`` (Arrow infers the type)."""
    first = next((v for v in values if isinstance(v, list) and v), None)
    if first is None:
        return "other"
    if isinstance(first[0], list):
        row = next((r for v in values if isinstance(v, list) for r in v if r), [])
        return "matrix" if row and isinstance(row[0], float) else "other"
    return "floats" if any(isinstance(x, float) for x in first) else "other"


def to_table(results: Iterable[dict[str, Any]], float16: bool = False) -> pa.Table:
    """Result dicts (``score``'s, or a sample store's responses) as one Arrow table: per-token float lists at the
    store's width, ``[T × L]`` float rows (divergences) as ``list<fixed_size_list<width, L>>``."""
    rows = list(results)
    width = pa.float16() if float16 else pa.float32()
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(r))
    columns = {}
    for key in keys:
        values = [r.get(key) for r in rows]
        kind = _kind(values)
        if kind == "matrix":
            columns[key] = _matrix_list(values, width)
        elif kind == "floats":
            columns[key] = _float_list(values, width)
        else:
            columns[key] = pa.array(values)
    return pa.table(columns)


def table_records(table: pa.Table) -> Iterator[dict[str, Any]]:
    """The records of a shard as dicts, as ``to_table`` got them (per-token floats widened to Python floats); a
    list a record did not have (null in its row) is left out, as it was."""
    lists = {f.name for f in table.schema if pa.types.is_list(f.type)}
    for row in table.to_pylist():
        yield {k: v for k, v in row.items() if v is not None or k not in lists}


def _settings(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest.items() if k not in _UNCOMPARED}


def _committed(out: Path, manifest: dict[str, Any]) -> list[str]:
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) and isinstance(s.get("file"), str)
                                               for s in shards):  # fmt: skip
        raise StoreError(f"{out / MANIFEST}: no list of shards; not a depthlens Parquet store")
    return [s["file"] for s in shards]


def committed_shards(path: Path) -> list[str]:
    """The shard files the manifest of the store ``path`` commits, in order."""
    return _committed(path, store_manifest(path))


def read_shard(path: Path, settings: dict[str, Any] | None = None) -> pa.Table:
    """One shard; refused when it was written with other ``settings`` than its store's (naming each)."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        detail = re.sub(r"^Could not open Parquet input source '[^']*': ", "", str(exc))
        raise StoreError(
            f"{path}: not a readable Parquet shard ({detail}); delete it and rerun the command that wrote the "
            "store with --resume (its records are computed again)"
        ) from None
    if settings is not None:
        meta = table.schema.metadata or {}
        stored = json.loads(meta.get(_SETTINGS_KEY, b"{}"))
        differ = settings_differ(stored, settings, json.loads(meta.get(_FREE_KEY, b"[]")))
        if differ:
            raise StoreError(
                f"{path}: this shard was written with other settings than its store ({'; '.join(differ)}); "
                "move it to a store of its own"
            )
    return table


def _write_shard(path: Path, table: pa.Table, settings: dict[str, Any], free: Collection[str]) -> None:
    """Write ``table`` whole to ``path`` (a temporary name, fsynced, renamed) with its store's settings."""
    meta = {**(table.schema.metadata or {}), _SETTINGS_KEY: json.dumps(settings).encode(),
            _FREE_KEY: json.dumps(sorted(free)).encode()}  # fmt: skip
    tmp = path.with_name(path.name + ".tmp")
    try:
        pq.write_table(table.replace_schema_metadata(meta), tmp, compression="zstd")
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(path, exc) from exc


def _remove_unlisted(path: Path, listed: Collection[str]) -> None:
    """Delete the shard files the manifest does not list: in flight when a run or a rewrite died."""
    for orphan in path.glob("part-*.parquet*"):
        if orphan.name not in listed:
            orphan.unlink()


def _float16(manifest: dict[str, Any]) -> bool:
    """Whether the store ``manifest`` describes keeps its per-token floats as float16."""
    return bool(manifest.get("store", {}).get("float16"))


def rewrite_store(
    path: Path, manifest: dict[str, Any], change: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    """Pass every record of the store ``path`` through ``change`` and commit the result with ``manifest``.

    The new shards are written beside the old ones under new names; the manifest, renamed into place, is the
    commit; the old shards are deleted after it. A crash before the commit leaves the old store whole (the new,
    unlisted shards are removed by the next rewrite or resumed run).
    """
    stored = store_manifest(path)
    committed = _committed(path, stored)
    _remove_unlisted(path, set(committed))  # left by an interrupted rewrite or run
    generation = 1 + max((int(m.group(1)) for name in committed if (m := re.search(r"\.r(\d+)\.parquet$", name))),
                         default=0)  # fmt: skip
    float16 = _float16(manifest)
    shards = []
    for i, name in enumerate(committed):
        table = read_shard(path / name, _settings(stored))
        free = json.loads((table.schema.metadata or {}).get(_FREE_KEY, b"[]"))
        new = to_table([change(r) for r in table_records(table)], float16=float16)
        new_name = f"part-{i:06d}.r{generation}.parquet"
        _write_shard(path / new_name, new, _settings(manifest), free)
        shards.append({"file": new_name, "rows": new.num_rows})
    write_json(path / MANIFEST, {**manifest, "shards": shards})
    for name in committed:
        (path / name).unlink(missing_ok=True)


def iter_store(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a results store: a JSONL file, or a sharded Parquet store read as one."""
    for _, record in iter_store_located(path):
        yield record


def iter_store_located(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) for every record of a results store, as ``iter_store``; ``where`` names the file and line
    (JSONL) or the shard and row (Parquet), for errors about one record."""
    if not path.is_dir():
        yield from iter_jsonl_located(path)
        return
    manifest = store_manifest(path)
    committed = _committed(path, manifest)
    extra = sorted({p.name for p in path.glob("part-*.parquet")} - set(committed))
    if extra:
        raise StoreError(
            f"{path / extra[0]}: a shard the manifest does not list (left by an interrupted run or regrade, or "
            "copied in); rerun that command (with --resume), or move the shard away"
        )
    for name in committed:
        rows = table_records(read_shard(path / name, _settings(manifest)))
        yield from ((f"{path / name} row {i}", record) for i, record in enumerate(rows, start=1))


def store_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a JSONL results file or of a Parquet store."""
    if path.is_dir() and not is_store(path):
        raise StoreError(f"{path}: a directory without {MANIFEST}; not a depthlens Parquet store")
    meta = path / MANIFEST if path.is_dir() else manifest_path(path)
    return read_json(meta, "manifest", "rerun the command that wrote it with --resume")


def check_store(
    out: Path,
    manifest: dict[str, Any] | None,
    resume: bool,
    overwrite: bool = False,
    rules: ResumeRules = ResumeRules(),
) -> bool:
    """As ``jsonl.check_output`` for a store directory: whether writing resumes it; refusals name settings."""
    if out.exists() and not out.is_dir():
        raise StoreError(f"{out} is a file; a Parquet store is a directory — give a new --out")
    exists = out.is_dir() and any(out.iterdir())
    return resume_check(out, out / MANIFEST, exists, manifest, resume, overwrite, rules, _UNCOMPARED)


class ShardWriter:
    """Writes result tables as shards of a Parquet store, each committed to the manifest once it is whole."""

    def __init__(
        self,
        out: Path,
        manifest: dict[str, Any],
        resume: bool,
        overwrite: bool = False,
        rules: ResumeRules = ResumeRules(),
        hashes: dict[str, str] | None = None,
        *,
        shard_rows: int = 256,
        commit_s: float | None = None,
    ) -> None:
        """Open ``out`` for a new run, or (``resume``) continue one written with the same settings (``rules``: as
        ``ResultWriter``'s); records whose input ``hashes`` changed since are dropped from their shards
        (``rescored`` lists them).

        Buffered records are committed as a shard every ``shard_rows`` records, at ``flush``, and (with
        ``commit_s``) once a record is written ``commit_s`` seconds or more after the last commit.
        """
        self.out, self.shard_rows, self.commit_s = out, shard_rows, commit_s
        self.done: set[str] = set()
        self.rescored: list[str] = []
        self.changed: list[str] = []  # the ``free`` / ``extend`` settings this resumed run changed
        self._buffer: list[dict[str, Any]] = []
        self._last_commit = time.monotonic()
        self._written = 0
        self._kill_after = int(os.environ.get(KILL_AFTER, "-1"))
        manifest = {**manifest, "input_hashes": hashes} if hashes is not None else dict(manifest)
        resuming = check_store(out, manifest, resume, overwrite, rules)
        self._free = rules.movable  # may differ between shards: not part of a shard's settings
        self.manifest: dict[str, Any] = {**manifest, "shards": []}
        shards: list[dict[str, Any]] = []
        if resuming:
            stored = read_json(out / MANIFEST, "manifest", "use --overwrite to start again, or a new --out")
            self.changed = changed_settings(_settings(stored), manifest, rules, _UNCOMPARED)
            shards = [s for s in stored["shards"] if (out / s["file"]).is_file()]
            for s in shards:
                self.done.update(self._ids(s, stored.get("input_hashes"), hashes))
            # kept from the stored manifest: the model's depth, and the store's regrade log (studies.regrade)
            for key in ("n_layers", "regraded"):
                if stored.get(key) is not None:
                    self.manifest.setdefault(key, stored[key])
        elif out.exists():
            for old in [*out.glob("part-*.parquet*"), out / MANIFEST]:
                old.unlink(missing_ok=True)
        _remove_unlisted(out, {s["file"] for s in shards})  # in flight when the last run died: recomputed
        self.manifest["shards"] = shards
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / MANIFEST, self.manifest)

    def _ids(self, shard: dict[str, Any], stored: object, hashes: dict[str, str] | None) -> list[str]:
        """The ids of a committed shard; those whose input changed are cut out of it (rewritten whole)."""
        path = self.out / shard["file"]
        table = read_shard(path, self._shard_settings())
        ids = [str(i) for i in table.column("id").to_pylist()]
        if isinstance(stored, dict) and hashes is not None:
            stale = {i for i in ids if i in stored and i in hashes and stored[i] != hashes[i]}
            if stale:
                keep = pa.array([i not in stale for i in ids])
                self._write_file(path, table.filter(keep))
                shard["rows"] = len(ids) - len(stale)
                self.rescored.extend(sorted(stale))
                ids = [i for i in ids if i not in stale]
        return ids

    def _shard_settings(self) -> dict[str, Any]:
        return _settings(self.manifest)

    def _write_file(self, path: Path, table: pa.Table) -> None:
        _write_shard(path, table, self._shard_settings(), self._free)

    def write_table(self, table: pa.Table, n_layers: int | None = None) -> None:
        """Commit ``table`` as the next shard: written whole, renamed, then listed in the manifest."""
        if table.num_rows == 0:
            return
        name = _PART.format(len(self.manifest["shards"]))
        if self._written == self._kill_after:  # fault injection: die with a shard half-written
            (self.out / (name + ".tmp")).write_bytes(b"PAR1")
            os.kill(os.getpid(), signal.SIGKILL)
        self._write_file(self.out / name, table)
        if n_layers is not None:
            self.manifest["n_layers"] = n_layers
        self.manifest["shards"].append({"file": name, "rows": table.num_rows})
        write_json(self.out / MANIFEST, self.manifest)
        self.done.update(str(i) for i in table.column("id").to_pylist())
        self._written += 1
        self._last_commit = time.monotonic()

    def write(self, record: dict[str, Any]) -> None:
        """Buffer one result; a shard is committed every ``shard_rows`` records or ``commit_s`` seconds."""
        self._buffer.append(record)
        late = self.commit_s is not None and time.monotonic() - self._last_commit >= self.commit_s
        if len(self._buffer) >= self.shard_rows or late:
            self.flush()

    def flush(self) -> None:
        """Commit the buffered records as one shard (a generation batch, the end of a run)."""
        if self._buffer:
            table = to_table(self._buffer, float16=_float16(self.manifest))
            self._buffer = []
            self.write_table(table)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is None:
            self.close()
        else:  # an error mid-run: keep what is whole, as the JSONL writer does
            with contextlib.suppress(Exception):
                self.flush()
