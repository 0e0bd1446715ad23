"""What voting reads of a response, what a method makes of a draw, and the vote itself (docs/definitions.md §5). Pure.

``Response`` is one sampled response as voting sees it; ``Outcome`` one method on one draw; ``tally`` the weighted
majority with its tie rules (``VotingConfig.tie_break`` for every method but DeepConf's, which keeps its authors'
``first``); ``draw_arrays`` the same responses as the integer arrays the vectorised votes read (``voting.subsets``,
``voting.ranked``, ``voting.exact``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from depthlens.config import TieBreak, VotingConfig
from depthlens.errors import InputError, named


@dataclasses.dataclass(frozen=True)
class Response:
    """What voting needs of one sampled response.

    Attributes:
        key: the vote key of its extracted answer (``answers.vote_key``); None when it gave none.
        correct: whether that answer was graded right.
        length: generated tokens, |S|.
        deep: [R] deep-thinking flags of its first R generated tokens (R = the readout window, ≤ length).
        self_certainty, confidence: [length] per-token self-certainty and DeepConf confidence.
    """

    key: str | None
    correct: bool
    length: int
    deep: np.ndarray
    self_certainty: np.ndarray
    confidence: np.ndarray

    def prefix_dtr(self, prefix: int | None) -> float:
        """DTR over the first ``prefix`` generated tokens (all when None or longer than the response)."""
        window = self.length if prefix is None else min(prefix, self.length)
        if len(self.deep) < window:
            raise InputError(
                f"the DTR of a {window}-token prefix needs the readout of {window} tokens, but this store read "
                f"out only {len(self.deep)}; regenerate with {named('readout_tokens')} {prefix or 'all'} or a "
                f"shorter {named('rank_prefix')}"
            )
        return float(self.deep[:window].mean()) if window else 0.0

    def prefix_self_certainty(self, prefix: int | None) -> float:
        window = self.self_certainty if prefix is None else self.self_certainty[:prefix]
        return float(window.mean()) if len(window) else -math.inf


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One method on one draw: accuracy and cost in generated tokens.

    Accuracy is 1/0, or a fraction: Mean@n's mean, a tie scored ``uniform``, random@n's expectation over subsets, a
    ranked method's expectation over the orders of the responses tied at its η cut (``voting.ranked``). ``kept`` and
    ``answer`` are then one of those orders — the earlier of tied responses kept —, what deployed Think@n resumes.
    """

    accuracy: float
    cost: float  # exact generated tokens (random@n: their expectation)
    cost_paper: float  # the paper's printed formula
    answer: (
        str | None
    )  # the winning vote key (a uniform tie: the first given of the tied); None: no answer (wrong)
    kept: tuple[int, ...]  # indices of the responses the method kept (random@n: none in particular)
    voted: bool = True  # False for Mean@n, which averages instead of voting
    tied: float = 0.0  # 1 when the top of the vote was tied (random@n: the share of its subsets' votes)
    unanswered: float | None = None  # random@n: the share of its subsets with no answer; else from ``answer``
    subsets: int = 0  # random@n: the subsets averaged over; 0 for the other methods
    cut_tied: float = 0.0  # ranked methods: 1 when the η cut fell inside a tie of the ranking score
    orders: int = 1  # ranked methods: the choices of the responses tied at the cut averaged over

    @property
    def no_answer(self) -> float:
        """1 when the vote had no answer (random@n: the expected share), 0 otherwise and for Mean@n."""
        if self.unanswered is not None:
            return self.unanswered
        return float(self.answer is None and self.voted)


@dataclasses.dataclass(frozen=True)
class Tally:
    """A vote's result: the answer, the credit it earns (1/0, or a share for a tie under ``uniform``), and
    whether the top was tied."""

    answer: str | None
    credit: float
    tied: bool


def tally(
    responses: Sequence[Response],
    kept: Sequence[int],
    weights: Sequence[float],
    tiebreak: Sequence[float],
    rule: TieBreak | Literal["first"],
) -> Tally:
    """Weighted majority over the kept responses' answer keys; a tie at the top under ``rule`` (``TieBreak``'s, or
    ``first``: the answer given first, DeepConf's). An answer's grade is its first voter's."""
    score: dict[str, float] = {}
    tie: dict[str, float] = {}
    first: dict[str, int] = {}
    for i, w, t in zip(kept, weights, tiebreak, strict=True):
        key = responses[i].key
        if key is None:
            continue
        score[key] = score.get(key, 0.0) + w
        tie[key] = tie.get(key, 0.0) + t
        first.setdefault(key, i)
    if not score:
        return Tally(None, 0.0, False)
    top = max(round(v, 12) for v in score.values())
    leaders = sorted((k for k in score if round(score[k], 12) == top), key=first.__getitem__)
    if rule == "uniform":
        right = sum(responses[first[k]].correct for k in leaders)
        return Tally(leaders[0], right / len(leaders), len(leaders) > 1)
    best = leaders[0] if rule == "first" else max(leaders, key=lambda k: (round(tie[k], 12), -first[k]))
    return Tally(best, float(responses[first[best]].correct), len(leaders) > 1)


def vote(
    responses: Sequence[Response], kept: Sequence[int], weights: Sequence[float], tiebreak: Sequence[float]
) -> tuple[str | None, int | None]:
    """Weighted majority, a tie to the highest summed ``tiebreak`` then the first given → (winning key, index of
    its first voter): the ``summed-dtr`` rule, as online voting uses it."""
    key = tally(responses, kept, weights, tiebreak, "summed-dtr").answer
    return key, (None if key is None else next(i for i in kept if responses[i].key == key))


def draw_arrays(rs: Sequence[Response], cfg: VotingConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A pool's (or draw's) answers as integers (−1: none; one per vote key, in order of first appearance), grades
    and ``summed-dtr`` tie-break values: what the array votes (``voting.subsets``, ``voting.ranked``) read."""
    keys: dict[str, int] = {}
    answer = np.array([-1 if r.key is None else keys.setdefault(r.key, len(keys)) for r in rs], dtype=np.intp)
    correct = np.array([r.correct for r in rs], dtype=bool)
    return answer, correct, np.asarray(tiebreak_values(rs, range(len(rs)), cfg), dtype=np.float64)


def tiebreak_values(responses: Sequence[Response], kept: Sequence[int], cfg: VotingConfig) -> list[float]:
    """The ``summed-dtr`` tie-break values: prefix DTR on whatever prefix was read out (never an error: methods
    that do not rank by DTR need none); unused, and not computed, under ``uniform``."""
    if cfg.tie_break != "summed-dtr":
        return [0.0] * len(kept)
    prefix = cfg.rank_prefix
    return [float(responses[i].deep[:prefix].mean()) if len(responses[i].deep) else 0.0 for i in kept]


def total_length(responses: Sequence[Response]) -> int:
    return sum(r.length for r in responses)


def kept_count(n: int, eta: float) -> int:
    return max(1, math.ceil(round(eta * n, 9)))
