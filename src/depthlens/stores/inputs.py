"""Input records: one JSON object per line (or a Parquet row) with an ``id`` and either ``prompt`` +
``completion`` (text), ``messages`` (chat, rendered with the model's template) + ``completion``, or
``prompt_ids`` + ``completion_ids`` (a sample store's lines, ``prompt_ids`` + ``token_ids``, are read as they are).
Every record is checked (shape, types, a unique id); a bad one raises naming its line, or is listed with
``skip_bad``."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from depthlens.errors import InputError, named
from depthlens.stores.records import unencodable

_SHAPES = (
    ("prompt", "completion"),
    ("messages", "completion"),
    ("prompt_ids", "completion_ids"),
    ("prompt_ids", "token_ids"),  # a line of a sample store (`depthlens generate`), re-scored as it is
)
# Fault injection for the tests (tests/test_faults.py): after this many records the process SIGKILLs itself


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
    if "prompt" in data and "messages" in data:  # which one was meant? never guessed
        raise InputError(f"{where}: has both 'prompt' and 'messages'; give one of them")
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
    field = unencodable(data)
    if field is not None:  # JSON can spell a lone surrogate (\ud800); no store or tokenizer can take it
        raise InputError(
            f"{where}: '{field}' holds a lone surrogate (text UTF-8 cannot encode, e.g. \\ud800); give the text "
            "whole (a surrogate pair, or the character itself)"
        )


def read_records(path: Path, skip_bad: bool = False) -> tuple[list[InputRecord], list[BadLine]]:
    """Parse and check every line of ``path``; malformed lines raise, or are collected with ``skip_bad``."""
    if not path.is_file():
        raise InputError(f"input file {str(path)!r} does not exist")
    collected = RecordCollector(skip_bad)
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            collected.add(number, f"{path}:{number}", functools.partial(_parse_line, raw, path, number))
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
            if "id" not in data:  # a name made up from the line would not survive an edit of the file
                raise InputError(
                    f'{where}: no \'id\'; give each record a unique id, e.g. "id": "{self.unit}-{number}"'
                )
            record_id = str(data["id"])
            if record_id in self._seen:
                raise InputError(
                    f"{where}: id {record_id!r} already used on {self.unit} {self._seen[record_id]}"
                )
        except InputError as exc:
            if not self.skip_bad:
                raise InputError(f"{exc} (pass {named('skip_bad')} to skip such {self.unit}s)") from None
            self.bad.append(BadLine(number, str(exc)))
            return
        self._seen[record_id] = number
        self.records.append(InputRecord(record_id, number, data))
