"""A metric's association with correctness with response length held fixed, within questions (definitions.md §4).
Pure numpy over per-question arrays.

Longer responses to one question are more often wrong (they wander, and a response cut at the token cap rarely
states an answer), and a depth measure that grows with length then tracks correctness through length alone. Two
statistics hold length fixed:

- **The within-question partial correlation** (``within_question_partial``): the metric and correctness are each
  residualised by least squares on question indicators, the token count and the cut-at-the-cap flag (one slope per
  covariate, shared by all questions), and r is the Pearson r of the two residuals. By Frisch–Waugh–Lovell this is
  computed without the indicator columns: centre everything within its question, then project out the centred
  covariates. Its p comes from shuffling correctness within each question (each question keeps its accuracy; the
  question means are unchanged, so only the projection on the covariates is recomputed per shuffle, for all
  shuffles at once): p = (1 + #{|r*| ≥ |r|}) / (1 + B). Every question counts (one whose responses are all right
  has residuals all the same from the length slope; its permutations change nothing).
- **The length-matched comparison** (``length_matched_auc``): within each question, every pair of a right and a
  wrong response whose token counts differ by at most ``LENGTH_TOLERANCE`` of the longer and that both ended by
  themselves or were both cut at the cap; the AUC is the share of pairs in which the right response has the higher
  metric (ties count one half): 0.5 is no signal. Its interval and p (against 0.5) resample questions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from depthlens.stats.resampling import Seed, percentile_summary, resample_questions

LENGTH_TOLERANCE = 0.1
"""Two responses are of similar length when their token counts differ by at most this share of the longer."""


@dataclasses.dataclass(frozen=True)
class PartialWithin:
    """The within-question partial r of a metric with correctness (covariates held fixed) and its permutation p."""

    r: float | None
    p: float | None
    questions: int
    responses: int


def _stack(groups: Sequence[ArrayLike]) -> tuple[np.ndarray, np.ndarray]:
    """The groups' values end to end, and where each group starts (groups laid out contiguously)."""
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    sizes = np.array([len(a) for a in arrays], dtype=np.intp)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
    return (np.concatenate(arrays) if arrays else np.zeros(0)), starts


def _centre(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``values`` [..., N] (groups contiguous from ``starts``, none empty) minus their group's mean, along the last
    axis."""
    sizes = np.diff(np.append(starts, values.shape[-1]))
    means = np.add.reduceat(values, starts, axis=-1) / sizes
    return values - np.repeat(means, sizes, axis=-1)


def within_question_partial(
    metric: Sequence[Sequence[float] | np.ndarray],
    correct: Sequence[Sequence[float] | np.ndarray],
    covariates: Sequence[ArrayLike],
    permutations: int,
    rng: np.random.Generator,
) -> PartialWithin:
    """The Pearson r of the metric's and correctness's residuals after least squares on question indicators and the
    ``covariates`` (per question [n_q, c]: token count, cut flag), with its within-question permutation p."""
    kept = [i for i, m in enumerate(metric) if len(m)]  # a question without responses has nothing to centre
    x, starts = _stack([metric[i] for i in kept])
    y, _ = _stack([correct[i] for i in kept])
    z = np.concatenate(
        [np.asarray(covariates[i], dtype=np.float64).reshape(len(metric[i]), -1) for i in kept]
    )
    if x.size < 3:
        return PartialWithin(None, None, len(kept), int(x.size))
    zc = _centre(z.T, starts).T  # [N, c] the covariates centred within question
    hat = np.linalg.pinv(zc)  # [c, N]: the projection on them is zc @ hat

    def residual(v: np.ndarray) -> np.ndarray:  # [..., N] centred within question, covariates projected out
        centred = _centre(v, starts)
        return centred - (centred @ hat.T) @ zc.T

    ex, ey = residual(x), residual(y)
    scale = float(np.sqrt((ex @ ex) * (ey @ ey)))
    groups = len(kept)
    if scale <= 1e-12 * max(1.0, float(x @ x)):
        return PartialWithin(None, None, groups, int(x.size))
    r = float(np.clip(ex @ ey / scale, -1.0, 1.0))
    if permutations < 1:
        return PartialWithin(r, None, groups, int(x.size))
    shuffled = np.empty((permutations, y.size))
    for start, stop in zip(starts, np.append(starts[1:], y.size), strict=True):  # within each question
        order = np.argsort(rng.random((permutations, stop - start)), axis=1)
        shuffled[:, start:stop] = y[start:stop][order]
    ey_null = residual(shuffled)  # [B, N]
    null = (ey_null @ ex) / np.sqrt((ex @ ex) * np.maximum((ey_null * ey_null).sum(axis=1), 1e-300))
    extreme = np.abs(null) >= abs(r) - 1e-9 * max(1.0, abs(r))  # equal up to summation order: a tie
    return PartialWithin(r, (1.0 + float(extreme.sum())) / (1.0 + permutations), groups, int(x.size))


@dataclasses.dataclass(frozen=True)
class MatchedAUC:
    """Right against wrong responses of similar length within questions: the AUC of the metric over such pairs."""

    auc: float | None
    low: float | None  # 95 % interval over resampled questions
    high: float | None
    p: float | None  # bootstrap p of AUC = 0.5
    pairs: int
    questions: int  # questions with at least one pair


def length_matched_auc(
    metric: Sequence[ArrayLike],
    correct: Sequence[ArrayLike],
    lengths: Sequence[ArrayLike],
    cut: Sequence[ArrayLike],
    resamples: int,
    rng: Seed,
    tolerance: float = LENGTH_TOLERANCE,
) -> MatchedAUC:
    """The AUC of ``metric`` over the pairs of a right and a wrong response to one question of similar length (token
    counts within ``tolerance`` of the longer) and the same ending (both cut at the cap, or neither)."""
    wins, pairs = [], []
    for x, c, n, k in zip(metric, correct, lengths, cut, strict=True):
        x, c, n, k = (np.asarray(a, dtype=np.float64) for a in (x, c, n, k))
        right, wrong = c > 0.5, c < 0.5
        similar = np.abs(n[right][:, None] - n[wrong][None, :]) <= tolerance * np.maximum(
            n[right][:, None], n[wrong][None, :]
        )
        matched = similar & (k[right][:, None] == k[wrong][None, :])
        diff = x[right][:, None] - x[wrong][None, :]
        wins.append(float(((diff > 0) + 0.5 * (diff == 0))[matched].sum()))
        pairs.append(int(matched.sum()))
    w, p = np.array(wins), np.array(pairs, dtype=np.float64)
    total = int(p.sum())
    if total == 0:
        return MatchedAUC(None, None, None, None, 0, 0)

    def statistic(idx: np.ndarray) -> np.ndarray:
        count = p[idx].sum(axis=-1)
        return np.where(count > 0, w[idx].sum(axis=-1) / np.maximum(count, 1), np.nan)

    summary = percentile_summary(resample_questions(statistic, len(p), resamples, rng), resamples, null=0.5)
    return MatchedAUC(float(w.sum() / total), summary.low, summary.high, summary.p, total, int((p > 0).sum()))
