"""Correlation statistics for the studies (definitions.md §4), on scipy.stats: Pearson, Spearman and point-biserial r
with their p-values, and the paper's binned r. Pure functions of arrays (a CPU tensor is read as one);
``None`` wherever a statistic is undefined (too few points, a constant input) — never a made-up 0 or a NaN that
would average silently.

The p-values of ``*_test`` are scipy's, which treat every response as an independent observation. Responses to
one question share its difficulty, so the studies' inference resamples questions instead (``stats.resampling``:
percentile interval and the two-sided p-value of "r = 0" read off the same bootstrap distribution), and the
within-question statistics below centre each question's responses on their own mean, so that only how responses
to one question differ is correlated, and test it by shuffling correctness within questions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats


@dataclasses.dataclass(frozen=True)
class CorrelationTest:
    """An r and scipy's two-sided p-value for r = 0 (independent observations assumed)."""

    r: float
    p: float


def _flat(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).ravel()


def _defined(xs: np.ndarray, ys: np.ndarray) -> bool:
    # A constant input is tested exactly: its float mean can differ from it by rounding.
    return xs.size >= 3 and xs.size == ys.size and np.ptp(xs) > 0 and np.ptp(ys) > 0


def pearson_test(x: ArrayLike, y: ArrayLike) -> CorrelationTest | None:
    """Pearson r and its p-value (``scipy.stats.pearsonr``); None when fewer than 3 points or either is constant."""
    xs, ys = _flat(x), _flat(y)
    if not _defined(xs, ys):
        return None
    result = stats.pearsonr(xs, ys)
    return CorrelationTest(float(np.clip(result.statistic, -1.0, 1.0)), float(result.pvalue))


def spearman_test(x: ArrayLike, y: ArrayLike) -> CorrelationTest | None:
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


def pearson(x: ArrayLike, y: ArrayLike) -> float | None:
    """Pearson r of two 1-D samples; None when fewer than 3 points or either is constant."""
    test = pearson_test(x, y)
    return None if test is None else test.r


def spearman(x: ArrayLike, y: ArrayLike) -> float | None:
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
# Within-question statistics: only how responses to the same question differ, never how questions differ.


@dataclasses.dataclass(frozen=True)
class WithinQuestion:
    """A question-centred r, its within-question permutation p, and the questions and responses it used."""

    r: float | None
    p: float | None
    questions: int
    responses: int


def _centred(
    xs: Sequence[ArrayLike], ys: Sequence[ArrayLike]
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per question with variance in both: x centred, y centred and y as given (the permutation's labels)."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} groups of x but {len(ys)} of y: give one pair of arrays per question")
    out: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [])
    for x, y in zip(xs, ys, strict=True):
        x, y = _flat(x), _flat(y)
        if x.size != y.size:
            raise ValueError(
                f"a question has {x.size} x values but {y.size} y values: pair them per response"
            )
        # A question constant in either says nothing about how its responses differ; kept, it would only
        # add zeros to one side's variance and shrink r towards 0.
        if x.size >= 2 and np.ptp(x) > 0 and np.ptp(y) > 0:
            out[0].append(x - x.mean())
            out[1].append(y - y.mean())
            out[2].append(y)
    return out


def within_question_r(xs: Sequence[ArrayLike], ys: Sequence[ArrayLike]) -> WithinQuestion:
    """Pearson r over all responses after centring x and y within each question (the question-centred, or
    fixed-effects, correlation), over the questions where both vary; no permutation p (``p`` is None).

    With a 0/1 y it is the question-centred point-biserial r. Pooled r mixes the between-question association
    (hard questions: long and wrong) with the within-question one this keeps.
    """
    xc, yc, _ = _centred(xs, ys)
    n = sum(x.size for x in xc)
    if not xc:
        return WithinQuestion(None, None, 0, 0)
    x, y = np.concatenate(xc), np.concatenate(yc)
    r = float(np.clip(x @ y / np.sqrt((x @ x) * (y @ y)), -1.0, 1.0)) if n >= 3 else None
    return WithinQuestion(r, None, len(xc), n)


def within_question_permutation(
    metric: Sequence[ArrayLike], correct: Sequence[ArrayLike], permutations: int, rng: np.random.Generator
) -> WithinQuestion:
    """The question-centred r of a metric with correctness and its two-sided permutation p: correctness labels
    are shuffled within each question (each question keeps its accuracy), p = (1 + #{|r*| ≥ |r|}) / (1 + B).

    Within a question the centred metric is fixed and the labels' mean and spread are too, so r* is a fixed
    multiple of Σ x_c·y*: only that sum is recomputed, for all B permutations at once.
    """
    xc, _, labels = _centred(metric, correct)
    result = within_question_r(metric, correct)
    if result.r is None or permutations < 1:
        return result
    observed = sum(float(x @ y) for x, y in zip(xc, labels, strict=True))
    null = np.zeros(permutations)
    for x, y in zip(xc, labels, strict=True):
        order = np.argsort(rng.random((permutations, y.size)), axis=1)  # one shuffle per row
        null += y[order] @ x
    # Equal sums can differ in their last bits by summation order: count them as ties, not as smaller.
    extreme = np.abs(null) >= abs(observed) - 1e-9 * max(1.0, abs(observed))
    p = (1.0 + float(extreme.sum())) / (1.0 + permutations)
    return dataclasses.replace(result, p=p)
