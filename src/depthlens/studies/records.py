"""Reading input records and writing result records: JSONL that survives a crash and resumes.

Input: one JSON object per line with an optional ``id`` and either ``prompt`` + ``completion`` (text),
``messages`` (chat, rendered with the model's template) + ``completion``, or ``prompt_ids`` + ``completion_ids``
(a sample store's lines, ``prompt_ids`` + ``token_ids``, are read as they are).
Output: one JSON object per finished record, appended and fsynced as it completes, plus ``<out>.manifest.json``
holding the configuration (written whole to a temporary name, then renamed); ``resume`` re-opens the file,
drops a torn last line and reports the finished ids. See docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import signal
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any, TextIO, cast

from depthlens.errors import InputError, StoreError

SAMPLES = (
    "samples.jsonl"  # a Think@n store's responses (studies.thinkn); named here so a CLI can check it early
)

_SHAPES = (
    ("prompt", "completion"),
    ("messages", "completion"),
    ("prompt_ids", "completion_ids"),
    ("prompt_ids", "token_ids"),  # a line of a sample store (`depthlens generate`), re-scored as it is
)
# Fault injection for the tests (tests/test_faults.py): after this many records the process SIGKILLs itself
# halfway through writing the next one, leaving the torn line a real kill -9 or power cut would.
_KILL_AFTER = "DEPTHLENS_FAULT_KILL_AFTER"


@dataclasses.dataclass(frozen=True)
class InputRecord:
    id: str
    line: int  # 1-based line in the input file (0 for records passed from Python)
    data: dict[str, Any]

    @property
    def digest(self) -> str:
        """A hash of the record's content: a resumed run rescoring changed records compares it."""
        text = json.dumps(self.data, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class BadLine:
    line: int
    reason: str


def _check_messages(msgs: object, where: str) -> None:
    if not isinstance(msgs, list) or not msgs:
        raise InputError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise InputError(
                f"{where}: messages[{i}] must be an object with a string 'role' and a string 'content' "
                "(content given as a list of parts is not supported; join the text parts)"
            )


def check_record(data: object, where: str) -> None:
    """Raise InputError unless ``data`` has one of the accepted shapes with the right types."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(data).__name__}")
    shape = next((s for s in _SHAPES if all(k in data for k in s)), None)
    if shape is None:
        raise InputError(
            f"{where}: needs 'prompt' + 'completion', 'messages' + 'completion', or 'prompt_ids' + "
            f"'completion_ids'; found keys {sorted(data)}"
        )
    if shape[0] == "prompt_ids":
        for key in shape:
            ids = data[key]
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
            ):
                raise InputError(f"{where}: '{key}' must be a list of non-negative integers")
    elif shape[0] == "messages":
        _check_messages(data["messages"], where)
    if shape[0] != "prompt_ids":
        for key in (k for k in shape if k != "messages"):
            if not isinstance(data[key], str):
                raise InputError(f"{where}: '{key}' must be a string, got {type(data[key]).__name__}")


def read_records(path: Path, skip_bad: bool = False) -> tuple[list[InputRecord], list[BadLine]]:
    """Parse and check every line of ``path``; malformed lines raise, or are collected with ``skip_bad``."""
    if not path.is_file():
        raise InputError(f"input file {str(path)!r} does not exist")
    collected = RecordCollector(skip_bad)
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            collected.add(
                number, f"{path}:{number}", lambda raw=raw, number=number: _parse_line(raw, path, number)
            )
    return collected.records, collected.bad


def _parse_line(raw: bytes, path: Path, number: int) -> object | None:
    """One JSONL input line as JSON (None for a blank line)."""
    where = f"{path}:{number}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: not UTF-8 text (byte {exc.start + 1})") from None
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply") from None


class RecordCollector:
    """Input records checked one by one (shape, types, a unique id); a bad one raises, or with ``skip_bad`` is
    listed in ``bad``. ``unit`` names what a number counts: JSONL lines, Parquet rows."""

    def __init__(self, skip_bad: bool, unit: str = "line") -> None:
        self.skip_bad, self.unit = skip_bad, unit
        self.records: list[InputRecord] = []
        self.bad: list[BadLine] = []
        self._seen: dict[str, int] = {}

    def add(self, number: int, where: str, parse: Callable[[], object | None]) -> None:
        """Check the record ``parse`` returns (None: nothing there, e.g. a blank line) as record ``number``."""
        try:
            data = parse()
            if data is None:
                return
            check_record(data, where)
            data = cast(dict[str, Any], data)  # check_record refuses anything else
            record_id = str(data.get("id", f"line-{number}"))
            if record_id in self._seen:
                raise InputError(
                    f"{where}: id {record_id!r} already used on {self.unit} {self._seen[record_id]}"
                )
        except InputError as exc:
            if not self.skip_bad:
                raise InputError(f"{exc} (pass --skip-bad to skip such {self.unit}s)") from None
            self.bad.append(BadLine(number, str(exc)))
            return
        self._seen[record_id] = number
        self.records.append(InputRecord(record_id, number, data))


def manifest_path(out: Path) -> Path:
    return out.with_name(out.name + ".manifest.json")


def read_json(path: Path, what: str, fix: str) -> dict[str, Any]:
    """A whole JSON object from ``path`` (a manifest, a summary); a cut or foreign file raises StoreError."""
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        detail = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "not text"
        raise StoreError(f"{path}: the {what} is cut or is not JSON ({detail}); {fix}") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path}: the {what} is not a JSON object; {fix}")
    return data


def write_json(path: Path, data: object) -> None:
    """Write ``data`` whole or not at all: to a temporary name, fsynced, then renamed over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(path, exc) from exc


def write_error(path: Path, exc: OSError) -> StoreError:
    """An OSError while writing ``path`` as a one-line error (a full disk above all)."""
    if exc.errno == errno.ENOSPC:
        return StoreError(
            f"{path}: the disk is full; what finished before is kept — free some space, then rerun the command "
            "with --resume"
        )
    return StoreError(f"{path}: could not write ({exc.strerror or exc}); check the path and its permissions")


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a results file or store; a cut or foreign line raises StoreError naming it."""
    fix = "rerun the command that wrote it with --resume (it drops a torn last line), or delete that line"
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            if not raw.endswith(b"\n"):
                raise StoreError(f"{where}: the last line is cut short (an interrupted write); {fix}")
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                raise StoreError(f"{where}: not a JSON record (a line cut or edited); {fix}") from None
            if not isinstance(record, dict):
                raise StoreError(f"{where}: not a JSON object; {fix}")
            yield record


def _finished(out: Path) -> list[str]:
    """Ids already written to ``out`` in order; a torn last line (a crash mid-write) is cut off."""
    done: list[str] = []
    good_bytes = 0
    with out.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                done.append(str(json.loads(raw)["id"]))
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
                break
            good_bytes += len(raw)
    if good_bytes != out.stat().st_size:
        with out.open("r+b") as f:
            f.truncate(good_bytes)
    return done


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        flat: dict[str, object] = {}
        for k, v in value.items():
            flat.update(_flatten(v, f"{prefix}{k}."))
        return flat or {prefix[:-1]: {}}
    return {prefix[:-1]: value}


def settings_differ(previous: dict[str, Any], current: dict[str, Any], ignore: Collection[str]) -> list[str]:
    """``key: stored X, now Y`` for each setting (dotted, nested) that differs, ``ignore``d keys left out."""
    old, new = _flatten(previous), _flatten(current)
    lines = []
    for key in sorted(set(old) | set(new)):
        if key in ignore or key.split(".")[0] in ignore:
            continue
        if old.get(key, "(absent)") != new.get(key, "(absent)"):
            lines.append(f"{key}: stored {old.get(key, '(absent)')!r}, this run {new.get(key, '(absent)')!r}")
    return lines


def _stale(stored: object, hashes: dict[str, str] | None, finished: list[str]) -> set[str]:
    """Finished ids whose input record changed since they were written (unknown without stored hashes)."""
    if not isinstance(stored, dict) or hashes is None:
        return set()
    return {i for i in finished if i in stored and i in hashes and stored[i] != hashes[i]}


def _drop(out: Path, ids: set[str]) -> None:
    """Rewrite ``out`` without the records ``ids`` (to a temporary name, then renamed: never half-done)."""
    tmp = out.with_name(out.name + ".tmp")
    with out.open("rb") as src, tmp.open("wb") as dst:
        for raw in src:
            if str(json.loads(raw)["id"]) not in ids:
                dst.write(raw)
        dst.flush()
        os.fsync(dst.fileno())
    tmp.replace(out)


def _reopen_truncated(out: Path, size: int, handle: TextIO) -> TextIO:
    with contextlib.suppress(OSError):  # the failed write's buffer cannot be flushed either
        handle.close()
    with out.open("r+b") as f:
        f.truncate(size)
    return out.open("a", encoding="utf-8")


def _comparable(
    stored: dict[str, Any],
    manifest: dict[str, Any],
    defaults: dict[str, dict[str, Any]] | None,
    extend: Collection[str],
) -> dict[str, Any]:
    """The stored settings as this run would have written them: newer fields at their ``defaults``, ``extend``ed
    lists grown to this run's when the stored one is a prefix, keys this run leaves out (e.g. ``n_layers`` before
    the model is loaded) dropped."""
    previous = {k: v for k, v in stored.items() if k in manifest}
    for key, values in (defaults or {}).items():
        # a field, or a whole entry (e.g. ``engine``), that did not exist when the store was written
        if key in manifest and isinstance(previous.get(key, {}), dict):
            previous[key] = {**values, **previous.get(key, {})}
    for key in extend:
        old, new = previous.get(key), manifest.get(key)
        if isinstance(old, list) and isinstance(new, list) and new[: len(old)] == old:
            previous[key] = new
    return previous


_UNCOMPARED = {"command", "started", "input_hashes"}


def check_output(
    out: Path,
    manifest: dict[str, Any] | None,
    resume: bool,
    overwrite: bool = False,
    defaults: dict[str, dict[str, Any]] | None = None,
    free: Collection[str] = (),
    extend: Collection[str] = (),
) -> bool:
    """Whether writing to ``out`` resumes it; raise StoreError when it may not be written at all.

    Needs no model, so commands call it before loading one. ``manifest`` holds this run's settings (only its keys
    are compared: the model's layer count can be left out before loading; None skips the comparison); ``free``,
    ``extend`` and ``defaults`` as in ``ResultWriter``. A refusal names every setting that differs.
    """
    exists = out.exists() and out.stat().st_size > 0
    return resume_check(out, manifest_path(out), exists, manifest, resume, overwrite, defaults,
                        {*_UNCOMPARED, *free}, extend)  # fmt: skip


def resume_check(
    out: Path,
    meta: Path,
    exists: bool,
    manifest: dict[str, Any] | None,
    resume: bool,
    overwrite: bool,
    defaults: dict[str, dict[str, Any]] | None,
    ignore: Collection[str],
    extend: Collection[str],
) -> bool:
    """``check_output`` for a store of any format: ``out`` with its manifest ``meta``, ``exists`` when it holds
    records; the settings in ``ignore`` are not compared."""
    if exists and resume:
        if not meta.exists():
            raise StoreError(f"{out} has no manifest ({meta.name}); it was not written by depthlens")
        if manifest is not None:
            stored = read_json(meta, "manifest", "use --overwrite to start again, or a new --out")
            previous = _comparable(stored, manifest, defaults, extend)
            mismatch = settings_differ(previous, manifest, ignore)
            if mismatch:
                raise StoreError(
                    f"cannot resume {out}: "
                    + "; ".join(mismatch)
                    + " — use the stored settings, or a new --out"
                )
        return True
    if exists and not overwrite:
        raise StoreError(f"{out} already exists; pass --resume to continue it or --overwrite to replace it")
    return False


class ResultWriter:
    """Appends one JSON line per finished record and fsyncs it, so an interrupted run keeps its work."""

    def __init__(
        self,
        out: Path,
        manifest: dict[str, Any],
        resume: bool,
        overwrite: bool = False,
        defaults: dict[str, dict[str, Any]] | None = None,
        free: Collection[str] = (),
        extend: Collection[str] = (),
        hashes: dict[str, str] | None = None,
    ) -> None:
        """Open ``out`` for a new run, or (``resume``) for continuing one written with the same settings.

        Args:
            out: the JSONL file.
            manifest: this run's settings; a resumed run must match the stored ones except in ``free`` keys.
            resume: continue an existing ``out``.
            overwrite: replace an existing ``out``.
            defaults: per settings entry of the manifest (e.g. ``readout``), the values a field had before it
                existed — so a run written by an older depthlens, whose manifest lacks a newer field, still
                resumes when this run leaves that field at its default.
            free: top-level manifest keys that may differ on resume (they do not change a record's result);
                the manifest takes this run's values.
            extend: list-valued keys that may grow on resume (the stored list must be a prefix of this run's).
            hashes: a content hash per input record id; on resume, records whose input changed since they were
                written are dropped from ``out`` (``rescored`` lists them) so this run writes them afresh.
        """
        self.out = out
        self.done: set[str] = set()
        self.rescored: list[str] = []
        self.changed: list[str] = []  # the ``free`` / ``extend`` settings this resumed run changed
        self._written = 0
        meta = manifest_path(out)
        if hashes is not None:
            manifest = {**manifest, "input_hashes": hashes}
        if check_output(out, manifest, resume, overwrite, defaults, free, extend):
            stored = read_json(meta, "manifest", "use --overwrite to start again, or a new --out")
            movable = {*free, *extend}
            self.changed = [
                line
                for line in settings_differ(stored, manifest, _UNCOMPARED)
                if line.split(":")[0] in movable or line.split(".")[0] in movable
            ]
            finished = _finished(out)
            stale = _stale(stored.get("input_hashes"), hashes, finished)
            if stale:
                _drop(out, stale)
                self.rescored = sorted(stale)
            self.done = set(finished) - stale
            if "regraded" in stored:  # the store's regrade log (studies.regrade) outlives a resumed run
                manifest = {**manifest, "regraded": stored["regraded"]}
            resuming = True
        else:
            resuming = False
        out.parent.mkdir(parents=True, exist_ok=True)
        if not resuming:
            try:
                out.write_text("")
            except OSError as exc:
                raise write_error(out, exc) from exc
        write_json(meta, manifest)
        self._file: TextIO = out.open("a", encoding="utf-8")
        self._kill_after = int(os.environ.get(_KILL_AFTER, "-1"))

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
        self._written += 1

    def flush(self) -> None:
        """Nothing to do: every record is on disk once ``write`` returns (``ShardWriter`` commits here)."""

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a failed flush already raised from write(), the file cut back
            self._file.close()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
