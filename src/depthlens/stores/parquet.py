"""Sharded Parquet stores: per-token arrays as typed list columns, committed shard by shard.

The layout, the commit and the checks are ``stores.layout``'s: a shard is written whole under a hidden name and
fsynced, the manifest listing it (rows, bytes, sha256, ids) is renamed into place — the commit —, then the shard is
renamed to its visible ``part-N.parquet``, a name never used before in the store. Every shard carries the store's
run id and settings in its Parquet metadata, so shards of other runs are never read as this store's. One writer at
a time (``stores.lock``); readers follow the manifest they read first, so they see one committed state.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from depthlens.errors import StoreError
from depthlens.stores import layout
from depthlens.stores.arrow import table_records, to_table
from depthlens.stores.files import ResumeRules, changed_settings, read_json, resume_check, settings_differ
from depthlens.stores.jsonl import KILL_AFTER, iter_jsonl_located
from depthlens.stores.layout import MANIFEST, is_store, manifest_file
from depthlens.stores.lock import LOCK, store_lock
from depthlens.stores.recover import publish, recover, replace_store_files, write_staged

__all__ = ["MANIFEST", "ShardWriter", "is_store", "iter_store", "iter_store_located", "read_shard", "rewrite_store",
           "store_manifest", "table_records", "to_table"]  # fmt: skip

# Keys that neither change a record's result nor belong in a shard's settings.
_UNCOMPARED = {"command", "started", "input_hashes", "shards", "n_layers", "regraded", "layout", "run_id",
               "next_shard", "superseded"}  # fmt: skip


def _settings(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest.items() if k not in _UNCOMPARED}


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def committed_shards(path: Path) -> list[Path]:
    """The committed shard files of the store ``path``, in order, each checked for presence and size."""
    manifest = store_manifest(path)
    found = []
    for shard in layout.entries(path, manifest):
        file, problem = layout.shard_problem(path, manifest, shard, verify=False)
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
    if not path.is_dir():
        yield from iter_jsonl_located(path)
        return
    verify = verify or _verify.get()
    manifest, extra = layout.snapshot(path, lambda: store_manifest(path))
    shards = layout.entries(path, manifest)
    if extra:
        raise StoreError(extra[0].message())
    seen: dict[str, str] = {}
    for shard in shards:
        file, table = _read_listed(path, manifest, shard, verify)
        problem = layout.table_problem(path, file, manifest, shard, table)
        if problem is not None:
            raise StoreError(problem.message())
        _check_settings(file, table, _settings(manifest))
        where = path / shard["file"]
        for i, record in enumerate(table_records(table), start=1):
            rid = str(record.get("id"))
            if rid in seen:
                raise StoreError(f"{where} row {i}: id {rid!r} is also in {seen[rid]}; "
                                 + layout.resume_remedy(path, manifest, shard))  # fmt: skip
            seen[rid] = shard["file"]
            yield f"{where} row {i}", record


def _read_listed(
    path: Path, manifest: dict[str, Any], shard: dict[str, Any], verify: bool
) -> tuple[Path, pa.Table]:
    """A listed shard, found and read; a writer publishing it (a rename) meanwhile makes the reader look again."""
    for attempt in range(3):
        file, problem = layout.shard_problem(path, manifest, shard, verify)
        if problem is not None or file is None:
            if problem is not None and problem.kind == "missing" and attempt < 2:
                continue
            raise StoreError(_changed_while_read(path, manifest) or problem.message())  # type: ignore[union-attr]
        try:
            return file, layout.read_table(file, layout.resume_remedy(path, manifest, shard))
        except FileNotFoundError:
            continue
    raise StoreError(f"{path / shard['file']}: kept moving while it was read; read the store again")


def store_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a JSONL results file or of a Parquet store."""
    from depthlens.stores.files import manifest_path

    if path.is_dir() and not is_store(path):
        raise StoreError(f"{path}: a directory without {MANIFEST}; not a depthlens Parquet store")
    meta = manifest_file(path) if path.is_dir() else manifest_path(path)
    return read_json(meta, "manifest", "a manifest is written whole, so something outside depthlens changed it: "
                     f"restore it from a copy of the store (`depthlens check {path}` lists what is there)")  # fmt: skip


def has_records(out: Path) -> bool:
    """Whether the store directory ``out`` holds anything but its lock file."""
    return out.is_dir() and any(p.name != LOCK for p in out.iterdir())


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
    return resume_check(
        out, manifest_file(out), has_records(out), manifest, resume, overwrite, rules, _UNCOMPARED
    )


def _float16(manifest: dict[str, Any]) -> bool:
    """Whether the store ``manifest`` describes keeps its per-token floats as float16."""
    return bool(manifest.get("store", {}).get("float16"))


def _kill_point(out: Path, name: str, count: int) -> None:
    """Fault injection (tests): die with the ``count``-th shard half-written, as a kill -9 would leave it."""
    if count == int(os.environ.get(KILL_AFTER, "-1")):
        layout.staged(out, name).write_bytes(b"PAR1")
        os.kill(os.getpid(), signal.SIGKILL)


def rewrite_store(
    path: Path, manifest: dict[str, Any], change: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    """Pass every record of the store ``path`` through ``change`` and commit the result with ``manifest``.

    The new shards are written under new names; one manifest rename commits them all (readers switch at once);
    the old shards are then renamed to hidden names, kept for readers that started before (removed by the next
    write). A crash before the commit leaves the old store whole.
    """
    with store_lock(path):
        stored = store_manifest(path)
        shards = recover(path, stored, _settings(stored), strict=True).kept
        number, run_id = layout.next_number(path, stored), stored.get("run_id") or new_run_id()
        meta = _meta(_settings(manifest), [], run_id)
        new: list[dict[str, Any]] = []
        try:
            for i, shard in enumerate(shards):
                file = layout.locate(path, shard)
                assert file is not None  # recover() keeps present shards only
                table = read_shard(file, _settings(stored))
                records = [change(r) for r in table_records(table)]
                name = layout.shard_name(number + i)
                _kill_point(path, name, i)
                meta[layout.FREE_KEY] = json.dumps(layout.shard_settings(table)[1]).encode()
                new.append(write_staged(path, name, to_table(records, float16=_float16(manifest)), meta))
            committed = {**manifest, "layout": 2, "run_id": run_id, "next_shard": number + len(shards),
                         "shards": new}  # fmt: skip
            publish(path, committed, new, replaced=shards)
        except BaseException:
            if (
                json.loads(manifest_file(path).read_bytes()).get("shards") != new
            ):  # not committed: leave nothing
                for shard in new:
                    layout.staged(path, shard["file"]).unlink(missing_ok=True)
            raise


def _meta(settings: dict[str, Any], free: Collection[str], run_id: str) -> dict[bytes, bytes]:
    return {layout.SETTINGS_KEY: json.dumps(settings).encode(), layout.FREE_KEY: json.dumps(sorted(free)).encode(),
            layout.RUN_KEY: run_id.encode()}  # fmt: skip


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
        (``rescored`` lists them). Holds the store's write lock until ``close``.

        Buffered records are committed as a shard every ``shard_rows`` records, at ``flush``, and (with
        ``commit_s``) once a record is written ``commit_s`` seconds or more after the last commit.
        """
        self.out, self.shard_rows, self.commit_s = out, shard_rows, commit_s
        self.done: set[str] = set()
        self.rescored: list[str] = []
        self.recomputed: list[
            str
        ] = []  # shards lost or cut since the last run: their records are computed again
        self.changed: list[str] = []  # the ``free`` / ``extend`` settings this resumed run changed
        self._buffer: list[dict[str, Any]] = []
        self._last_commit = time.monotonic()
        self._written = 0
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(store_lock(out))
        try:
            self._open(manifest, resume, overwrite, rules, hashes)
        except BaseException:
            self._lock.close()
            raise

    def _open(self, manifest: dict[str, Any], resume: bool, overwrite: bool, rules: ResumeRules,
              hashes: dict[str, str] | None) -> None:  # fmt: skip
        out = self.out
        manifest = {**manifest, "input_hashes": hashes} if hashes is not None else dict(manifest)
        resuming = check_store(out, manifest, resume, overwrite, rules)
        self._free = rules.movable  # may differ between shards: not part of a shard's settings
        self.manifest: dict[str, Any] = {**manifest, "layout": 2, "shards": []}
        shards: list[dict[str, Any]] = []
        stored: dict[str, Any] = {}
        if resuming:
            stored = read_json(
                manifest_file(out), "manifest", "use --overwrite to start again, or a new --out"
            )
            self.changed = changed_settings(_settings(stored), manifest, rules, _UNCOMPARED)
            found = recover(out, stored, _settings(manifest))
            shards, self.recomputed = found.kept, found.dropped
            self.manifest["run_id"] = stored.get("run_id") or new_run_id()
            # kept from the stored manifest: the model's depth, and the store's regrade log (studies.regrade)
            for key in ("n_layers", "regraded"):
                if stored.get(key) is not None:
                    self.manifest.setdefault(key, stored[key])
        else:
            self.manifest["run_id"] = new_run_id()
        self._next = layout.next_number(out, stored)
        if not resuming:
            replace_store_files(out)
        out.mkdir(parents=True, exist_ok=True)
        self.manifest["next_shard"] = self._next
        publish(out, {**self.manifest, "shards": shards}, [], replaced=[])
        self.manifest["shards"] = shards
        for shard in list(shards):
            self.done.update(self._ids(shard, stored.get("input_hashes"), hashes))

    def _ids(self, shard: dict[str, Any], stored: object, hashes: dict[str, str] | None) -> list[str]:
        """The ids of a committed shard; those whose input changed are cut out of it (a new shard replaces it)."""
        ids = list(shard.get("ids") or [])
        if not (isinstance(stored, dict) and hashes is not None):
            return ids
        stale = {i for i in ids if i in stored and i in hashes and stored[i] != hashes[i]}
        if stale:
            path = layout.locate(self.out, shard)
            assert path is not None
            table = read_shard(path)
            kept = table.filter(pa.array([str(i) not in stale for i in table.column("id").to_pylist()]))
            self._commit(kept, replaced=[shard])
            self.rescored.extend(sorted(stale))
        return [i for i in ids if i not in stale]

    def _commit(self, table: pa.Table, replaced: list[dict[str, Any]]) -> None:
        name = layout.shard_name(self._next)
        self._next += 1
        _kill_point(self.out, name, self._written)
        shard = write_staged(self.out, name, table, _meta(_settings(self.manifest), self._free,
                                                          self.manifest["run_id"]))  # fmt: skip
        kept = [s for s in self.manifest["shards"] if s not in replaced]
        self.manifest["shards"] = [*kept, shard] if table.num_rows else kept
        self.manifest["next_shard"] = self._next
        publish(self.out, self.manifest, [shard] if table.num_rows else [], replaced)

    def write_table(self, table: pa.Table, n_layers: int | None = None) -> None:
        """Commit ``table`` as the next shard: written whole, listed in the manifest, then published."""
        if table.num_rows == 0:
            return
        if n_layers is not None:
            self.manifest["n_layers"] = n_layers
        self._commit(table, replaced=[])
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
        try:
            self.flush()
        finally:
            self._lock.close()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is None:
            self.close()
            return
        try:  # an error mid-run: keep what is whole, as the JSONL writer does
            with contextlib.suppress(Exception):
                self.flush()
        finally:
            self._lock.close()
