"""Reading input records and writing result records: JSONL that survives a crash and resumes.

Input: one JSON object per line with an optional ``id`` and either ``prompt`` + ``completion`` (text),
``messages`` (chat, rendered with the model's template) + ``completion``, or ``prompt_ids`` + ``completion_ids``.
Output: one JSON object per finished record, appended and flushed as it completes, plus ``<out>.manifest.json``
holding the configuration; ``resume`` re-opens the file, drops a torn last line and reports the finished ids.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from depthlens.errors import InputError, StoreError

SAMPLES = (
    "samples.jsonl"  # a Think@n store's responses (studies.thinkn); named here so a CLI can check it early
)

_SHAPES = (
    ("prompt", "completion"),
    ("messages", "completion"),
    ("prompt_ids", "completion_ids"),
)


@dataclasses.dataclass(frozen=True)
class InputRecord:
    id: str
    line: int  # 1-based line in the input file (0 for records passed from Python)
    data: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class BadLine:
    line: int
    reason: str


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
            if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
                raise InputError(f"{where}: '{key}' must be a list of non-negative integers")
    elif shape[0] == "messages":
        msgs = data["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m for m in msgs):
            raise InputError(f"{where}: 'messages' must be a list of {{'role', 'content'}} objects")
    if shape[0] != "prompt_ids":
        for key in (k for k in shape if k != "messages"):
            if not isinstance(data[key], str):
                raise InputError(f"{where}: '{key}' must be a string, got {type(data[key]).__name__}")


def read_records(path: Path, skip_bad: bool = False) -> tuple[list[InputRecord], list[BadLine]]:
    """Parse and check every line of ``path``; malformed lines raise, or are collected with ``skip_bad``."""
    if not path.is_file():
        raise InputError(f"input file {str(path)!r} does not exist")
    records: list[InputRecord] = []
    bad: list[BadLine] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            where = f"{path}:{number}"
            try:
                try:
                    data = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
                check_record(data, where)
                record_id = str(data.get("id", f"line-{number}"))
                if record_id in seen:
                    raise InputError(f"{where}: id {record_id!r} already used on line {seen[record_id]}")
            except InputError as exc:
                if not skip_bad:
                    raise InputError(f"{exc} (pass --skip-bad to skip such lines)") from None
                bad.append(BadLine(number, str(exc)))
                continue
            seen[record_id] = number
            records.append(InputRecord(record_id, number, data))
    return records, bad


def manifest_path(out: Path) -> Path:
    return out.with_name(out.name + ".manifest.json")


def _finished_ids(out: Path) -> set[str]:
    """Ids already written to ``out``; a torn last line (a crash mid-write) is cut off."""
    done: set[str] = set()
    good_bytes = 0
    with out.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                done.add(str(json.loads(raw)["id"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                break
            good_bytes += len(raw)
    if good_bytes != out.stat().st_size:
        with out.open("r+b") as f:
            f.truncate(good_bytes)
    return done


def check_output(
    out: Path,
    manifest: dict[str, Any] | None,
    resume: bool,
    overwrite: bool = False,
    defaults: dict[str, dict[str, Any]] | None = None,
) -> bool:
    """Whether writing to ``out`` resumes it; raise StoreError when it may not be written at all.

    Needs no model, so commands call it before loading one. ``manifest`` holds the settings to compare with the
    stored run's (only its keys are compared: the model's layer count can be left out before loading; None
    skips the comparison). ``defaults``: per settings entry of the manifest (e.g. ``readout``), the values a
    field had before it existed — so a run written by an older depthlens, whose manifest lacks a newer field,
    still resumes when this run leaves that field at its default.
    """
    meta = manifest_path(out)
    exists = out.exists() and out.stat().st_size > 0
    if exists and resume:
        if not meta.exists():
            raise StoreError(f"{out} has no manifest ({meta.name}); it was not written by depthlens")
        if manifest is not None:
            previous = json.loads(meta.read_text())
            for key, values in (defaults or {}).items():
                if isinstance(previous.get(key), dict):
                    previous[key] = {**values, **previous[key]}
            mismatch = [
                k for k in manifest if k not in ("command", "started") and previous.get(k) != manifest[k]
            ]
            if mismatch:
                raise StoreError(
                    f"cannot resume {out}: its {', '.join(mismatch)} differ from this run's; "
                    "use the same options, or a new --out"
                )
        return True
    if exists and not overwrite:
        raise StoreError(f"{out} already exists; pass --resume to continue it or --overwrite to replace it")
    return False


class ResultWriter:
    """Appends one JSON line per finished record and flushes it, so an interrupted run keeps its work."""

    def __init__(
        self,
        out: Path,
        manifest: dict[str, Any],
        resume: bool,
        overwrite: bool = False,
        defaults: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """``manifest`` is written beside ``out`` (or compared with the stored one), see ``check_output``."""
        self.out = out
        self.done: set[str] = set()
        resuming = check_output(out, manifest, resume, overwrite, defaults)
        if resuming:
            self.done = _finished_ids(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if not resuming:
            out.write_text("")
            manifest_path(out).write_text(json.dumps(manifest, indent=2) + "\n")
        self._file: TextIO = out.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a results file (for tests and later studies)."""
    with path.open(encoding="utf-8") as f:
        for text in f:
            if text.strip():
                yield json.loads(text)
