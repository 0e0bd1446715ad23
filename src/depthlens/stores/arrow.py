"""Result records as Arrow tables and back: per-token float lists at the store's width (float32, or float16 on
request), ``[T × L]`` float rows (divergences) as ``list<fixed_size_list<width, L>>``, each layer's top-k
(``[T × L × K]``: ``layer_top_ids`` int32, ``layer_top_probs`` float32) as
``list<fixed_size_list<fixed_size_list<type, K>, L>>``, and the per-layer quantities (``per_layer_type``) as one of
those two shapes; such a table as a DataFrame with (T, L) / (T, L, K) array cells and back (``to_pandas``,
``from_pandas``), its own metadata travelling in the frame's ``attrs``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from depthlens.metrics.layer_names import is_per_layer, is_rank


def _float_list(values: list[Any], width: pa.DataType) -> pa.Array:
    return pa.array(
        [None if v is None else np.asarray(v, dtype=width.to_pandas_dtype()) for v in values],
        type=pa.list_(width),
    )


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


CUBES = {"layer_top_ids": pa.int32(), "layer_top_probs": pa.float32()}
"""The ``[T × L × K]`` fields and their stored type: token ids fit int32 (no vocabulary reaches 2^31), and the
probabilities keep float32 whatever the store's width — float16 would tie neighbours a top-k orders."""


def _cube_list(values: list[Any], kind: pa.DataType) -> pa.Array:
    """Rows of ``[T × L × K]`` arrays as ``list<fixed_size_list<fixed_size_list<kind, K>, L>>`` (L and K from the
    first non-empty row; a record without one is stored as an empty list)."""
    first = next((np.asarray(v) for v in values if _has_rows(v)), np.zeros((0, 0, 0)))
    n_layers, k = first.shape[1:] if first.ndim == 3 else (0, 0)
    dtype = kind.to_pandas_dtype()
    offsets, flat = [0], []
    for v in values:
        cube = (
            np.asarray(v, dtype=dtype).reshape(-1, n_layers, k)
            if _has_rows(v)
            else np.zeros((0, n_layers, k), dtype)
        )
        flat.append(cube.reshape(-1))
        offsets.append(offsets[-1] + len(cube))
    per_layer = pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(flat), type=kind), k)
    per_token = pa.FixedSizeListArray.from_arrays(per_layer, n_layers)
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), per_token)


def _has_rows(value: Any) -> bool:
    """A value with at least one row (a non-empty list or array; None and empty ones have none)."""
    return value is not None and len(value) > 0


HIDDEN_STATES = "hidden_states"
"""``score``'s ``hidden_layers`` result, (T, k, d) float32 per record: a table holds it as a ``[T × k × d]`` float32
array (``to_pandas`` gives the (T, k, d) array back); no store keeps it."""


def per_layer_type(field: str) -> pa.DataType | None:
    """The stored type of a per-layer quantity (``metrics.layer_quantities``), None for any other field: ranks int32
    (below the vocabulary), every value float32 whatever the store's width — float16 keeps 3 digits, so a
    log-probability of −20 would be stored ±0.008 off, and a caller's statistic may hold any scale."""
    if not is_per_layer(field):
        return None
    return pa.int32() if is_rank(field) else pa.float32()


def _per_layer_list(values: list[Any], kind: pa.DataType) -> pa.Array:
    """A per-layer quantity's rows: ``[T × L]`` (one value a layer) or ``[T × L × m]``, as its first row is."""
    first = next((np.asarray(v) for v in values if _has_rows(v)), None)
    if first is not None and first.ndim == 3:
        return _cube_list(values, kind)
    return _matrix_list(values, kind)


def _kind(values: list[Any]) -> str:
    """``matrix`` for rows of float rows, ``floats`` for float lists, else ``other`` (Arrow infers the type)."""
    first = next((v for v in values if isinstance(v, list) and v), None)
    if first is None:
        return "other"
    if isinstance(first[0], list):
        row: list[Any] = next((r for v in values if isinstance(v, list) for r in v if r), [])
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
        per_layer = per_layer_type(key)
        if key in CUBES and any(values):
            columns[key] = _cube_list(values, CUBES[key])
        elif per_layer is not None and any(_has_rows(v) for v in values):
            columns[key] = _per_layer_list(values, per_layer)
        elif key == HIDDEN_STATES and any(_has_rows(v) for v in values):
            columns[key] = _cube_list(values, pa.float32())
        elif kind == "matrix":
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


def _is_matrix(kind: pa.DataType) -> bool:
    """``list<fixed_size_list<number, L>>``: a ``[T × L]`` matrix per row (``to_table``'s divergences, a target
    trajectory's log-probabilities and ranks)."""
    if not (pa.types.is_list(kind) and pa.types.is_fixed_size_list(kind.value_type)):
        return False
    inner = kind.value_type.value_type
    return pa.types.is_floating(inner) or pa.types.is_integer(inner)


def _is_cube(kind: pa.DataType) -> bool:
    """``list<fixed_size_list<fixed_size_list<type, K>, L>>``: a ``[T × L × K]`` array per row (each layer's top-k)."""
    return (
        pa.types.is_list(kind)
        and pa.types.is_fixed_size_list(kind.value_type)
        and pa.types.is_fixed_size_list(kind.value_type.value_type)
    )


def _labels(values: list[Any] | None) -> np.ndarray | None:
    """A ``[T][L][K]`` list of labels (``layer_top_tokens``) as a (T, L, K) array of str, None for none."""
    if values is None:
        return None
    return np.array(values, dtype=str) if values else np.empty((0, 0, 0), dtype=str)


def matrices(table: pa.Table, column: str) -> list[np.ndarray | None]:
    """Each row's ``[T × L]`` matrix of ``column`` (e.g. ``divergence``) as a (T, L) numpy array, None where the
    row has none; views of the table's own buffers where the width allows, no Python loop over tokens. A
    ``[T × L × K]`` column (``layer_top_ids``, ``layer_top_probs``) gives (T, L, K) arrays (``cubes``)."""
    data = table.column(column)
    if _is_cube(data.type):
        return cubes(table, column)
    if not _is_matrix(data.type):
        raise TypeError(
            f"column {column!r} is {data.type}, not a [T × L] matrix (list<fixed_size_list<number, L>>) "
            "nor a [T × L × K] array"
        )
    n_layers = data.type.value_type.list_size
    out: list[np.ndarray | None] = []
    for chunk in data.chunks:
        values = chunk.flatten().flatten().to_numpy(zero_copy_only=False).reshape(-1, n_layers)
        lengths = chunk.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
        rows = np.split(values, np.cumsum(lengths)[:-1]) if len(chunk) else []
        out += [None if null else row for row, null in zip(rows, chunk.is_null().to_pylist(), strict=True)]
    return out


def cubes(table: pa.Table, column: str) -> list[np.ndarray | None]:
    """Each row's ``[T × L × K]`` array of ``column`` (``layer_top_ids`` / ``layer_top_probs``, a tracked id's
    ``layer_track_*``, a caller's ``layer_stat_<name>`` of m values a layer) as a (T, L, K) numpy array, None where
    the row has none."""
    data = table.column(column)
    kind = data.type
    if not (pa.types.is_list(kind) and pa.types.is_fixed_size_list(kind.value_type)):
        raise TypeError(f"column {column!r} is {kind}, not a [T × L × K] array")
    per_layer = kind.value_type.value_type
    if not pa.types.is_fixed_size_list(per_layer):
        raise TypeError(f"column {column!r} is {kind}, not a [T × L × K] array")
    n_layers, k = kind.value_type.list_size, per_layer.list_size
    out: list[np.ndarray | None] = []
    for chunk in data.chunks:
        values = chunk.flatten().flatten().flatten().to_numpy(zero_copy_only=False).reshape(-1, n_layers, k)
        lengths = chunk.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
        rows = np.split(values, np.cumsum(lengths)[:-1]) if len(chunk) else []
        out += [None if null else row for row, null in zip(rows, chunk.is_null().to_pylist(), strict=True)]
    return out


def to_pandas(table: pa.Table) -> Any:
    """``table.to_pandas()`` with each ``[T × L]`` column's cell a (T, L) float numpy array and each
    ``[T × L × K]`` one's a (T, L, K) array — ``layer_top_tokens``'s of str (pyarrow's own conversion gives
    object arrays of T rows); every other column as pyarrow converts it."""
    frame = table.to_pandas()  # the frame's attrs: those the table carries (``with_frame_attrs``)
    for field in table.schema:
        arrays = None
        if _is_matrix(field.type):
            arrays = matrices(table, field.name)
        elif _is_cube(field.type):
            arrays = cubes(table, field.name)
        elif field.name == "layer_top_tokens":
            arrays = [_labels(v) for v in table.column(field.name).to_pylist()]
        if arrays is not None:
            # filled one by one: numpy would stack equal shapes
            cells = np.empty(table.num_rows, dtype=object)
            for i, array in enumerate(arrays):
                cells[i] = array
            frame[field.name] = cells
    return frame


def with_frame_attrs(table: pa.Table, attrs: Mapping[str, Any]) -> pa.Table:
    """``table`` whose DataFrame — pyarrow's ``table.to_pandas()`` and ``to_pandas`` alike — carries ``attrs``
    (pandas keeps them through filtering and back through ``pa.Table.from_pandas``): pandas' own entry of the
    schema metadata, which pyarrow reads back."""
    metadata = dict(table.schema.metadata or {})
    frame = json.loads(metadata.get(b"pandas", b"{}"))
    frame = {"index_columns": [], "column_indexes": [], "columns": [], **frame}
    frame["attributes"] = {**frame.get("attributes", {}), **attrs}
    return table.replace_schema_metadata({**metadata, b"pandas": json.dumps(frame, default=str).encode()})


def frame_attrs(table: pa.Table) -> dict[str, Any]:
    """The ``attrs`` a table's DataFrame gets (``with_frame_attrs``; also a frame's, through pyarrow)."""
    raw = (table.schema.metadata or {}).get(b"pandas")
    return dict(json.loads(raw).get("attributes") or {}) if raw else {}


def _array_cells(name: str, cells: list[Any], first: np.ndarray) -> pa.Array:
    """Cells of (T, L) or (T, L, K) arrays (``to_pandas``'s) as the column they came from; a cell without one
    (None) as an empty list, as ``to_table`` stores a record without it."""
    shape = first.shape[1:]
    if first.dtype.kind in "US":  # layer_top_tokens: labels, as nested lists
        return pa.array([[] if c is None else np.asarray(c).tolist() for c in cells])
    kind = CUBES.get(name, pa.float32() if first.dtype.kind == "f" else pa.int32())
    dtype = kind.to_pandas_dtype()
    rows = [np.zeros((0, *shape), dtype) if c is None else np.asarray(c, dtype=dtype) for c in cells]
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
    values: pa.Array = pa.array(np.concatenate([r.reshape(-1) for r in rows]), type=kind)
    for size in reversed(shape):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), values)


def from_pandas(frame: Any) -> pa.Table:
    """A DataFrame of ``to_pandas`` — filtered, sorted or cut as a notebook does — back as the verbs' table: each
    column of (T, L) / (T, L, K) array cells as the ``[T × L]`` / ``[T × L × K]`` column it was (which
    ``pa.Table.from_pandas`` cannot convert), every other column as pyarrow converts it, the index left out, and
    the table's own metadata (the frame's ``attrs``: a pool's manifest) with it."""
    arrays: dict[str, pa.Array] = {}
    for name in frame.columns:
        cells = list(frame[name]) if frame[name].dtype == object else []
        first = next((c for c in cells if isinstance(c, np.ndarray)), None)
        if first is not None and first.ndim >= 2:
            arrays[name] = _array_cells(str(name), cells, first)
    rest = [c for c in frame.columns if c not in arrays]
    plain = pa.Table.from_pandas(frame[rest], preserve_index=False)
    columns = {str(c): arrays[c] if c in arrays else plain.column(str(c)) for c in frame.columns}
    table = pa.table(columns)
    attrs = dict(frame.attrs)
    carried = attrs.get("depthlens")
    if carried is not None:
        table = table.replace_schema_metadata({"depthlens": json.dumps(carried, default=str)})
    return with_frame_attrs(table, attrs) if attrs else table


def not_utf8(table: pa.Table) -> str | None:
    """The first text column holding bytes that are not UTF-8 (Arrow reads them unchecked; turning them into
    Python text would fail in every reader), or None."""
    for name, column in zip(table.column_names, table.columns, strict=True):
        if "string" in str(column.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                return name
    return None
