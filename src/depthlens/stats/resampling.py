"""The question-level bootstrap: percentile intervals and bootstrap p-values over resampled questions.

Responses to one question share its difficulty, so a study's unit of resampling is the question: a resample draws
Q questions with replacement and pools their responses. ``scipy.stats.bootstrap`` draws the question indices
(``resample_questions``); ``percentile_summary`` reads the interval and the p-value off the draws. The correlation
statistics here take thousands of such draws at once (per-question sums for Pearson / point-biserial r, ranks of
the padded pooled responses for Spearman ρ), so 10⁴ resamples of a few hundred responses take well under a
second; ``bootstrap_ci`` is the one-call-per-resample form for any other statistic. Pure functions of arrays.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import stats


@dataclasses.dataclass(frozen=True)
class BootstrapResult:
    """A percentile interval and the two-sided bootstrap p-value of ``null`` from one resampling.

    ``p`` is the smallest two-sided level whose percentile interval would exclude ``null``:
    2·min(#{θ* ≤ null} + 1, #{θ* ≥ null} + 1) / (B + 1), capped at 1 (the +1 keeps it above 0 with B draws).
    """

    low: float | None
    high: float | None
    p: float | None
    defined: int  # resamples where the statistic was defined
    resamples: int


NO_BOOTSTRAP = BootstrapResult(None, None, None, 0, 0)


def percentile_summary(
    draws: np.ndarray, resamples: int, level: float = 0.95, null: float = 0.0
) -> BootstrapResult:
    """Interval and p-value from bootstrap draws (NaN = undefined; fewer than half defined → nothing)."""
    finite = np.asarray(draws, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0 or finite.size < resamples / 2:
        return dataclasses.replace(NO_BOOTSTRAP, defined=int(finite.size), resamples=resamples)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(finite, [tail, 1.0 - tail])
    below, above = int((finite <= null).sum()), int((finite >= null).sum())
    p = min(1.0, 2.0 * (min(below, above) + 1) / (finite.size + 1))
    return BootstrapResult(float(low), float(high), p, int(finite.size), resamples)


Seed = np.random.Generator | int | Sequence[int]
"""A generator, or what ``np.random.default_rng`` takes to make one."""


def _seed(rng: Seed) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def resample_questions(
    statistic: Callable[[np.ndarray], np.ndarray],
    questions: int,
    resamples: int,
    rng: Seed,
    level: float = 0.95,
    width: int | None = None,
) -> np.ndarray:
    """The bootstrap distribution of a statistic of resampled question indices (``scipy.stats.bootstrap``).

    ``statistic(idx)`` takes question indices of shape [..., Q] (drawn with replacement) and returns one value per
    leading index (NaN where undefined): scipy's vectorized form, so thousands of resamples stay cheap. ``width``:
    the array elements one resample needs (default Q), which sizes scipy's batches to ~16 MB of float64.
    """
    with warnings.catch_warnings():  # undefined resamples are NaN by design; the summary drops them
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.filterwarnings("ignore", category=stats.DegenerateDataWarning)
        result = stats.bootstrap(
            (np.arange(questions),),
            lambda idx, axis=-1: statistic(np.moveaxis(idx, axis, -1)),
            n_resamples=resamples,
            batch=max(1, min(resamples, 2_000_000 // max(width or questions, 1))),
            vectorized=True,
            confidence_level=level,
            method="percentile",
            rng=_seed(rng),
        )
    return np.asarray(result.bootstrap_distribution, dtype=np.float64)


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float | None],
    clusters: Sequence[np.ndarray],
    resamples: int,
    rng: Seed,
    level: float = 0.95,
) -> tuple[float | None, float | None]:
    """Percentile bootstrap CI of ``statistic`` over resampled *clusters* (questions), each an index array.

    Responses to one question share its difficulty, so the question is the unit resampled; resamples where
    the statistic is undefined are dropped, and fewer than half defined gives (None, None). ``statistic`` takes
    the concatenated response indices of one resample (one call per resample; ``cluster_correlation_bootstrap`` and
    ``mean_bootstrap`` below are the vectorized forms).
    """
    if not clusters:
        return None, None

    def per_resample(idx: np.ndarray) -> np.ndarray:
        flat = idx.reshape(-1, idx.shape[-1])
        out = np.array([_nan(statistic(np.concatenate([clusters[i] for i in row]))) for row in flat])
        return out.reshape(idx.shape[:-1])

    summary = percentile_summary(
        resample_questions(per_resample, len(clusters), resamples, rng, level), resamples, level
    )
    return summary.low, summary.high


def _nan(value: float | None) -> float:
    return np.nan if value is None else float(value)


# ---------------------------------------------------------------------------------------------------------
# Vectorized over resamples: a correlation over responses (questions resampled), a mean over questions.

Kind = Literal["pearson", "spearman"]


@dataclasses.dataclass(frozen=True, eq=False)  # identity equality: fields are arrays
class Clustered:
    """Paired values grouped by question, padded to [Q, m] (m = the largest group) with a mask."""

    x: np.ndarray  # [Q, m], NaN where padded
    y: np.ndarray  # [Q, m], NaN where padded
    mask: np.ndarray  # [Q, m] bool

    @classmethod
    def of(cls, groups: Sequence[tuple[np.ndarray, np.ndarray]]) -> Clustered:
        groups = [(np.asarray(v, np.float64), np.asarray(c, np.float64)) for v, c in groups if len(v)]
        width = max((len(v) for v, _ in groups), default=0)
        x = np.full((len(groups), width), np.nan)
        y = np.full_like(x, np.nan)
        for q, (v, c) in enumerate(groups):
            x[q, : len(v)], y[q, : len(c)] = v, c
        return cls(x, y, ~np.isnan(x))

    @property
    def questions(self) -> int:
        return self.x.shape[0]


def _pearson_rows(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Pearson r along the last axis with 0/1 (or count) weights w; NaN where fewer than 3 points or a side is
    constant. Inputs are centred by their overall mean first, so the sums do not cancel."""
    x = np.where(w > 0, x, 0.0)
    y = np.where(w > 0, y, 0.0)
    n = w.sum(-1)
    mx = (w * x).sum(-1) / np.maximum(n, 1)
    my = (w * y).sum(-1) / np.maximum(n, 1)
    dx, dy = x - mx[..., None], y - my[..., None]
    sxx, syy, sxy = (w * dx * dx).sum(-1), (w * dy * dy).sum(-1), (w * dx * dy).sum(-1)
    scale_x = (w * x * x).sum(-1) + 1e-300
    scale_y = (w * y * y).sum(-1) + 1e-300
    # "Constant" at float64 resolution of the values' own magnitude (the exact test of stats.correlation on a sum).
    ok = (n >= 3) & (sxx > 1e-12 * scale_x) & (syy > 1e-12 * scale_y)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = sxy / np.sqrt(sxx * syy)
    return np.where(ok, np.clip(r, -1.0, 1.0), np.nan)


def _pearson_statistic(data: Clustered) -> Callable[[np.ndarray], np.ndarray]:
    # Per question: counts and centred sums, so a resample is a sum of its questions' rows.
    x = np.where(data.mask, data.x, 0.0)
    y = np.where(data.mask, data.y, 0.0)
    n = data.mask.sum(1).astype(np.float64)
    total = n.sum()
    x = np.where(data.mask, x - x.sum() / total, 0.0)
    y = np.where(data.mask, y - y.sum() / total, 0.0)
    sums = np.stack([n, x.sum(1), y.sum(1), (x * x).sum(1), (y * y).sum(1), (x * y).sum(1)], axis=1)
    scale = np.array([np.abs(x).max(initial=0.0), np.abs(y).max(initial=0.0)]) ** 2 + 1e-300

    def statistic(idx: np.ndarray) -> np.ndarray:
        s = sums[idx].sum(-2)  # [..., 6]
        k, sx, sy, sxx, syy, sxy = np.moveaxis(s, -1, 0)
        vxx = sxx - sx * sx / np.maximum(k, 1)
        vyy = syy - sy * sy / np.maximum(k, 1)
        vxy = sxy - sx * sy / np.maximum(k, 1)
        # Constant within a resample (e.g. every drawn response wrong): relative to the values' magnitude.
        ok = (k >= 3) & (vxx > 1e-12 * k * scale[0]) & (vyy > 1e-12 * k * scale[1])
        with np.errstate(invalid="ignore", divide="ignore"):
            r = vxy / np.sqrt(vxx * vyy)
        return np.where(ok, np.clip(r, -1.0, 1.0), np.nan)

    return statistic


def _rank_table(values: np.ndarray, owner: np.ndarray, questions: int) -> np.ndarray:
    """[Q, N]: what one copy of question q adds to the average rank of response i in a pooled resample —
    its responses below i's value, plus half of those equal to it (i's own question counts itself)."""
    table = np.zeros((questions, values.size))
    for q in range(questions):
        mine = values[owner == q][:, None]
        table[q] = (mine < values).sum(0) + 0.5 * (mine == values).sum(0)
    return table


def _spearman_statistic(data: Clustered) -> Callable[[np.ndarray], np.ndarray]:
    # A resample's average ranks are linear in how often it drew each question, so ranking costs one product.
    owner = np.nonzero(data.mask)[0]  # the question of each response, in pooled order
    x, y = data.x[data.mask], data.y[data.mask]
    rank_x = _rank_table(x, owner, data.questions)
    rank_y = _rank_table(y, owner, data.questions)

    def statistic(idx: np.ndarray) -> np.ndarray:
        counts = (idx[..., None] == np.arange(data.questions)).sum(-2).astype(np.float64)  # [..., Q]
        # Average rank = (values below) + (values equal, itself included, + 1) / 2, counted with multiplicity.
        rx, ry = counts @ rank_x + 0.5, counts @ rank_y + 0.5
        return _pearson_rows(rx, ry, counts[..., owner])

    return statistic


def cluster_correlation_bootstrap(
    groups: Sequence[tuple[np.ndarray, np.ndarray]],
    kind: Kind,
    resamples: int,
    rng: Seed,
    level: float = 0.95,
) -> BootstrapResult:
    """Percentile interval and two-sided p-value (r = 0) of Pearson r or Spearman ρ over question resamples.

    ``groups``: per question, (metric values, outcomes) of its responses. A resample where r is undefined is
    dropped; fewer than half defined gives no interval (as ``bootstrap_ci``).
    """
    data = Clustered.of(groups)
    if data.questions == 0:
        return dataclasses.replace(percentile_summary(np.zeros(0), resamples, level), resamples=resamples)
    statistic = _pearson_statistic(data) if kind == "pearson" else _spearman_statistic(data)
    width = data.questions * 6 if kind == "pearson" else data.questions * 2 + 4 * int(data.mask.sum())
    draws = resample_questions(statistic, data.questions, resamples, rng, level, width)
    return percentile_summary(draws, resamples, level)


def mean_bootstrap(
    values: Sequence[float | None] | npt.NDArray[np.float64],
    resamples: int,
    rng: Seed,
    level: float = 0.95,
    null: float = 0.0,
) -> BootstrapResult:
    """Percentile interval and p-value (mean = ``null``) of a mean over independent units (e.g. questions)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    if v.size < 2:
        return BootstrapResult(None, None, None, 0, resamples)
    draws = resample_questions(lambda idx: v[idx].mean(-1), v.size, resamples, rng, level)
    return percentile_summary(draws, resamples, level, null)
