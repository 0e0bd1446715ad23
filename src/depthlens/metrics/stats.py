"""Correlation statistics for the studies (definitions.md §4), on scipy.stats: Pearson, Spearman and point-biserial r
with their p-values, the paper's binned r, and a question-level (cluster) bootstrap. Pure functions of arrays;
``None`` wherever a statistic is undefined (too few points, a constant input) — never a made-up 0 or a NaN that
would average silently.

The p-values of ``*_test`` are scipy's, which treat every response as an independent observation. Responses to
one question share its difficulty, so the studies' inference resamples questions instead (``cluster_bootstrap``:
percentile interval and the two-sided p-value of "r = 0" read off the same bootstrap distribution).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy import stats


@dataclasses.dataclass(frozen=True)
class CorrelationTest:
    """An r and scipy's two-sided p-value for r = 0 (independent observations assumed)."""

    r: float
    p: float


def _flat(x: torch.Tensor | np.ndarray | Sequence[float]) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).ravel()


def _defined(xs: np.ndarray, ys: np.ndarray) -> bool:
    # A constant input is tested exactly: its float mean can differ from it by rounding.
    return xs.size >= 3 and xs.size == ys.size and np.ptp(xs) > 0 and np.ptp(ys) > 0


def pearson_test(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> CorrelationTest | None:
    """Pearson r and its p-value (``scipy.stats.pearsonr``); None when fewer than 3 points or either is constant."""
    xs, ys = _flat(x), _flat(y)
    if not _defined(xs, ys):
        return None
    result = stats.pearsonr(xs, ys)
    return CorrelationTest(float(np.clip(result.statistic, -1.0, 1.0)), float(result.pvalue))


def spearman_test(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> CorrelationTest | None:
    """Spearman ρ (Pearson r of average ranks) and its p-value (``scipy.stats.spearmanr``); None when undefined.

    δ_TCB is heavy-tailed and DTR/accuracy have ties, so the rank correlation is reported beside Pearson's.
    """
    xs, ys = _flat(x), _flat(y)
    if not _defined(xs, ys):
        return None
    result = stats.spearmanr(xs, ys)
    return CorrelationTest(float(np.clip(result.statistic, -1.0, 1.0)), float(result.pvalue))


def point_biserial_test(metric: np.ndarray, correct: np.ndarray) -> CorrelationTest | None:
    """Point-biserial r between a metric and a 0/1 outcome (``scipy.stats.pointbiserialr``); None when undefined."""
    xs, ys = _flat(metric), _flat(correct)
    if not _defined(xs, ys):
        return None
    result = stats.pointbiserialr(ys, xs)
    return CorrelationTest(float(np.clip(result.statistic, -1.0, 1.0)), float(result.pvalue))


def pearson(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> float | None:
    """Pearson r of two 1-D samples; None when fewer than 3 points or either is constant."""
    test = pearson_test(x, y)
    return None if test is None else test.r


def spearman(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> float | None:
    """Spearman ρ; None when undefined."""
    test = spearman_test(x, y)
    return None if test is None else test.r


def point_biserial(metric: np.ndarray, correct: np.ndarray) -> float | None:
    """Point-biserial r between a metric and a 0/1 outcome (Pearson r with the binary variable)."""
    test = point_biserial_test(metric, correct)
    return None if test is None else test.r


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties sharing their average rank (so binary or integer metrics rank fairly)."""
    return stats.rankdata(_flat(x), method="average")


def quantile_bins(values: np.ndarray, bins: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Indices of ``values`` split into ``bins`` equal-count groups by rank, lowest first.

    Ties are broken at random (by ``rng``): responses with equal metric values (e.g. token counts) would
    otherwise always fall in the same bin by their order in the store. Group sizes differ by at most one.
    """
    values = np.asarray(values, dtype=np.float64)
    order = np.lexsort((rng.random(values.size), values))  # primary key: value; then the random key
    return [part for part in np.array_split(order, bins) if part.size]


def binned_correlation(
    values: np.ndarray, correct: np.ndarray, bins: int, rng: np.random.Generator
) -> float | None:
    """The paper's per-question statistic: Pearson r between bin mean metric and bin accuracy over ``bins``
    quantile bins; None when there are fewer responses than bins or the bin means are constant."""
    values = np.asarray(values, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if values.size < bins or bins < 3:
        return None
    groups = quantile_bins(values, bins, rng)
    return pearson(
        np.array([values[g].mean() for g in groups]), np.array([correct[g].mean() for g in groups])
    )


# ---------------------------------------------------------------------------------------------------------
# The question-level bootstrap.


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
    the concatenated response indices of one resample (one call per resample; ``cluster_bootstrap`` and the
    correlation statistics below are the vectorized forms).
    """
    if not clusters:
        return None, None

    def per_resample(idx: np.ndarray) -> np.ndarray:
        flat = idx.reshape(-1, idx.shape[-1])
        out = np.array([_nan(statistic(np.concatenate([clusters[i] for i in row]))) for row in flat])
        return out.reshape(idx.shape[:-1])

    summary = percentile_summary(resample_questions(per_resample, len(clusters), resamples, rng, level),
                                 resamples, level)  # fmt: skip
    return summary.low, summary.high


def _nan(value: float | None) -> float:
    return np.nan if value is None else float(value)
