"""On-demand reads of a JSONL results file for ``depthlens view`` (``stores.access`` reads a Parquet store; both
sources answer the same calls: ``scan``, ``read``, ``read_rows``).

The file is read once at open for each whole line's byte offset and its light fields (scalars, the heavy ones
aside); a record is then one seek and one line. The bytes read at open are the snapshot: lines a writer appends
later are not shown, and a file renamed over it (a regrade, a resume dropping lines) is refused on the next read.
A torn or foreign line becomes a notice naming it, and the rest is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.stores.access import HEAVY_SCALARS, Location
from depthlens.stores.names import current_names


def json_row(record: dict[str, Any], columns: Sequence[str] | None) -> dict[str, Any]:
    """A JSONL record's chosen columns, numeric lists as numpy arrays as ``arrow_row`` gives them."""
    row: dict[str, Any] = {}
    for name, value in record.items():
        if columns is not None and name not in columns:
            continue
        if isinstance(value, list) and value and isinstance(value[0], list) and value[0]:
            if all(isinstance(v, int | float) for v in value[0]):
                value = np.asarray(value, dtype=np.float64)
        elif isinstance(value, list) and value and all(isinstance(v, int | float) for v in value[:64]):
            value = np.asarray(value)
        row[name] = value
    return row


class JsonlSource:
    """A JSONL results file, one line per record: read once for offsets and light fields, then line by line."""

    def __init__(self, path: Path, notices: list[str]) -> None:
        self.path, self.notices = path, notices
        self.names = [path.name]
        self.end = 0  # the snapshot: the bytes read at open (a writer appends after them)
        self._inode: int | None = None  # a rewrite (regrade, resume dropping lines) renames a new file in
        self._size = 0
        self._lines_at: dict[int, int] = {}  # a record's byte offset → its line number, as readers name it

    def scan(self, columns: Sequence[str] | None = None) -> Iterator[tuple[Location, dict[str, Any]]]:
        """Each whole, readable line's light fields; a torn or foreign line becomes a notice."""
        for offset, record in self._lines():
            light = {
                k: v for k, v in record.items() if not isinstance(v, list | dict) and k not in HEAVY_SCALARS
            }
            if columns is not None:
                light = {k: v for k, v in light.items() if k in columns}
            yield Location(0, offset), light

    def records(self) -> Iterator[tuple[Location, dict[str, Any]]]:
        """Every readable record whole, one at a time (a pass over the store)."""
        for offset, record in self._lines():
            yield Location(0, offset), record

    def _lines(self) -> Iterator[tuple[int, dict[str, Any]]]:
        offset = 0
        with self.path.open("rb") as f:
            opened = os.fstat(f.fileno())
            self._inode, self._size = opened.st_ino, opened.st_size
            for number, raw in enumerate(f, start=1):
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                where = f"{self.path}:{number}"
                if raw.endswith(b"\n"):
                    self.end = offset
                else:
                    self._note(
                        f"{where}: the last line is cut short (a run still writing, or interrupted); not shown"
                    )
                    break
                try:
                    record = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                    record = None
                if not isinstance(record, dict):
                    self._note(f"{where}: not a JSON record (a line cut or edited); not shown")
                    continue
                self._lines_at[start] = number
                yield start, current_names(record)

    def where(self, location: Location) -> str:
        """A record's place as every reader names it: ``FILE:LINE``."""
        return f"{self.path}:{self._lines_at[location.row]}"

    def changed(self, stat: os.stat_result) -> bool:
        """Whether the file (``stat``: as it is now) is no longer the one read at open: replaced, or grown."""
        return self._inode is not None and (stat.st_ino != self._inode or stat.st_size != self._size)

    def _note(self, line: str) -> None:
        if line not in self.notices:
            self.notices.append(line)

    def read(self, location: Location, columns: Sequence[str] | None = None) -> dict[str, Any]:
        return self.read_rows([location], columns)[0]

    def read_rows(
        self, locations: Sequence[Location], columns: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        out = []
        with self.path.open("rb") as f:
            if self._inode is not None and os.fstat(f.fileno()).st_ino != self._inode:
                raise LookupError(
                    f"{self.path}: rewritten since the page opened (a regrade or a resumed run); "
                    "restart `depthlens view` to see its new state"
                )
            for location in locations:
                f.seek(location.row)
                out.append(json_row(current_names(json.loads(f.readline())), columns))
        return out
