"""random@n's vote on every subset of one draw at once (docs/definitions.md §5). Pure numpy: no model, no I/O.

random@n votes among a uniformly random ⌈η·n⌉ of the n drawn responses; its accuracy on a draw is the expectation
over those subsets. Where there are at most ``MOST_SUBSETS`` of them every one is enumerated (exact); beyond, the
mean is over ``MOST_SUBSETS`` subsets drawn independently and uniformly with a seeded generator. Each subset's vote
is the plain majority of ``methods``, with the same tie rules; it is computed for a block of subsets at a time as
arrays [subsets, k, answers] rather than one Python vote per subset (C(16, 8) = 12,870 per draw).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

MOST_SUBSETS = 10_000
"""Subsets enumerated per draw at most (C(n, k) ≤ this: exact); beyond, this many are sampled."""
_BLOCK = 1024  # subsets voted together: bounds the [block, k, answers] one-hot array


def subsets(
    n: int, k: int, seed: Sequence[int], most: int = MOST_SUBSETS, sampled: int | None = None
) -> tuple[np.ndarray, bool]:
    """The subsets of k of range(n) to average over, [m, k] ascending indices, and whether they are all C(n, k) of
    them: all where there are at most ``most``, else ``sampled`` (default ``most``) drawn independently and
    uniformly from ``np.random.default_rng(seed)``. random@n's subsets of a draw, and (``voting.exact``) the draws
    of n from a pool."""
    if math.comb(n, k) <= most:
        return _every(n, k), True
    rng = np.random.default_rng(list(seed))
    chosen = np.argsort(rng.random((most if sampled is None else sampled, n)), axis=1)[:, :k]  # uniform rows
    return np.sort(chosen, axis=1), False


@functools.lru_cache(maxsize=32)
def _every(n: int, k: int) -> np.ndarray:
    if k == 0:  # one subset, the empty one
        return np.zeros((1, 0), dtype=np.intp)
    flat = itertools.chain.from_iterable(itertools.combinations(range(n), k))
    every = np.fromiter(flat, dtype=np.intp, count=math.comb(n, k) * k).reshape(-1, k)
    every.flags.writeable = False  # shared between calls
    return every


@dataclasses.dataclass(frozen=True)
class SubsetVotes:
    """One vote per subset, [m] each."""

    credit: np.ndarray  # 1/0, or the share of right answers among those tied at the top (``uniform``)
    tied: np.ndarray  # bool: the top of the vote was tied
    unanswered: np.ndarray  # bool: no response of the subset gave an answer


def subset_votes(
    answer: np.ndarray,
    correct: np.ndarray,
    tiebreak: np.ndarray,
    chosen: np.ndarray,
    rule: Literal["uniform", "summed-dtr"],
) -> SubsetVotes:
    """A plain majority in every row of ``chosen`` [m, k] (ascending indices into the draw).

    ``answer`` [n]: each response's answer as an integer (−1: none); ``correct`` [n]: its grade; ``tiebreak`` [n]:
    its prefix DTR (``summed-dtr`` only). As ``methods.tally``: an answer's grade is its first voter's; ``uniform``
    gives a tie at the top the share of right answers among the tied; ``summed-dtr`` gives it to the highest summed
    tie-break, then to the answer given first.
    """
    answers = int(answer.max()) + 1 if answer.size else 0
    parts = [
        _block(answer, correct, tiebreak, chosen[i : i + _BLOCK], answers, rule)
        for i in range(0, len(chosen), _BLOCK)
    ]
    return SubsetVotes(*(np.concatenate([p[j] for p in parts]) for j in range(3)))


def _block(
    answer: np.ndarray,
    correct: np.ndarray,
    tiebreak: np.ndarray,
    chosen: np.ndarray,
    answers: int,
    rule: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m = len(chosen)
    if answers == 0:
        return np.zeros(m), np.zeros(m, dtype=bool), np.ones(m, dtype=bool)
    onehot = answer[chosen][..., None] == np.arange(answers)  # [m, k, answers]
    counts = onehot.sum(axis=1)  # [m, answers]
    top = counts.max(axis=1, keepdims=True)  # [m, 1]
    answered = top[:, 0] > 0
    leaders = (counts == top) & answered[:, None]  # [m, answers]
    # The first voter of each answer (rows ascend, so the first True along k); absent answers are masked above.
    first = np.take_along_axis(chosen, onehot.argmax(axis=1), axis=1)  # [m, answers] response indices
    right = correct[first]  # [m, answers]
    n_leaders = leaders.sum(axis=1)
    if rule == "uniform":
        credit = (leaders & right).sum(axis=1) / np.maximum(n_leaders, 1)
    else:
        summed = np.round((onehot * tiebreak[chosen][..., None]).sum(axis=1), 12)  # [m, answers]
        best = np.where(leaders, summed, -np.inf).max(axis=1, keepdims=True)
        finalists = leaders & (summed == best)
        winner = np.where(finalists, first, len(answer)).argmin(axis=1)  # the one given first
        credit = right[np.arange(m), winner].astype(np.float64)
    return np.where(answered, credit, 0.0), n_leaders > 1, ~answered
