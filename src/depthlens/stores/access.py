"""On-demand reads of a results store (for ``depthlens view``): a few columns of every record, or the columns of
one record.

The explorer never reads a store whole. A sharded Parquet store's committed shards are opened once for their
footers (row counts, row groups, columns); the *light* columns every listing needs (scalars: ids, answers,
grades, lengths, scores) are read for all rows at open, and a record's per-token columns — the ``[T × L]``
divergences above all — only when it is asked for, from the one row group that holds it. A JSONL store is read
once at open for each line's byte offset and its light fields; a record is then one seek and one line
(``stores.jsonl_access``; this module holds what both sources share and the Parquet one).

Why ``pyarrow.parquet`` and not a query engine (DuckDB, or ``pyarrow.dataset`` filters): the explorer asks two
things of a store — a few small columns of every row, and all columns of one row whose shard and row it already
knows — and footers, column projection and one row-group read answer both directly. A filter on ``id`` would
scan the id column of every shard per request; DuckDB would add a dependency for the same reads.

Damage does not stop the reading: what the library's readers refuse (``stores.layout``'s checks of a listed shard,
a data file no commit lists), a shard being written, a torn or foreign JSONL line — each becomes a notice naming
the file, and the rest is read. One manifest is read: a snapshot. Nothing here writes or takes the lock.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from operator import methodcaller
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from depthlens.errors import StoreError
from depthlens.stores import layout, shard_checks
from depthlens.stores.arrow import not_utf8
from depthlens.stores.names import current_table, stored_columns
from depthlens.stores.parquet import settings_problem

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
            values = np.array(_dense(inner))  # writable
        else:
            values = np.array(inner.to_numpy(zero_copy_only=False))
        lists[name] = (lengths, values)
    return ShardArrays(table.num_rows, scalars, lists)


def _dense(rows: pa.Array) -> np.ndarray:
    """A fixed-size-list array (each token's ``[L]`` row, or ``[L][K]`` top-k) as one numeric numpy array of
    shape (tokens, L[, K]): every level flattened, so a ``[T × L × K]`` cell is numbers, not arrays of arrays."""
    shape = []
    while pa.types.is_fixed_size_list(rows.type):
        shape.append(rows.type.list_size)
        rows = rows.flatten()
    return rows.to_numpy(zero_copy_only=False).reshape(-1, *shape)


def release_unused() -> None:
    """Hand Arrow's freed buffers back to the system (after a pass over a whole store)."""
    pa.default_memory_pool().release_unused()


def _entries(directory: Path, manifest: dict[str, Any] | None, notices: list[str]) -> list[dict[str, Any]]:
    """The shard entries ``manifest`` commits, checked as the readers check them (``layout.entries``); where it is
    damaged, what of its list is still usable, else the data files on disk (visible ones, in name order)."""
    if manifest is not None:
        try:
            return layout.entries(directory, manifest)
        except StoreError as exc:
            notices.append(f"{exc} — shown: the shards it lists, each checked")
            shards = manifest.get("shards")
            if isinstance(shards, list) and all(
                isinstance(e, dict) and isinstance(e.get("file"), str) for e in shards
            ):
                return shards
    return [{"file": name} for name in layout.visible_files(directory)] if directory.is_dir() else []


def _is_light(field: pa.Field) -> bool:
    kind = field.type
    nested = pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_struct(kind)
    return not nested and field.name not in HEAVY_SCALARS


def arrow_row(table: pa.Table) -> dict[str, Any]:
    """The one row of ``table`` as Python values, per-token lists as numpy arrays (``[T × L]`` as 2-D, ``[T][L][K]``
    as 3-D), without turning every float into a Python object."""
    row: dict[str, Any] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        array = column.combine_chunks()
        kind = array.type
        if pa.types.is_list(kind) and array.null_count == 0:
            inner = array.flatten()
            if pa.types.is_fixed_size_list(inner.type):
                row[name] = _dense(inner)
            elif pa.types.is_floating(inner.type) or pa.types.is_integer(inner.type):
                row[name] = inner.to_numpy(zero_copy_only=False)
            else:
                row[name] = array.to_pylist()[0]
        else:
            row[name] = array.to_pylist()[0]
    return row


class ParquetSource:
    """The shards one manifest commits (a snapshot of the store), read on demand."""

    def __init__(self, directory: Path, manifest: dict[str, Any] | None, notices: list[str]) -> None:
        """``manifest``: the store's manifest as read once at open (None: none readable — the shards found on
        disk are read, in name order). Its shards are found where ``stores.layout`` says a committed shard is
        (its name, or its hidden name while it is published or after a regrade replaced it) and checked as the
        library's readers check them; what fails becomes a notice."""
        self.directory, self.notices = directory, notices
        self.names: list[str] = []
        self._entries: list[dict[str, Any]] = []
        self._paths: list[Path] = []  # where each shard was found at open
        self._meta: list[pq.FileMetaData] = []
        self._schemas: list[pa.Schema] = []
        self._starts: list[list[int]] = []  # first row of each row group, per shard
        self._light: list[pa.Table | None] = []  # read with the footer, handed out once by ``scan``
        self._notes: dict[int, str] = {}  # why a shard could not be read after open
        self._edited: str | None = None  # the manifest's settings disagree with its own run's shards
        shards = _entries(directory, manifest, notices)
        # a few shards at a time: Arrow reads without the GIL, and a store has hundreds of small footers
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="view-open") as pool:
            opened_all = pool.map(lambda e: self._open(manifest or {}, e), shards)
            for shard, opened in zip(shards, opened_all, strict=True):
                if isinstance(opened, str):
                    notices.append(opened)
                    continue
                path, meta, light = opened
                self.names.append(shard["file"])
                self._entries.append(shard)
                self._paths.append(path)
                self._meta.append(meta)
                self._schemas.append(meta.schema.to_arrow_schema())
                self._light.append(light)
                starts, first = [], 0
                for g in range(meta.num_row_groups):
                    starts.append(first)
                    first += meta.row_group(g).num_rows
                self._starts.append(starts)
        if self._edited is not None:
            notices.append(self._edited)
        self._note_others(manifest, [s["file"] for s in shards])

    def where(self, location: Location) -> str:
        """A record's place as every reader names it: ``SHARD row N``."""
        return f"{self.directory / self.names[location.part]} row {location.row + 1}"

    def _note_others(self, manifest: dict[str, Any] | None, listed: list[str]) -> None:
        """Files beside the committed shards: data files no commit lists, shards being written."""
        unlisted = (
            [p.path for p in shard_checks.unlisted(self.directory, listed, manifest)] if manifest else []
        )
        if unlisted:
            self.notices.append(
                f"{unlisted[0]}"
                + (f" and {len(unlisted) - 1} more" if len(unlisted) > 1 else "")
                + ": data file(s) the manifest does not list (left by an interrupted run, or copied in); not shown"
            )
        committed = {p.name for p in self._paths}
        writing = sorted(
            p.name for p in self.directory.glob(".part-*.parquet.tmp") if p.name not in committed
        )
        if writing:
            self.notices.append(
                f"{self.directory / writing[0]}: a shard being written (not committed when the page opened, or "
                "left by a killed run); shown is the store as committed then"
            )

    def _open(
        self, manifest: dict[str, Any], shard: dict[str, Any]
    ) -> tuple[Path, pq.FileMetaData, pa.Table] | str:
        """A shard's place, footer and light columns, or the notice saying why it cannot be read."""
        for _ in range(2):  # a writer publishing the shard (a rename) meanwhile: look for it again
            path, problem = shard_checks.shard_problem(self.directory, manifest, shard, verify=False)
            if problem is not None or path is None:
                break
            try:
                file = pq.ParquetFile(path, page_checksum_verification=True)
                light = [f.name for f in file.schema_arrow if _is_light(f)]
                table = file.read(columns=light, use_threads=False)
            except FileNotFoundError:
                continue
            except (OSError, pa.ArrowException) as exc:
                return f"{path}: not a readable Parquet shard ({exc}); its records are not shown"
            column = not_utf8(table)
            if column is not None:  # as every reader refuses it (``layout.read_table``)
                return (
                    f"{path}: not a readable Parquet shard (its {column!r} column holds bytes that are not UTF-8: "
                    "written outside depthlens); its records are not shown"
                )
            stamped = table.replace_schema_metadata(file.schema_arrow.metadata)
            problem = shard_checks.table_problem(self.directory, path, manifest, shard, stamped)
            if problem is None:
                edited = settings_problem(self.directory, path, manifest, stamped) if manifest else None
                if (
                    edited is not None and edited.kind == "manifest"
                ):  # the readers' notice; the shard is whole
                    self._edited = edited.message() + " — shown: what the shards hold"
                elif edited is not None:  # the shard is at fault (its footer changed, or another run's)
                    return f"{edited.message()}; its records are not shown"
                return path, file.metadata, table
            break
        where = (
            problem.message()
            if problem
            else f"{self.directory / shard['file']}: kept moving while it was read"
        )
        return f"{where}; its records are not shown"

    def _file(self, part: int) -> pq.ParquetFile:
        """The shard as the snapshot committed it. A commit since may have moved it (published from its hidden
        name, or set aside by a regrade: ``layout.locate`` finds it); once a later write removes a replaced
        shard, its records are gone from disk and the read fails naming why."""
        try:
            return pq.ParquetFile(
                self._paths[part], metadata=self._meta[part], page_checksum_verification=True
            )
        except FileNotFoundError:
            path = layout.locate(self.directory, self._entries[part])  # names are never reused: same bytes
            if path is None:
                raise FileNotFoundError(
                    f"{self.directory / self.names[part]}: gone since the page opened (the store was rewritten "
                    "since: restart `depthlens view` to see its new state)"
                ) from None
            self._paths[part] = path
            return pq.ParquetFile(path, metadata=self._meta[part], page_checksum_verification=True)

    def columns(self, part: int) -> list[pa.Field]:
        return list(self._schemas[part])

    def scan(self, columns: Sequence[str] | None = None) -> Iterator[tuple[Location, dict[str, Any]]]:
        """Every record's light columns (``columns``: those of them wanted; None = every light column)."""
        for part in range(len(self.names)):
            present = [f.name for f in self.columns(part) if _is_light(f)]
            wanted = present if columns is None else stored_columns(present, columns)
            table, self._light[part] = self._light[part], None
            if table is None:
                table = self._read(part, methodcaller("read", columns=wanted, use_threads=False))
            else:
                table = table.select(wanted)
            for row, record in enumerate(current_table(table).to_pylist() if table is not None else []):
                yield Location(part, row), record

    def arrays(self, columns: Sequence[str]) -> Iterator[tuple[int, ShardArrays]]:
        """Each readable shard's ``columns`` (those it has) as numpy, shard by shard: a pass over the store."""
        for part in range(len(self.names)):
            present = stored_columns([f.name for f in self.columns(part)], columns)
            table = self._read(part, methodcaller("read", columns=present, use_threads=False))
            if table is not None:
                yield part, _arrays(current_table(table))

    def settings(self) -> dict[str, Any]:
        """The settings the first readable shard was written with (every shard carries its store's, bar the
        shards' list and the model's depth): what is left where the manifest is damaged."""
        try:
            settings = layout.shard_settings(self._schemas[0].empty_table())[0]
        except (IndexError, ValueError):  # no readable shard, or its metadata cut
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
                names = [f.name for f in self.columns(location.part)]
                wanted = None if columns is None else stored_columns(names, columns)
                group_table = self._read(
                    location.part,
                    methodcaller("read_row_group", group, columns=wanted, use_threads=False),
                )
                groups[(location.part, group)] = None if group_table is None else current_table(group_table)
            table = groups[(location.part, group)]
            if table is None:
                raise LookupError(self._notes[location.part])
            out.append(arrow_row(table.slice(location.row - starts[group], 1)))
        return out

    def _read(self, part: int, read: Callable[[pq.ParquetFile], pa.Table]) -> pa.Table | None:
        try:
            table = read(self._file(part))
            column = not_utf8(table)
            if column is None:
                return table
            note = (
                f"{self.directory / self.names[part]}: not a readable Parquet shard (its {column!r} column holds "
                "bytes that are not UTF-8: written outside depthlens); its records are not shown"
            )
        except FileNotFoundError as exc:  # gone since the snapshot (``_file``)
            note = str(exc)
        except (OSError, pa.ArrowException) as exc:  # damaged after its footer was read
            note = f"{self.directory / self.names[part]}: unreadable ({exc}); its records are not shown"
        self._notes[part] = note
        if note not in self.notices:
            self.notices.append(note)
        return None
