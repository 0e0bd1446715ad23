"""On-demand reads of a results store (for ``depthlens view``): a few columns of every record, or the columns of
one record.

The explorer never reads a store whole. A sharded Parquet store's committed shards are opened once for their
footers (row counts, row groups, columns); the *light* columns every listing needs (scalars: ids, answers,
grades, lengths, scores) are read for all rows at open, and a record's per-token columns — the ``[T × L]``
divergences above all — only when it is asked for, from the one row group that holds it. A JSONL store is read
once at open for each line's byte offset and its light fields; a record is then one seek and one line.

Why ``pyarrow.parquet`` and not a query engine (DuckDB, or ``pyarrow.dataset`` filters): the explorer asks two
things of a store — a few small columns of every row, and all columns of one row whose shard and row it already
knows — and footers, column projection and one row-group read answer both directly. A filter on ``id`` would
scan the id column of every shard per request; DuckDB would add a dependency for the same reads.

Damage does not stop the reading: a shard the manifest lists but that is missing or unreadable, a shard it does
not list, a shard still being written (``*.tmp``), a torn or foreign JSONL line — each becomes a notice naming
the file, and the rest is read. Nothing here writes.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from depthlens.stores.parquet import _SETTINGS_KEY

HEAVY_SCALARS = ("text",)  # a scalar column too large to hold for every row (a response's whole text)


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a record is: the shard (index into the source's parts; 0 for JSONL) and its row or byte offset."""

    part: int
    row: int


@dataclasses.dataclass(frozen=True)
class ShardArrays:
    """Some columns of a shard's rows as numpy: scalars as lists; per-token lists as (lengths [rows], values
    [their total] or, for ``[T × L]`` rows, [their total, L]) — a pass over a store without a Python float per
    value."""

    rows: int
    scalars: dict[str, list[Any]]
    lists: dict[str, tuple[np.ndarray, np.ndarray]]

    def row_values(self, name: str) -> list[np.ndarray]:
        """Column ``name``'s per-row arrays (views into one buffer)."""
        lengths, values = self.lists[name]
        ends = np.cumsum(lengths)
        return [values[end - length : end] for length, end in zip(lengths, ends, strict=True)]


def _arrays(table: pa.Table) -> ShardArrays:
    scalars, lists = {}, {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        array = column.combine_chunks()
        if not pa.types.is_list(array.type):
            scalars[name] = array.to_pylist()
            continue
        lengths = array.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
        inner = array.flatten()
        if pa.types.is_fixed_size_list(inner.type):
            width = inner.type.list_size
            values = np.array(inner.flatten().to_numpy(zero_copy_only=False)).reshape(-1, width)  # writable
        else:
            values = np.array(inner.to_numpy(zero_copy_only=False))
        lists[name] = (lengths, values)
    return ShardArrays(table.num_rows, scalars, lists)


def release_unused() -> None:
    """Hand Arrow's freed buffers back to the system (after a pass over a whole store)."""
    pa.default_memory_pool().release_unused()


def _is_light(field: pa.Field) -> bool:
    kind = field.type
    nested = pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_struct(kind)
    return not nested and field.name not in HEAVY_SCALARS


def arrow_row(table: pa.Table) -> dict[str, Any]:
    """The one row of ``table`` as Python values, per-token lists as numpy arrays (``[T × L]`` as 2-D), without
    turning every float into a Python object."""
    row: dict[str, Any] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        array = column.combine_chunks()
        kind = array.type
        if pa.types.is_list(kind) and array.null_count == 0:
            inner = array.flatten()
            if pa.types.is_fixed_size_list(inner.type):
                width = inner.type.list_size
                row[name] = inner.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
            elif pa.types.is_floating(inner.type) or pa.types.is_integer(inner.type):
                row[name] = inner.to_numpy(zero_copy_only=False)
            else:
                row[name] = array.to_pylist()[0]
        else:
            row[name] = array.to_pylist()[0]
    return row


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


class ParquetSource:
    """The committed shards of a Parquet store, read on demand."""

    def __init__(self, directory: Path, listed: Sequence[str] | None, notices: list[str]) -> None:
        """``listed``: the shards the manifest commits, in order (None: no readable manifest — the shards found
        on disk are read, in name order)."""
        self.directory, self.notices = directory, notices
        self.names: list[str] = []
        self._meta: list[pq.FileMetaData] = []
        self._schemas: list[pa.Schema] = []
        self._starts: list[list[int]] = []  # first row of each row group, per shard
        self._light: list[pa.Table | None] = []  # read with the footer, handed out once by ``scan``
        on_disk = sorted(p.name for p in directory.glob("part-*.parquet"))
        names = list(listed) if listed is not None else on_disk
        # a few shards at a time: Arrow reads without the GIL, and a store has hundreds of small footers
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="view-open") as pool:
            for name, opened in zip(names, pool.map(self._open, names), strict=True):
                if isinstance(opened, str):
                    notices.append(opened)
                    continue
                meta, light = opened
                self.names.append(name)
                self._meta.append(meta)
                self._schemas.append(meta.schema.to_arrow_schema())
                self._light.append(light)
                starts, first = [], 0
                for g in range(meta.num_row_groups):
                    starts.append(first)
                    first += meta.row_group(g).num_rows
                self._starts.append(starts)
        unlisted = sorted(set(on_disk) - set(names))
        if unlisted:
            notices.append(
                f"{directory / unlisted[0]}" + (f" and {len(unlisted) - 1} more" if len(unlisted) > 1 else "")
                + ": shard(s) the manifest does not list (left by an interrupted run, or copied in); not shown"
            )  # fmt: skip
        writing = sorted(p.name for p in directory.glob("part-*.parquet.tmp"))
        if writing:
            notices.append(
                f"{directory / writing[0]}: a shard still being written (or left by a killed run); shown is what "
                "was committed when the page opened"
            )

    def _open(self, name: str) -> tuple[pq.FileMetaData, pa.Table] | str:
        """A shard's footer and light columns, or the notice saying why it cannot be read."""
        path = self.directory / name
        if not path.is_file():
            return f"{path}: the manifest lists this shard but it is missing; its records are not shown"
        try:
            shard = pq.ParquetFile(path)
            light = [f.name for f in shard.schema_arrow if _is_light(f)]
            return shard.metadata, shard.read(columns=light, use_threads=False)
        except (OSError, pa.ArrowException) as exc:
            return f"{path}: not a readable Parquet shard ({exc}); its records are not shown"

    def _file(self, part: int) -> pq.ParquetFile:
        return pq.ParquetFile(self.directory / self.names[part], metadata=self._meta[part])

    def columns(self, part: int) -> list[pa.Field]:
        return list(self._schemas[part])

    def scan(self, columns: Sequence[str] | None = None) -> Iterator[tuple[Location, dict[str, Any]]]:
        """Every record's light columns (``columns``: those of them wanted; None = every light column)."""
        for part in range(len(self.names)):
            present = [f.name for f in self.columns(part) if _is_light(f)]
            wanted = present if columns is None else [c for c in columns if c in present]
            table, self._light[part] = self._light[part], None
            if table is None:
                table = self._read(part, lambda f, w=wanted: f.read(columns=w, use_threads=False))
            else:
                table = table.select(wanted)
            for row, record in enumerate(table.to_pylist() if table is not None else []):
                yield Location(part, row), record

    def arrays(self, columns: Sequence[str]) -> Iterator[tuple[int, ShardArrays]]:
        """Each readable shard's ``columns`` (those it has) as numpy, shard by shard: a pass over the store."""
        for part in range(len(self.names)):
            present = [c for c in columns if c in {f.name for f in self.columns(part)}]
            table = self._read(part, lambda f, p=present: f.read(columns=p, use_threads=False))
            if table is not None:
                yield part, _arrays(table)

    def settings(self) -> dict[str, Any]:
        """The settings the first readable shard was written with (every shard carries its store's, bar the
        shards' list and the model's depth): what is left where the manifest is damaged."""
        if not self._schemas:
            return {}
        try:
            settings = json.loads((self._schemas[0].metadata or {}).get(_SETTINGS_KEY, b"{}"))
        except ValueError:
            return {}
        return settings if isinstance(settings, dict) else {}

    def matrix_width(self, name: str = "divergence") -> int | None:
        """L of a ``[T × L]`` column (the model's depth, for the divergences), from the first shard that has it."""
        for schema in self._schemas:
            if name in schema.names:
                kind = schema.field(name).type
                if pa.types.is_list(kind) and pa.types.is_fixed_size_list(kind.value_type):
                    return int(kind.value_type.list_size)
        return None

    def read(self, location: Location, columns: Sequence[str] | None = None) -> dict[str, Any]:
        """One record: ``columns`` of it (None = all), from the row group that holds it."""
        return self.read_rows([location], columns)[0]

    def read_rows(
        self, locations: Sequence[Location], columns: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """Several records (a question's responses), each row group that holds one read once."""
        groups: dict[tuple[int, int], pa.Table | None] = {}
        out = []
        for location in locations:
            starts = self._starts[location.part]
            group = bisect.bisect_right(starts, location.row) - 1
            if (location.part, group) not in groups:
                names = {f.name for f in self.columns(location.part)}
                wanted = None if columns is None else [c for c in columns if c in names]
                groups[(location.part, group)] = self._read(
                    location.part,
                    lambda f, g=group, w=wanted: f.read_row_group(g, columns=w, use_threads=False),
                )
            table = groups[(location.part, group)]
            if table is None:
                raise KeyError(location)
            out.append(arrow_row(table.slice(location.row - starts[group], 1)))
        return out

    def _read(self, part: int, read: Callable[[pq.ParquetFile], pa.Table]) -> pa.Table | None:
        try:
            return read(self._file(part))
        except (OSError, pa.ArrowException) as exc:  # damaged after its footer was read
            note = f"{self.directory / self.names[part]}: unreadable ({exc}); its records are not shown"
            if note not in self.notices:
                self.notices.append(note)
            return None

    def rows(self) -> int:
        return sum(m.num_rows for m in self._meta)


class JsonlSource:
    """A JSONL results file, one line per record: read once for offsets and light fields, then line by line."""

    def __init__(self, path: Path, notices: list[str]) -> None:
        self.path, self.notices = path, notices
        self.names = [path.name]

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
            for number, raw in enumerate(f, start=1):
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                where = f"{self.path}:{number}"
                if not raw.endswith(b"\n"):
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
                yield start, record

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
            for location in locations:
                f.seek(location.row)
                out.append(json_row(json.loads(f.readline()), columns))
        return out
