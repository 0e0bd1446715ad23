"""JSONL results stores: one JSON object per finished record, appended and fsynced as it completes, plus
``<out>.manifest.json`` holding the configuration (written whole to a temporary name, then renamed); ``resume``
re-opens the file, drops a torn last line and reports the finished ids. See docs/reliability.md."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from depthlens.errors import StoreError, named
from depthlens.stores.commits import COMMITTED, Running
from depthlens.stores.files import (
    ResumeRules,
    changed_settings,
    manifest_path,
    read_json,
    resume_check,
    write_error,
    write_json,
)
from depthlens.stores.lock import store_lock
from depthlens.stores.meaning import Facts
from depthlens.stores.meaning import record_problem as meaning_problem
from depthlens.stores.validate import bounds, record_fault

# Fault injection for the tests (tests/test_faults.py): after this many records the process SIGKILLs itself
# halfway through writing the next one, leaving the torn line a real kill -9 or power cut would.
KILL_AFTER = "DEPTHLENS_FAULT_KILL_AFTER"
# ``precision`` describes the model as loaded (a name resumes whatever the device made of it), as n_layers does
_UNCOMPARED = {
    "command",
    "started",
    "input_hashes",
    "run_id",
    "precision",
    "derived_from",
    "skipped",
    COMMITTED,
}


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a results file or store; a cut or foreign line raises StoreError naming it."""
    for _, record in iter_jsonl_located(path):
        yield record


def iter_jsonl_located(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(``FILE:LINE``, record) for every record of ``path``, as ``iter_jsonl``."""
    fix = (
        "rerun the command that wrote it with --resume: it sets that line aside (in "
        f"{path.name}.damaged) and computes its record again"
    )
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            if not raw.endswith(b"\n"):
                raise StoreError(
                    f"{where}: the last line is cut short (an interrupted write); rerun the command that wrote it "
                    f"with {named('resume')}: it drops the cut line and computes that record again"
                )
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                raise StoreError(f"{where}: not a JSON record (a line cut or edited); {fix}") from None
            if not isinstance(record, dict):
                raise StoreError(f"{where}: not a JSON object; {fix}")
            yield where, record


def _rejects(manifest: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    """Whether a record of the store ``manifest`` describes holds a value out of its range, or values that
    disagree with each other or the store (``stores.meaning``): what every reader refuses."""
    ranges, facts = bounds(manifest), Facts.of(manifest)
    return lambda record: bool(record_fault(record, ranges) or meaning_problem(record, facts))


def _finished(out: Path, rejects: Callable[[dict[str, Any]], bool] | None = None) -> list[str]:
    """Ids already written to ``out`` in order. A torn last line (a crash mid-write) is cut off; a whole line that
    is not a record (edited or damaged outside depthlens), one every reader refuses (``rejects``), or repeats
    an id an earlier line holds is moved to ``<out>.damaged``, so its record is computed again (or, a repeat,
    counted once) and nothing else is touched."""
    done: list[str] = []
    seen: set[str] = set()
    good: list[bytes] = []
    bad: list[bytes] = []
    with out.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # torn: dropped
            try:
                record = json.loads(raw)
                rid = str(record["id"])
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, IndexError):
                if raw.strip():
                    bad.append(raw)
                continue
            if rid in seen or (rejects is not None and isinstance(record, dict) and rejects(record)):
                bad.append(raw)
                continue
            done.append(rid)
            seen.add(rid)
            good.append(raw)
    size = sum(len(r) for r in good)
    if bad:
        with out.with_name(out.name + ".damaged").open("ab") as f:
            f.writelines(bad)
        _rewrite(out, good)
    elif size != out.stat().st_size:
        with out.open("r+b") as f:
            f.truncate(size)
    return done


def _rewrite(out: Path, lines: list[bytes]) -> None:
    """Replace ``out`` with ``lines`` whole (a temporary name, fsynced, renamed)."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as dst:
            dst.writelines(lines)
            dst.flush()
            os.fsync(dst.fileno())
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)


def _stale(stored: object, hashes: dict[str, str] | None, finished: list[str]) -> set[str]:
    """Finished ids whose input record changed since they were written (unknown without stored hashes)."""
    if not isinstance(stored, dict) or hashes is None:
        return set()
    return {i for i in finished if i in stored and i in hashes and stored[i] != hashes[i]}


def _drop(out: Path, ids: set[str]) -> None:
    """Rewrite ``out`` without the records ``ids`` (to a temporary name, then renamed: never half-done)."""
    with out.open("rb") as src:
        _rewrite(out, [raw for raw in src if str(json.loads(raw)["id"]) not in ids])


def reorder(out: Path, order: list[str]) -> None:
    """Rewrite ``out`` with its records in the order of the ids ``order`` (ids not in it last, as they were):
    a resumed ``score`` puts re-scored records back where their input has them."""
    rank = {rid: k for k, rid in enumerate(order)}
    with out.open("rb") as src:
        lines = src.readlines()
    _rewrite(out, sorted(lines, key=lambda raw: rank.get(str(json.loads(raw)["id"]), len(rank))))


def _reopen_truncated(out: Path, size: int, handle: TextIO) -> TextIO:
    with contextlib.suppress(OSError):  # the failed write's buffer cannot be flushed either
        handle.close()
    with out.open("r+b") as f:
        f.truncate(size)
    return out.open("a", encoding="utf-8")


def check_output(
    out: Path,
    manifest: dict[str, Any] | None,
    resume: bool,
    overwrite: bool = False,
    rules: ResumeRules = ResumeRules(),
) -> bool:
    """Whether writing the JSONL store ``out`` resumes it (``files.resume_check``); needs no model, so commands
    call it before loading one."""
    exists = out.exists() and out.stat().st_size > 0
    return resume_check(out, manifest_path(out), exists, manifest, resume, overwrite, rules, _UNCOMPARED)


class ResultWriter:
    """Appends one JSON line per finished record and fsyncs it, so an interrupted run keeps its work."""

    def __init__(
        self,
        out: Path,
        manifest: dict[str, Any],
        resume: bool,
        overwrite: bool = False,
        rules: ResumeRules = ResumeRules(),
        hashes: dict[str, str] | None = None,
    ) -> None:
        """Open ``out`` for a new run, or (``resume``) for continuing one written with the same settings.

        Args:
            out: the JSONL file.
            manifest: this run's settings; a resumed run must match the stored ones (see ``rules``).
            resume: continue an existing ``out``.
            overwrite: replace an existing ``out``.
            rules: which settings may differ or grow on resume, and older manifests' defaults.
            hashes: a content hash per input record id; on resume, records whose input changed since they were
                written are dropped from ``out`` (``rescored`` lists them) so this run writes them afresh.
        """
        self.out = out
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
        self.done: set[str] = set()
        self.rescored: list[str] = []
        self.changed: list[str] = []  # the ``free`` / ``extend`` settings this resumed run changed
        self._written = 0
        meta = manifest_path(out)
        if hashes is not None:
            manifest = {**manifest, "input_hashes": hashes}
        if check_output(out, manifest, resume, overwrite, rules):
            stored = read_json(meta, "manifest", "use --overwrite to start again, or a new --out")
            self.changed = changed_settings(stored, manifest, rules, _UNCOMPARED)
            finished = _finished(out, _rejects(stored))
            stale = _stale(stored.get("input_hashes"), hashes, finished)
            if stale:
                _drop(out, stale)
                self.rescored = sorted(stale)
            self.done = set(finished) - stale
            for key in (
                "regraded",
                "derived_from",
            ):  # the regrade log, a copy's source: outlive a resumed run
                if key in stored:
                    manifest = {**manifest, key: stored[key]}
            manifest = {**manifest, "run_id": stored.get("run_id") or uuid.uuid4().hex[:16]}
            resuming = True
        else:
            manifest = {**manifest, "run_id": uuid.uuid4().hex[:16]}
            resuming = False
        out.parent.mkdir(parents=True, exist_ok=True)
        if not resuming:
            try:
                out.write_text("")
            except OSError as exc:
                raise write_error(out, exc) from exc
        self._commit = Running.of(out)  # what the file holds now, the lines a resume keeps
        self._manifest = {k: v for k, v in manifest.items() if k != COMMITTED}
        self._commit_manifest()
        self._file: TextIO = out.open("a", encoding="utf-8")
        self._kill_after = int(os.environ.get(KILL_AFTER, "-1"))

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        if self._written == self._kill_after:
            self._file.write(line[: len(line) // 2])
            self._file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        size = os.fstat(self._file.fileno()).st_size
        try:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            # Leave no torn record behind: cut the file back to its last whole line.
            self._file = _reopen_truncated(self.out, size, self._file)
            raise write_error(self.out, exc) from exc
        self._commit.add(line.encode("utf-8"))
        self._written += 1

    def _commit_manifest(self) -> None:
        write_json(manifest_path(self.out), {**self._manifest, COMMITTED: self._commit.entry()})

    def note(self, key: str, value: Any) -> None:
        """Commit ``key`` in the manifest now (a fact of the run, not a setting: ``_UNCOMPARED``)."""
        self._manifest[key] = value
        self._commit_manifest()

    def flush(self) -> None:
        """Commit the records written so far in the manifest (``stores.commits``): each is on disk once
        ``write`` returns; the manifest's count and digest follow them here (a batch), as ``ShardWriter`` commits."""
        self._commit_manifest()

    def close(self) -> None:
        try:
            with contextlib.suppress(
                OSError
            ):  # a failed flush already raised from write(), the file cut back
                self._file.close()
            # the file as it is now (``reorder`` may have rewritten it since the last write)
            self._commit = Running.of(self.out)
            with contextlib.suppress(StoreError, OSError):  # a full disk: the last commit stands (a prefix)
                self._commit_manifest()
        finally:
            self._lock.close()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
