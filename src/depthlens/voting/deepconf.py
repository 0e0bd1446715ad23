"""DeepConf (Fu et al. 2025) offline, as its authors' code votes (docs/definitions.md §5). Pure numpy.

Token confidence C_t = −mean of the top-k log-probabilities (stored per token); a trace's score from its sliding
window group confidences (``TRACE_SCORES``); unanswered traces dropped before scoring; the filter a percentile with
ties kept (``percentile_kept``); a confidence-weighted vote whose tie goes to the answer seen first, whatever
``VotingConfig.tie_break`` says. ``deepconf_method`` votes one draw; ``deepconf_draws`` every draw of many at once
(``voting.exact``), the same rules on arrays.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from depthlens.config import VotingConfig
from depthlens.voting.responses import Outcome, Response, tally, total_length

TRACE_SCORES = ("mean", "tail", "bottom10", "lowest")
"""DeepConf's trace scores: ``mean`` token confidence; ``tail`` (mean of the last window); ``bottom10`` (mean of
the max(1, ⌊0.1·G⌋) lowest of the G sliding-window group confidences); ``lowest`` (the lowest group, their
``min_window``). A trace no longer than the window has one group: its mean."""


def group_confidences(confidence: np.ndarray, window: int) -> np.ndarray:
    """DeepConf's group confidences: the mean over every ``window``-token sliding window (one group, the mean,
    when the trace is shorter)."""
    if len(confidence) <= window:
        return np.array([confidence.mean()])
    sums = np.cumsum(np.concatenate([[0.0], confidence]))
    return (sums[window:] - sums[:-window]) / window


def trace_confidence(confidence: np.ndarray, kind: str, window: int) -> float:
    """DeepConf trace confidence from token confidences (see ``TRACE_SCORES``); −inf for an empty trace."""
    if len(confidence) == 0:
        return -math.inf
    if kind == "mean":
        return float(confidence.mean())
    if kind == "tail":
        return float(confidence[-window:].mean())
    groups = group_confidences(confidence, window)
    if kind == "lowest":
        return float(groups.min())
    lowest = np.sort(groups)[: max(1, len(groups) // 10)]  # their code: int(len · 0.1), at least one
    return float(lowest.mean())


def percentile_kept(scores: Sequence[float], keep: float) -> list[int]:
    """DeepConf's filter: every index whose score ≥ np.percentile(scores, 100·(1 − keep)), ties kept (so 7 of 8
    traces at keep = 0.9, not ⌈0.9·8⌉ = 8)."""
    if not scores:
        return []
    cut = float(np.percentile(scores, 100 * (1 - keep)))
    return [i for i, s in enumerate(scores) if s >= cut]


def deepconf_method(kind: str, keep: float | None) -> Callable[[Sequence[Response], VotingConfig], Outcome]:
    def method(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
        answered = [i for i, r in enumerate(rs) if r.key is not None]  # dropped before scoring, as theirs
        conf = [trace_confidence(rs[i].confidence, kind, cfg.deepconf_window) for i in answered]
        chosen = range(len(answered)) if keep is None else percentile_kept(conf, keep)
        kept = [answered[j] for j in chosen]
        t = tally(
            rs, kept, [conf[j] for j in chosen], [0.0] * len(kept), "first"
        )  # their rule, whatever cfg's
        return Outcome(
            t.credit, total_length(rs), total_length(rs), t.answer, tuple(kept), tied=float(t.tied)
        )

    which = "every answered trace" if keep is None else f"the top {keep:.0%} of answered traces by {kind}"
    method.__doc__ = f"DeepConf (offline, {kind} score): a confidence-weighted vote over {which}."
    return method


DEEPCONF_FILTERS = {"": None, "low-": 0.1, "high-": 0.9}
"""DeepConf's offline variants: no filter (their ``*_weighted``), DeepConf-low (top 10 %), -high (top 90 %)."""


def deepconf_draws(
    answer: np.ndarray, correct: np.ndarray, score: np.ndarray, draws: np.ndarray, keep: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``deepconf_method``'s vote on every row of ``draws`` [D, n] (pool indices, ascending) at once: (credit,
    tied at the top, no answer), [D] each.

    ``answer`` [P] (−1: none), ``correct`` [P] and ``score`` [P] (each trace's confidence, ``trace_confidence``) per
    pool response. The same rules as one draw's: unanswered traces never scored, the filter ``np.percentile`` of
    the answered with ties kept, the weighted vote's tie to the answer whose first kept voter comes first.
    """
    d, n = draws.shape
    given = answer[draws]  # [D, n]
    answered = given >= 0
    value = np.where(answered, score[draws], np.nan)
    if keep is None:
        kept = answered
    else:
        with warnings.catch_warnings():  # a draw with no answered trace keeps none: its percentile is NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            cut = np.nanpercentile(value, 100 * (1 - keep), axis=1, keepdims=True)
        kept = answered & (value >= cut)
    answers = int(answer.max()) + 1 if answer.size else 0
    if answers == 0:
        return np.zeros(d), np.zeros(d, dtype=bool), np.ones(d, dtype=bool)
    onehot = (given[..., None] == np.arange(answers)) & kept[..., None]  # [D, n, A]
    total = np.round(np.where(onehot, value[..., None], 0.0).sum(axis=1), 12)  # [D, A] summed confidence
    present = onehot.any(axis=1)
    top = np.where(present, total, -np.inf).max(axis=1, keepdims=True)
    leaders = present & (total == top)
    first = onehot.argmax(axis=1)  # [D, A] the position of each answer's first kept voter
    winner = np.where(leaders, first, n).min(axis=1)  # the leader seen first: its first voter's position
    rows = np.arange(d)
    voted = present.any(axis=1)
    credit = np.where(voted, correct[draws[rows, np.minimum(winner, n - 1)]], False).astype(np.float64)
    return credit, leaders.sum(axis=1) > 1, ~voted
