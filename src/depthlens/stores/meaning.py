"""What stored per-token and per-layer values mean, beyond their ranges (issue 59): each layer's top-k holds K
distinct token ids below the vocabulary with probabilities that are descending and sum to at most 1, one row per
read-out token, ``n_layers`` layers and the manifest's K each. ``stores.validate`` checks each value alone (a
probability in [0, 1]); these check values against each other and the store, so ``[0.9] * 5`` — each value in
range, summing to 4.5 — is refused too.

One validation for every kind of store (a sample store's responses, a ``score`` store, Parquet or JSONL) and every
door: ``parquet.range_problem`` runs ``table_problem`` on each shard read (every reader, ``check``, ``--resume``),
``jsonl_checks.jsonl_record_problem`` runs ``record_problem`` on each JSONL record, and the explorer runs
``record_problem`` on each record it opens.

Each check is one row of ``MEANINGS``: the field it is named by, and a function of that field's values for many
read-out tokens at once — every token of a shard, or of one record: an array whose first axis is the token — and of
what the manifest says (``Facts``), giving the first bad token (and layer) and what is wrong there. A new per-layer
field joins with its own row (and, where it has a fixed shape per token, an entry in ``SHAPES``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from depthlens.stores.records import VOCAB

# How far past 1 the K stored probabilities of one layer's top-k may sum with nothing wrong. They are K values of
# one softmax, so their sum is at most the distribution's total; that total is 1 up to the float32 softmax's own
# rounding over the vocabulary (measured: at most 2.7e-6 off, V = 152k, a flat distribution; taken as 1e-5), and
# each stored value then moves by its rounding to the store's decimals (5 in a sample store, 6 in a score store:
# at most 0.5e-5 each) and to float32 (at most 2^-24 each, every value being ≤ 1), and a float32 sum of K such values
# adds at most 2^-24 per addition.
_PER_VALUE = 0.5e-5 + 2 * 2.0**-24
_NORMALISED = 1e-5


def top_sum_slack(k: int) -> float:
    """How far past 1 a layer's ``k`` stored top-k probabilities may sum (see the constants above)."""
    return _NORMALISED + k * _PER_VALUE


@dataclasses.dataclass(frozen=True)
class Facts:
    """What a store's manifest says its values must agree with: None where it does not say (a store written
    before it was recorded: that check is not made)."""

    vocab: int | None  # the model's vocabulary rows: every token id is below it
    n_layers: int | None
    top_k: int | None  # readout.layer_top_k: K of each layer's top-k (0: none kept)

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> Facts:
        readout = manifest.get("readout")
        k = readout.get("layer_top_k", 0) if isinstance(readout, dict) else None
        return cls(_count(manifest.get(VOCAB)), _count(manifest.get("n_layers")), _count(k, zero=True))


def _count(value: object, zero: bool = False) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= (0 if zero else 1):
        return value
    return None


@dataclasses.dataclass(frozen=True)
class Bad:
    """Where a check failed: the token (index along the first axis of the values checked), the layer (0-based;
    None for a per-token field) and what is wrong there."""

    token: int
    layer: int | None
    said: str


Check = Callable[[np.ndarray, Facts], Bad | None]


@dataclasses.dataclass(frozen=True)
class Meaning:
    """One check: ``field``'s values for N tokens (an array [N, ...]) against each other and ``Facts``."""

    field: str
    check: Check


def _first(bad: np.ndarray) -> tuple[int, int | None] | None:
    """The first (token, layer) where ``bad`` ([N] or [N, L]) is true, or None."""
    if not bad.any():
        return None
    at = np.unravel_index(int(np.argmax(bad)), bad.shape)
    return int(at[0]), (int(at[1]) if len(at) > 1 else None)


def _sums_to_at_most_one(probs: np.ndarray, facts: Facts) -> Bad | None:
    if probs.ndim != 3:
        return None
    k = probs.shape[-1]
    sums = probs.sum(axis=-1)  # in the stored width: float32 adds at most K × 2^-24 more, within the slack
    found = _first(sums > 1.0 + top_sum_slack(k))
    if found is None:
        return None
    t, layer = found
    return Bad(
        t,
        layer,
        f"layer_top_probs sum to {sums[t, layer]:.6g}, more than 1 (K = {k} probabilities of one distribution; "
        f"rounding allows {top_sum_slack(k):.1e} past 1)",
    )


def _descending(probs: np.ndarray, facts: Facts) -> Bad | None:
    if probs.ndim != 3 or probs.shape[-1] < 2:
        return None
    # rounding (to decimals, to float32) keeps sorted values sorted; two values' rounding apart at most
    found = _first(((probs[..., 1:] - probs[..., :-1]) > 2 * _PER_VALUE).any(axis=-1))
    if found is None:
        return None
    t, layer = found
    return Bad(t, layer, "layer_top_probs are not in descending order (each layer's top-k is sorted)")


_PAIRWISE = 16  # up to this K, a layer's ids are compared pair by pair; past it, sorted


def _distinct(ids: np.ndarray, facts: Facts) -> Bad | None:
    if ids.ndim != 3 or ids.shape[-1] < 2:
        return None
    k = ids.shape[-1]
    if k <= _PAIRWISE:  # a few columns: every pair compared (no sort of millions of short rows)
        twice = np.zeros(ids.shape[:-1], dtype=bool)
        for i in range(k):
            for j in range(i + 1, k):
                twice |= ids[..., i] == ids[..., j]
    else:
        twice = (np.diff(np.sort(ids, axis=-1), axis=-1) == 0).any(axis=-1)
    found = _first(twice)
    if found is None:
        return None
    t, layer = found
    row = ids[t, layer]
    repeated = next(int(i) for i in row if int((row == i).sum()) > 1)
    return Bad(
        t, layer, f"layer_top_ids holds token id {repeated} twice (a layer's top-k are K distinct tokens)"
    )


def _below_vocabulary(field: str) -> Check:
    def check(ids: np.ndarray, facts: Facts) -> Bad | None:
        if facts.vocab is None or ids.ndim not in (1, 3):
            return None
        past = ids >= facts.vocab
        found = _first(np.asarray(past.any(axis=-1) if ids.ndim == 3 else past))
        if found is None:
            return None
        t, layer = found
        value = ids[t] if layer is None else ids[t, layer][past[t, layer]][0]
        return Bad(
            t,
            layer,
            f"{field} holds token id {int(value)}, past the model's vocabulary of {facts.vocab} ({VOCAB})",
        )

    return check


MEANINGS: tuple[Meaning, ...] = (
    Meaning("token_ids", _below_vocabulary("token_ids")),
    Meaning("layer_top_ids", _below_vocabulary("layer_top_ids")),
    Meaning("layer_top_ids", _distinct),
    Meaning("layer_top_probs", _descending),
    Meaning("layer_top_probs", _sums_to_at_most_one),
)
"""The checks, in the order they run (the first that fails is named)."""


def _cube_shape(facts: Facts) -> tuple[int | None, ...]:
    return (facts.n_layers, facts.top_k)


SHAPES: dict[str, Callable[[Facts], tuple[int | None, ...]]] = {
    "layer_top_ids": _cube_shape,
    "layer_top_probs": _cube_shape,
}
"""Each per-token field of a fixed shape after its token axis — ``[L, K]`` for each layer's top-k — as the
manifest gives it (None: not said). Its token axis has one row per read-out token, as the divergence rows."""

_SHAPE_WORDS = {"layer_top_ids": "[T, L, K]", "layer_top_probs": "[T, L, K]"}


def _shape_said(field: str, shape: tuple[int, ...], expected: tuple[int | None, ...]) -> str:
    words = _SHAPE_WORDS.get(field, "[T, ...]")
    wanted = ["?" if e is None else e for e in expected]
    return (
        f"{field} has shape {list(shape)}, not {words} = {wanted} (read-out tokens, the manifest's n_layers and "
        "readout.layer_top_k)"
    )


def _shape_problem(field: str, shape: tuple[int, ...], tokens: int | None, facts: Facts) -> str | None:
    """A record's ``field`` of ``shape`` against its ``tokens`` read-out tokens (None: not known) and the store."""
    expected = (tokens, *SHAPES[field](facts))
    if shape[:1] == (0,) and tokens in (0, None):
        return None  # no read-out tokens: nothing per layer
    fits = len(shape) == len(expected) and all(
        e is None or a == e for a, e in zip(shape, expected, strict=True)
    )
    return None if fits else _shape_said(field, shape, expected)


def _tokens_of(record: Mapping[str, Any]) -> int | None:
    rows = record.get("divergence")
    return len(rows) if isinstance(rows, (list, np.ndarray)) else None


def record_problem(record: Mapping[str, Any], facts: Facts) -> str | None:
    """What is wrong with one record's values against each other and the store (a JSONL line, an opened record in
    the explorer), or None. Fields that are not arrays of numbers are left to the readers' other checks."""
    arrays: dict[str, np.ndarray] = {}
    for field in {m.field for m in MEANINGS} | set(SHAPES):
        value = record.get(field)
        if value is None or isinstance(value, (str, bytes)):
            continue
        array = _numbers(field, value)
        if array is None:
            return f"{field} is not an array of numbers of one shape" if field in SHAPES else None
        if field in SHAPES:
            wrong = _shape_problem(field, array.shape, _tokens_of(record), facts)
            if wrong:
                return wrong
        arrays[field] = array
    for meaning in MEANINGS:
        array = arrays.get(meaning.field)
        if array is not None and array.size:
            bad = meaning.check(array, facts)
            if bad is not None:
                return _at(bad)
    return None


WHOLE = frozenset({"token_ids", "layer_top_ids"})
"""Fields of token ids: read as whole numbers (an id of 10^30 named as itself, not as a float)."""


def _numbers(field: str, value: object) -> np.ndarray | None:
    """A record's field as an array of numbers (ids as int64, or as Python ints past it), None where it is not."""
    try:
        return np.asarray(value, dtype=np.int64 if field in WHOLE else np.float64)
    except OverflowError:
        return np.asarray(value, dtype=object)
    except (ValueError, TypeError):
        return None


def _at(bad: Bad, token: int | None = None) -> str:
    t = bad.token if token is None else token
    layer = "" if bad.layer is None else f", layer {bad.layer + 1}"
    return f"token {t}{layer}: {bad.said}"


def _one(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as one array (a shard's columns are one chunk each: no copy then)."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def _offsets(array: pa.Array) -> np.ndarray:
    """Each row's first token in the flattened values, and the end (a list array's offsets, from 0)."""
    offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    return offsets - offsets[0]


def _per_token(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray] | None:
    """A list column's values for every token of the shard as one array [N, ...] (its fixed-size inner lists as
    axes) and its rows' offsets into it; None where its type is not a list of numbers or of fixed-size lists of
    them."""
    array = _one(column)
    if not pa.types.is_list(array.type):
        return None
    offsets = _offsets(array)
    values, dims = array.flatten(), []
    while pa.types.is_fixed_size_list(values.type):
        dims.append(values.type.list_size)
        values = values.flatten()
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)) or values.null_count:
        return None
    flat = values.to_numpy(zero_copy_only=False)
    return flat.reshape(int(offsets[-1]), *dims), offsets


def table_problem(table: pa.Table, facts: Facts) -> tuple[int, str] | None:
    """The first record of a shard whose values disagree (its row, 1-based, and what is wrong), or None. Each field
    is checked for the whole shard at once; a column of an unexpected type is checked record by record."""
    names = set(table.column_names)
    wanted = ({m.field for m in MEANINGS} | set(SHAPES)) & names
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for field in sorted(wanted):
        found = _per_token(table.column(field))
        if found is None:
            return _row_by_row(table, facts)
        arrays[field] = found
    row = _shape_row(table, arrays, facts)
    if row is not None:
        return row
    for meaning in MEANINGS:
        if meaning.field not in arrays:
            continue
        values, offsets = arrays[meaning.field]
        bad = meaning.check(values, facts) if values.size else None
        if bad is not None:
            record = int(np.searchsorted(offsets, bad.token, side="right")) - 1
            return record + 1, _at(bad, bad.token - int(offsets[record]))
    return None


def _shape_row(
    table: pa.Table, arrays: dict[str, tuple[np.ndarray, np.ndarray]], facts: Facts
) -> tuple[int, str] | None:
    """The first row whose fixed-shape field disagrees with the manifest (its inner shape) or with its own
    divergence rows (its token count)."""
    tokens = None
    if "divergence" in table.column_names and pa.types.is_list(table.schema.field("divergence").type):
        tokens = np.diff(_offsets(_one(table.column("divergence"))))
    for field in sorted(set(SHAPES) & set(arrays)):
        values, offsets = arrays[field]
        lengths = np.diff(offsets)
        inner = values.shape[1:]
        if _shape_problem(field, (1, *inner), None, facts) is not None:  # every row's [L, K] (one list type)
            first = int(np.argmax(lengths > 0)) if (lengths > 0).any() else None
            if first is not None:
                return first + 1, str(_shape_problem(field, (int(lengths[first]), *inner), None, facts))
        if tokens is None:
            continue
        differ = (lengths != tokens) & ~((lengths == 0) & (tokens == 0))
        if differ.any():
            row = int(np.argmax(differ))
            wrong = _shape_problem(field, (int(lengths[row]), *inner), int(tokens[row]), facts)
            if wrong:
                return row + 1, wrong
    return None


def _row_by_row(table: pa.Table, facts: Facts) -> tuple[int, str] | None:
    """``record_problem`` on each row: for a shard whose columns are not the lists depthlens writes."""
    fields = [
        f for f in ({m.field for m in MEANINGS} | set(SHAPES) | {"divergence"}) if f in table.column_names
    ]
    for row, record in enumerate(table.select(fields).to_pylist(), start=1):
        wrong = record_problem(record, facts)
        if wrong:
            return row, wrong
    return None
