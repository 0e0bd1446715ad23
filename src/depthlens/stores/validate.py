"""Range checks on stored values: every value that has a range is checked on every read, so a damaged record is
refused by name and never voted on (issue 41).

The ranges come from the store's manifest (its depth ``n_layers``, the divergence kind of each divergence field):
JSD in [0, 1] bits or [0, ln 2] nats, cosine distance in [0, 2], KL ≥ 0, settling depths in 1..L, DTR in [0, 1],
log-probabilities ≤ 0, entropies ≥ 0, token ids ≥ 0, every float finite (KL may be +inf). A Parquet shard is
checked column by column (numpy over the flattened Arrow column: no per-value Python); a JSONL record field by
field. Only on a failure is the row looked for, to name it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any, TypeGuard

import numpy as np
import pyarrow as pa

from depthlens.config.readout import DIVERGENCE_MAX
from depthlens.metrics.layer_names import (
    ENTROPY,
    STAT_PREFIX,
    TARGET_LOGPROBS,
    TARGET_RANKS,
    TRACK_LOGPROBS,
    TRACK_RANKS,
)
from depthlens.stores.names import LEGACY_NAMES, divergence_field

# Stored floats are rounded to 5 decimals and may be float16 (spacing ~5e-4 near ln 2): a value this far past a
# bound is the bound rounded, not damage.
_SLACK = 1e-3


@dataclasses.dataclass(frozen=True)
class Bound:
    """The range of one stored field: [lo, hi], whole numbers only (``whole``), infinities allowed (``inf``)."""

    lo: float
    hi: float
    what: str
    whole: bool = False
    inf: bool = False
    shape: tuple[int, ...] | None = None  # each token's row's shape ([L] or [L, m]), where the manifest says

    def shape_fault(self, shape: tuple[int, ...]) -> str | None:
        """``[T, …]`` of an array whose rows are not ``shape`` (an empty array fits any), else None."""
        if self.shape is None or shape == (0,) or shape[1:] == self.shape:
            return None
        return f"an array of shape {list(shape)}"

    def first_bad(self, values: np.ndarray) -> int | None:
        """The index of the first value out of range in ``values`` (flat float64), or None."""
        if values.size == 0:
            return None
        slack = 0.0 if self.whole else _SLACK * max(1.0, abs(self.hi) if math.isfinite(self.hi) else 1.0)
        with np.errstate(invalid="ignore"):
            good = (values >= self.lo - slack) & (values <= self.hi + slack)
            if not self.inf:
                good &= np.isfinite(values)
            if self.whole:
                good &= values == np.floor(values)
        if good.all():
            return None
        return int(np.argmin(good))


@dataclasses.dataclass(frozen=True)
class Fault:
    """A stored value out of its range: the row (1-based, in its shard) or None (a JSONL record), the field,
    the value, and what it should be."""

    row: int | None
    field: str
    value: Any
    bound: Bound | None  # None: the field is not numbers (wrong type or shape)

    def detail(self, rid: object) -> str:
        wanted = self.bound.what if self.bound else "numbers"
        return f"record {rid!r}: {self.field} holds {self.value!r}, not {wanted} — the record is damaged"


def _share(what: str) -> Bound:
    return Bound(0.0, 1.0, f"{what} in [0, 1]")


def bounds(manifest: dict[str, Any]) -> dict[str, Bound]:
    """Each ranged field of the records of the store ``manifest`` describes, and its range."""
    out = {
        "dtr": _share("a deep-thinking ratio"),
        "dtr_prefix": _share("a deep-thinking ratio"),
        "log_prob": Bound(-math.inf, 0.0, "a log-probability (finite, ≤ 0)"),
        "entropy": Bound(0.0, math.inf, "an entropy (finite, ≥ 0)"),
        "self_certainty": Bound(-math.inf, math.inf, "a finite number"),
        "confidence": Bound(-math.inf, math.inf, "a finite number"),
        "token_count": Bound(0, math.inf, "a token count (a whole number ≥ 0)", whole=True),
        "token_ids": Bound(0, math.inf, "token ids (whole numbers ≥ 0)", whole=True),
        "prompt_ids": Bound(0, math.inf, "token ids (whole numbers ≥ 0)", whole=True),
        "layer_top_ids": Bound(0, math.inf, "token ids (whole numbers ≥ 0)", whole=True),
        "layer_top_probs": Bound(0.0, 1.0, "probabilities in [0, 1]"),
    }
    out |= {old: out[new] for old, new in LEGACY_NAMES.items() if new in out}  # a store written before them
    n_layers = manifest.get("n_layers")
    if isinstance(n_layers, int) and not isinstance(n_layers, bool) and n_layers >= 1:
        out["settling_depth"] = Bound(1, n_layers, f"a settling depth in 1..{n_layers}", whole=True)
        out["mean_settling_depth"] = Bound(1.0, n_layers, f"a mean settling depth in [1, {n_layers}]")
    readout = manifest.get("readout")
    readout = readout if isinstance(readout, dict) else {}
    primary = readout.get("divergence", "jsd")
    also = readout.get("also")
    also = also if isinstance(also, list) else []
    for kind in [primary, *also]:
        if not isinstance(kind, str):
            continue
        field = divergence_field(kind, primary)
        if kind in DIVERGENCE_MAX:
            top, said = DIVERGENCE_MAX[kind]
            out[field] = Bound(0.0, top, f"a {kind} divergence in [0, {said}]")
        elif kind == "kl":
            out[field] = Bound(0.0, math.inf, "a KL divergence (≥ 0)", inf=True)
    return out | per_layer_bounds(manifest)


def per_layer_bounds(manifest: dict[str, Any]) -> dict[str, Bound]:
    """The ranges and row shapes of the per-layer quantities (``metrics.layer_quantities``): log-probabilities
    finite and ≤ 0, ranks whole numbers in [0, vocab_rows), entropies in [0, ln vocab_rows] nats, a caller's
    statistics finite; each token's row [L] or [L, M] (M tracked ids, m a statistic's width) as the manifest says."""
    n_layers, vocab = manifest.get("n_layers"), manifest.get("vocab_rows")
    layers = n_layers if _count(n_layers) else None
    readout = manifest.get("readout")
    readout = readout if isinstance(readout, dict) else {}
    track = readout.get("track")
    track = track if isinstance(track, list) else None

    def rows(width: int | None = 0) -> tuple[int, ...] | None:
        if layers is None or width is None:
            return None
        return (layers, width) if width else (layers,)

    ranks = f"0..{vocab - 1}" if _count(vocab) else "0 or more"
    top = vocab - 1 if _count(vocab) else math.inf
    logprob, rank = "log-probabilities (finite, ≤ 0)", f"ranks (whole numbers in {ranks})"
    tracked = len(track) if track is not None else None
    out = {
        TARGET_LOGPROBS: Bound(-math.inf, 0.0, logprob, shape=rows()),
        TARGET_RANKS: Bound(0, top, rank, whole=True, shape=rows()),
        TRACK_LOGPROBS: Bound(-math.inf, 0.0, logprob, shape=rows(tracked)),
        TRACK_RANKS: Bound(0, top, rank, whole=True, shape=rows(tracked)),
        ENTROPY: Bound(
            0.0, math.log(vocab) if _count(vocab) else math.inf, "entropies (≥ 0, ≤ ln V nats)", shape=rows()
        ),
    }
    stats = manifest.get("layer_stats")
    stats = stats if isinstance(stats, dict) else {}
    for name, width in stats.items():
        out[STAT_PREFIX + str(name)] = Bound(
            -math.inf, math.inf, "finite numbers", shape=rows(width if _count(width) or width == 0 else None)
        )
    return out


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _flat(array: pa.Array) -> np.ndarray:
    """Every number of an Arrow array, however nested in lists, as flat float64 (nulls left out)."""
    while pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type):
        array = array.flatten()
    return np.asarray(array.drop_null().to_numpy(zero_copy_only=False), dtype=np.float64)


def table_fault(table: pa.Table, ranges: dict[str, Bound]) -> Fault | None:
    """The first value of a shard out of its range, or None: each ranged column checked whole."""
    for field in table.column_names:
        bound = ranges.get(field)
        if bound is None:
            continue
        column = table.column(field)
        if bound.shape is not None and _row_shape(column.type) not in (None, bound.shape):
            return _find_row(column.to_pylist(), field, bound)
        try:
            bad = [bound.first_bad(_flat(chunk)) for chunk in column.chunks]
        except (ValueError, TypeError, pa.ArrowException):
            return _find_row(column.to_pylist(), field, bound)
        if any(b is not None for b in bad):
            return _find_row(column.to_pylist(), field, bound)
    return None


def _row_shape(kind: pa.DataType) -> tuple[int, ...] | None:
    """The per-token row shape of a ``list<fixed_size_list<…>>`` column (``[L]`` or ``[L, m]``), None otherwise."""
    if not pa.types.is_list(kind):
        return None
    sizes, inner = [], kind.value_type
    while pa.types.is_fixed_size_list(inner):
        sizes.append(inner.list_size)
        inner = inner.value_type
    return tuple(sizes) or None


def _find_row(values: Iterable[Any], field: str, bound: Bound) -> Fault:
    """The row (1-based) of a column whose value is out of range: only looked for once a column failed."""
    for row, value in enumerate(values, start=1):
        fault = _value_fault(field, value, bound)
        if fault is not None:
            return dataclasses.replace(fault, row=row)
    return Fault(None, field, "(unreadable)", bound)


def _value_fault(field: str, value: Any, bound: Bound) -> Fault | None:
    if value is None:
        return None
    shaped = (
        bound
        if bound.shape is None
        else dataclasses.replace(bound, what=f"{_dims(bound.shape)} {bound.what}")
    )
    try:
        array = np.asarray(value, dtype=np.float64)
    except (ValueError, TypeError):
        if bound.shape is not None and isinstance(value, list):
            return Fault(None, field, "rows of unequal lengths", shaped)
        return Fault(None, field, _short(value), None)
    wrong_shape = bound.shape_fault(array.shape)
    if wrong_shape is not None:
        return Fault(None, field, wrong_shape, shaped)
    values = array.ravel()
    bad = bound.first_bad(values)
    return None if bad is None else Fault(None, field, float(values[bad]), bound)


def record_fault(record: dict[str, Any], ranges: dict[str, Bound]) -> Fault | None:
    """The first value of one record (a JSONL line) out of its range, or None."""
    for field, bound in ranges.items():
        if field in record:
            fault = _value_fault(field, record[field], bound)
            if fault is not None:
                return fault
    return None


def _dims(shape: tuple[int, ...]) -> str:
    """``[T, 30]`` or ``[T, 30, 2]``: a per-token row shape with its token axis."""
    return "[T, " + ", ".join(str(n) for n in shape) + "]"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
