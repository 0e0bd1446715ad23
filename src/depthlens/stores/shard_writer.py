"""The writer of a sharded Parquet store (``stores.parquet``): ``ShardWriter`` commits result tables shard by shard,
resuming a store written with the same settings; ``rewrite_store`` passes every record of a store through a change
and commits the new shards with one manifest rename (a regrade).

How a shard is staged, committed and published is ``stores.layout`` and ``stores.recover``; which manifest keys are
a shard's settings, and how a shard is read back, is ``stores.parquet``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pyarrow as pa

from depthlens.errors import StoreError, named
from depthlens.stores import layout
from depthlens.stores.arrow import table_records, to_table
from depthlens.stores.files import ResumeRules, WriteFailed, changed_settings, read_json, resume_check
from depthlens.stores.jsonl import KILL_AFTER
from depthlens.stores.layout import manifest_file
from depthlens.stores.lock import LOCK, store_lock
from depthlens.stores.parquet import _UNCOMPARED, _settings, read_shard, settings_problem, store_manifest
from depthlens.stores.recover import publish, recover, replace_store_files, write_staged


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


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
        raise StoreError(f"{out} is a file; a Parquet store is a directory — give a new {named('out')}")
    try:
        return resume_check(
            out, manifest_file(out), has_records(out), manifest, resume, overwrite, rules, _UNCOMPARED
        )
    except StoreError:
        if resume:
            _manifest_at_fault(out)  # settings that differ because the manifest was edited: name it
        raise


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
    """Pass every record of the store ``path`` through ``change`` and commit the result with ``manifest`` (its
    ``run_id`` where it has one: a copy's own, else the store's).

    The new shards are written under new names; one manifest rename commits them all (readers switch at once);
    the old shards are then renamed to hidden names, kept for readers that started before (removed by the next
    write). A crash before the commit leaves the old store whole; a failed write (a full disk) says which of the
    two it left (``WriteFailed``).
    """
    with store_lock(path):
        stored = store_manifest(path)
        shards = recover(path, stored, _settings(stored), strict=True).kept
        number = layout.next_number(path, stored)
        run_id = manifest.get("run_id") or stored.get("run_id") or new_run_id()
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
            committed = {
                **manifest,
                "layout": 2,
                "run_id": run_id,
                "next_shard": number + len(shards),
                "shards": new,
            }
            publish(path, committed, new, replaced=shards)
        except BaseException as exc:
            done = _committed(path, new)
            if not done:  # not committed: leave nothing
                for shard in new:
                    layout.staged(path, shard["file"]).unlink(missing_ok=True)
            failed = exc if isinstance(exc, WriteFailed) else None
            if failed is None and isinstance(exc, OSError) and exc.errno is not None:
                failed = WriteFailed(Path(exc.filename or path), exc)
            if failed is None:
                raise
            raise failed.keeping(_rewrite_kept(path, done, failed)) from None


def _committed(path: Path, new: list[dict[str, Any]]) -> bool:
    """Whether the manifest of ``path`` commits the shards ``new`` (a rewrite got past its commit)."""
    try:
        return bool(new) and json.loads(manifest_file(path).read_bytes()).get("shards") == new
    except (OSError, ValueError, AttributeError):
        return False


def _rewrite_kept(path: Path, done: bool, failed: WriteFailed) -> str:
    if done:
        return (
            f"the rewrite of {path} is committed (its manifest lists the new shards, which readers find under "
            "their hidden names until the next write to the store gives them their own)"
        )
    return (
        f"the rewrite was not committed and its new shards were removed: {path} is as it was — {failed.remedy}, "
        "then run the command again"
    )


def _manifest_at_fault(out: Path) -> None:
    """Raise the manifest's own problem where its settings disagree with the shards its own run wrote (edited
    outside depthlens): a resume refused for "other settings" must not send the user to change the run's."""
    import pyarrow.parquet as pq

    try:
        stored = read_json(manifest_file(out), "manifest", "")
        shard = next(iter(layout.entries(out, stored)), None)
        path = layout.locate(out, shard) if shard is not None else None
        table = pq.read_schema(path).empty_table() if path is not None else None
    except (StoreError, OSError, pa.ArrowException):
        return
    problem = settings_problem(out, path, stored, table) if table is not None and path is not None else None
    if problem is not None and problem.kind == "manifest":
        raise layout.Refused(problem)


def _meta(settings: dict[str, Any], free: Collection[str], run_id: str) -> dict[bytes, bytes]:
    return {
        layout.SETTINGS_KEY: json.dumps(settings).encode(),
        layout.FREE_KEY: json.dumps(sorted(free)).encode(),
        layout.RUN_KEY: run_id.encode(),
    }


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

    def _open(
        self,
        manifest: dict[str, Any],
        resume: bool,
        overwrite: bool,
        rules: ResumeRules,
        hashes: dict[str, str] | None,
    ) -> None:
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
            # kept from the stored manifest: the model's depth, the store's regrade log (studies.regrade) and
            # where a copy came from
            for key in ("n_layers", "regraded", "derived_from"):
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
        shard = write_staged(
            self.out, name, table, _meta(_settings(self.manifest), self._free, self.manifest["run_id"])
        )
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

    def note(self, key: str, value: Any) -> None:
        """Commit ``key`` in the manifest now (a fact of the run, not a setting: ``_UNCOMPARED``), with the records
        buffered so far."""
        self.flush()
        self.manifest[key] = value
        publish(self.out, self.manifest, [], replaced=[])

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
