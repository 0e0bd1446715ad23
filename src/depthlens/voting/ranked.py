"""A ranked method's vote with the ties at its η cut broken uniformly (docs/definitions.md §5). Pure numpy.

Think@n, Self-Certainty@n, Long@n / Short@n and Think@n within length strata keep the k = ⌈η·n⌉ responses of a draw
with the highest score. When responses of equal score straddle the cut — some of them must be kept, the others
dropped — no order among them is more right than another, so the method's outcome is the expectation over their
orders: every response above the cut is kept, with a uniformly random j of the t tied at it (j = k − those above).
Each of the C(t, j) choices is voted (``subsets.subset_votes``: the same vote, tie rules and first voters as
``methods.tally``) and the votes averaged; where there are more than ``MOST_SUBSETS`` choices (only with many tied
responses at a large n) the mean is over that many uniform ones, seeded, and ``exact`` says so. Each response's
chance of being kept (1 above the cut, j/t tied at it, 0 below) makes the expected cost.

Scores are compared at 12 decimals: prefix DTRs of different windows that are the same ratio (1/3 and 2/6) tie.

Many draws at once: ``scores`` [D, n] per draw position, ``draws`` [D, n] their pool indices (ascending). Draws are
grouped by (t, j), so a group's choices are one array [draws, choices, k].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import numpy as np

from depthlens.voting.subsets import subset_votes, subsets

_BLOCK = 1 << 16  # kept sets voted per call: bounds the [block, k, answers] arrays
LENGTH_STRATA = 4
"""Length strata of a draw for Think@n within length strata (its quartiles; fewer below 8 responses)."""


@dataclasses.dataclass(frozen=True)
class RankedVotes:
    """A ranked method on each of D draws: expectations over the orders of the responses tied at its cut."""

    credit: np.ndarray  # [D] expected credit of the vote (uniform ties at the top: the share right)
    tied: np.ndarray  # [D] expected share of votes tied at the top
    unanswered: np.ndarray  # [D] expected share of votes with no answer
    keep: np.ndarray  # [D, n] each drawn response's chance of being kept
    cut_tied: np.ndarray  # [D] bool: the cut fell inside a tie (some of the tied kept, some dropped)
    orders: np.ndarray  # [D] the choices of tied responses averaged (1 where the cut fell in no tie)
    exact: bool  # every choice averaged in every draw


def ranked_votes(
    answer: np.ndarray,
    correct: np.ndarray,
    tiebreak: np.ndarray,
    draws: np.ndarray,
    scores: np.ndarray,
    k: int,
    rule: Literal["uniform", "summed-dtr"],
    seed: Sequence[int] = (),
) -> RankedVotes:
    """Keep the k highest ``scores`` of each draw, ties at the cut uniformly, and vote.

    ``answer`` [P] (−1: none), ``correct`` [P], ``tiebreak`` [P] (summed-dtr's prefix DTR): per pool response;
    ``draws`` [D, n] pool indices ascending in each row; ``scores`` [D, n] the ranking score of each.
    """
    d, n = draws.shape
    s = np.round(np.asarray(scores, dtype=np.float64), 12)
    kth = np.partition(s, n - k, axis=1)[:, n - k][:, None]  # the k-th largest
    above, tied = s > kth, s == kth
    t = tied.sum(axis=1)
    j = k - above.sum(axis=1)  # ≥ 1: the k-th itself is tied at the cut
    keep = above + tied * (j / t)[:, None]
    credit, share_tied, unanswered = np.zeros(d), np.zeros(d), np.zeros(d)
    orders = np.ones(d, dtype=np.int64)
    exact = True
    group = t * (n + 1) + j  # one group per (t, j)
    for key in np.unique(group):
        tt, jj = divmod(int(key), n + 1)
        rows = np.flatnonzero(group == key)
        choices, every = subsets(tt, jj, [*seed, tt, jj])
        exact &= every
        orders[rows] = len(choices)
        # positions of those above the cut [G, k − j] and of those tied at it [G, t], each ascending (every row of
        # the group has as many: nonzero's row-major order lays them out row by row)
        top = np.nonzero(above[rows])[1].reshape(len(rows), k - jj)
        tie = np.nonzero(tied[rows])[1].reshape(len(rows), tt)
        step = max(1, _BLOCK // len(choices))
        for start in range(0, len(rows), step):
            part = slice(start, start + step)
            g = len(rows[part])
            chosen = tie[part][:, choices]  # [G, C, j]
            fixed = np.broadcast_to(top[part][:, None, :], (g, len(choices), k - jj))
            kept = np.sort(np.concatenate([fixed, chosen], axis=2), axis=2)  # [G, C, k] positions, ascending
            pool = draws[rows[part]][np.arange(g)[:, None, None], kept]  # their pool indices
            votes = _distinct_votes(answer, correct, tiebreak, pool.reshape(-1, k), rule)
            for out, values in zip((credit, share_tied, unanswered), votes, strict=True):
                out[rows[part]] = values.reshape(g, len(choices)).mean(axis=1)
    return RankedVotes(credit, share_tied, unanswered, keep, t > j, orders, exact)


def _distinct_votes(
    answer: np.ndarray,
    correct: np.ndarray,
    tiebreak: np.ndarray,
    kept: np.ndarray,
    rule: Literal["uniform", "summed-dtr"],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``subset_votes`` of every row of ``kept`` [M, k] (ascending pool indices), each distinct set voted once:
    over all draws of a pool the same kept set recurs (12,870 draws of 8 from 16 keep one of C(16, 4) = 1,820)."""
    size, k = len(answer), kept.shape[1]
    if k == 0 or size**k >= 2**62:  # too many sets to number in an int64: vote every row
        votes = subset_votes(answer, correct, tiebreak, kept, rule)
        return votes.credit, votes.tied.astype(np.float64), votes.unanswered.astype(np.float64)
    number = kept @ (size ** np.arange(k, dtype=np.int64))  # a set's number in base ``size``
    _, first, inverse = np.unique(number, return_index=True, return_inverse=True)
    votes = subset_votes(answer, correct, tiebreak, kept[first], rule)
    return (
        votes.credit[inverse],
        votes.tied[inverse].astype(np.float64),
        votes.unanswered[inverse].astype(np.float64),
    )


def strata_scores(dtr: np.ndarray, length: np.ndarray, strata: int = LENGTH_STRATA) -> np.ndarray:
    """Think@n within length strata's score of each drawn response, [D, n]: its prefix DTR's percentile among the
    draw's responses in its length stratum.

    A draw's strata are cut at its length quantiles (``min(strata, n // 2)`` strata, at least one; numpy's linear
    quantiles), a response in stratum s when s of the cuts lie below its length — so equal lengths always share one.
    Within a stratum of m responses the score is (rank − ½) / m, rank the average rank of its prefix DTR (1 the
    lowest, ties sharing theirs): strata of every size score on one scale, and the top of each stratum comes first.
    """
    dtr, length = np.asarray(dtr, dtype=np.float64), np.asarray(length, dtype=np.float64)
    parts = max(1, min(strata, dtr.shape[1] // 2))
    cuts = np.quantile(length, np.arange(1, parts) / parts, axis=1)  # [parts − 1, D]
    stratum = (length[None] > cuts[:, :, None]).sum(axis=0)  # [D, n]
    same = stratum[:, :, None] == stratum[:, None, :]  # [D, n, n]
    value = np.round(dtr, 12)
    below = (same & (value[:, None, :] < value[:, :, None])).sum(axis=2)
    equal = (same & (value[:, None, :] == value[:, :, None])).sum(axis=2)  # itself included
    rank = below + (equal + 1) / 2
    return (rank - 0.5) / same.sum(axis=2)
