"""Correlation statistics for the studies (definitions.md §4): Pearson, Spearman, point-biserial, the paper's binned r,
and a cluster bootstrap. Pure functions of arrays; ``None`` wherever a statistic is undefined (too few points,
a constant input) — never a made-up 0 or a NaN that would average silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch


def pearson(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> float | None:
    """Pearson r of two 1-D samples; None when fewer than 3 points or either is constant."""
    xs = np.asarray(x, dtype=np.float64).ravel()
    ys = np.asarray(y, dtype=np.float64).ravel()
    # A constant input is tested exactly: its float mean can differ from it by rounding.
    if xs.size < 3 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return None
    xc, yc = xs - xs.mean(), ys - ys.mean()
    denom = float(np.sqrt((xc * xc).sum() * (yc * yc).sum()))
    return float(np.clip((xc * yc).sum() / denom, -1.0, 1.0))


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties sharing their average rank (so binary or integer metrics rank fairly)."""
    _, inverse, counts = np.unique(np.asarray(x, dtype=np.float64).ravel(), return_inverse=True,
                                   return_counts=True)  # fmt: skip
    first = np.cumsum(counts) - counts + 1  # the rank of each distinct value's first occurrence
    return (first + (counts - 1) / 2.0)[inverse]


def spearman(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> float | None:
    """Spearman ρ: Pearson r of average ranks; None when undefined.

    δ_TCB is heavy-tailed and DTR/accuracy have ties, so the rank correlation is reported beside Pearson's.
    """
    xs, ys = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if xs.size < 3:
        return None
    return pearson(average_ranks(xs), average_ranks(ys))


def point_biserial(metric: np.ndarray, correct: np.ndarray) -> float | None:
    """Point-biserial r between a metric and a 0/1 outcome (Pearson r with the binary variable)."""
    return pearson(np.asarray(metric, dtype=np.float64), np.asarray(correct, dtype=np.float64))


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


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float | None],
    clusters: Sequence[np.ndarray],
    resamples: int,
    rng: np.random.Generator,
    level: float = 0.95,
) -> tuple[float | None, float | None]:
    """Percentile bootstrap CI of ``statistic`` over resampled *clusters* (questions), each an index array.

    Responses to one question share its difficulty, so the question is the unit resampled; resamples where
    the statistic is undefined are dropped, and fewer than half defined gives (None, None).
    """
    if not clusters:
        return None, None
    draws = []
    for _ in range(resamples):
        picks = rng.integers(0, len(clusters), len(clusters))
        value = statistic(np.concatenate([clusters[i] for i in picks]))
        if value is not None:
            draws.append(value)
    if len(draws) < resamples / 2:
        return None, None
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(np.asarray(draws), [tail, 1.0 - tail])
    return float(low), float(high)
