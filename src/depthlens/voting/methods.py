"""Think@n and its comparators over one draw of n scored responses (docs/definitions.md §5). Pure: no model, no I/O.

Every method is a row of ``METHODS``: which responses it keeps (a ranking, a random subset, or all), how their votes
are weighted, and what the selection costs in generated tokens — the exact count, and the paper's printed formula
beside it. random@n is the control for Think@n: its vote size (⌈η·n⌉) without its ranking.

Tie rule (``VotingConfig.tie_break``) for every method but DeepConf's: ``uniform`` (the default) scores a vote tied
at the top as the share of right answers among the tied — the exact expectation of a uniform pick, so no baseline
leans on DTR; ``summed-dtr`` gives it to the answer with the highest summed prefix DTR among its voters, then to
the answer first given (lowest response index). An answer's grade is its first voter's. Responses with no
extractable answer do not vote; if no kept response has one, the method answers nothing and is wrong (counted as
``no_answer`` in the trials' summary). The DeepConf rows follow their authors' code instead (docs/definitions.md
§5): unanswered traces are dropped before scoring, the filter is a percentile with ties kept, and a tied weighted
vote goes to the answer seen first, whatever ``tie_break`` says.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from depthlens.config import TieBreak, VotingConfig
from depthlens.errors import InputError, named
from depthlens.voting.subsets import subset_votes, subsets


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

    Accuracy is 1/0, or a fraction: Mean@n's mean, a tie scored ``uniform``, random@n's expectation over subsets.
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


def _top(values: Sequence[float], k: int) -> list[int]:
    """Indices of the k largest values; equal values keep the earlier response."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    return sorted(order[:k])


def _tiebreak(responses: Sequence[Response], kept: Sequence[int], cfg: VotingConfig) -> list[float]:
    """The ``summed-dtr`` tie-break values: prefix DTR on whatever prefix was read out (never an error: methods
    that do not rank by DTR need none); unused, and not computed, under ``uniform``."""
    if cfg.tie_break != "summed-dtr":
        return [0.0] * len(kept)
    prefix = cfg.rank_prefix
    return [float(responses[i].deep[:prefix].mean()) if len(responses[i].deep) else 0.0 for i in kept]


def _outcome(
    responses: Sequence[Response],
    kept: list[int],
    weights: Sequence[float],
    cost: float,
    cost_paper: float,
    cfg: VotingConfig,
) -> Outcome:
    t = tally(responses, kept, weights, _tiebreak(responses, kept, cfg), cfg.tie_break)
    return Outcome(t.credit, cost, cost_paper, t.answer, tuple(kept), tied=float(t.tied))


def _total(responses: Sequence[Response]) -> int:
    return sum(r.length for r in responses)


def _kept_count(n: int, eta: float) -> int:
    return max(1, math.ceil(round(eta * n, 9)))


def mean_at_n(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
    """Mean@n = Pass@1: the mean accuracy of the n responses."""
    return Outcome(
        float(np.mean([r.correct for r in rs])),
        _total(rs),
        _total(rs),
        None,
        tuple(range(len(rs))),
        voted=False,
    )


def cons_at_n(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
    """Cons@n: plain majority over all n."""
    kept = list(range(len(rs)))
    return _outcome(rs, kept, [1.0] * len(rs), _total(rs), _total(rs), cfg)


def _prefix_ranked(rs: Sequence[Response], cfg: VotingConfig, ranking: list[float]) -> Outcome:
    """Keep the top η·n by a prefix score; the rest stop after ℓ_prefix tokens."""
    k = _kept_count(len(rs), cfg.eta)
    kept = _top(ranking, k)
    rejected = [i for i in range(len(rs)) if i not in kept]
    prefix = cfg.rank_prefix
    stop = (lambda r: r.length) if prefix is None else (lambda r: min(r.length, prefix))
    cost = sum(rs[i].length for i in kept) + sum(stop(rs[i]) for i in rejected)
    prefix_len = max(r.length for r in rs) if prefix is None else prefix
    paper = sum(rs[i].length for i in kept) + prefix_len * cfg.eta * len(rs)
    return _outcome(rs, kept, [1.0] * k, cost, paper, cfg)


def think_at_n(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
    """Think@n: keep the η·n highest prefix DTRs, vote among them."""
    return _prefix_ranked(rs, cfg, [r.prefix_dtr(cfg.rank_prefix) for r in rs])


def self_certainty_at_n(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
    """Self-Certainty@n: as Think@n, ranked by the prefix's mean self-certainty."""
    return _prefix_ranked(rs, cfg, [r.prefix_self_certainty(cfg.rank_prefix) for r in rs])


def random_at_n(rs: Sequence[Response], cfg: VotingConfig, draw: Sequence[int] = ()) -> Outcome:
    """random@n, Think@n's control: a plain majority over a uniformly random ⌈η·n⌉ of the n — Think@n's vote size
    without its DTR ranking.

    Accuracy, ties and the no-answer share are expectations over the subsets (``voting.subsets``): exact over all
    C(n, k) where there are at most 10⁴, else the mean over 10⁴ uniform ones seeded by (``cfg.seed``, ``draw``) —
    the trial and question, so each draw samples its own; ``subsets`` says how many. Cost mirrors Think@n's
    two-phase protocol with a random ranking (prefixes for all n, the kept finished, the rest stopped at ℓ_prefix):
    each response is kept with chance k/n, so its expectation is Σ k/n·|S_i| + (1 − k/n)·min(|S_i|, ℓ), and the
    paper's formula (k/n)·Σ|S_i| + ℓ·η·n. Both exact, whichever subsets were averaged.
    """
    n = len(rs)
    k = _kept_count(n, cfg.eta)
    keys: dict[str, int] = {}
    answer = np.array([-1 if r.key is None else keys.setdefault(r.key, len(keys)) for r in rs], dtype=np.intp)
    correct = np.array([r.correct for r in rs], dtype=bool)
    tiebreak = np.asarray(_tiebreak(rs, range(n), cfg), dtype=np.float64)
    chosen, _ = subsets(n, k, [cfg.seed, n, k, *draw])
    votes = subset_votes(answer, correct, tiebreak, chosen, cfg.tie_break)
    share = k / n
    stop = (lambda r: r.length) if cfg.rank_prefix is None else (lambda r: min(r.length, cfg.rank_prefix))
    cost = sum(share * r.length + (1 - share) * stop(r) for r in rs)
    prefix_len = max(r.length for r in rs) if cfg.rank_prefix is None else cfg.rank_prefix
    return Outcome(
        float(votes.credit.mean()),
        cost,
        share * _total(rs) + prefix_len * cfg.eta * n,
        None,
        (),
        tied=float(votes.tied.mean()),
        unanswered=float(votes.unanswered.mean()),
        subsets=len(chosen),
    )


def long_at_n(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
    """Long@n: vote among the η·n longest (all n must finish to know which)."""
    k = _kept_count(len(rs), cfg.eta)
    kept = _top([float(r.length) for r in rs], k)
    return _outcome(rs, kept, [1.0] * k, _total(rs), _total(rs), cfg)


def short_at_n(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
    """Short@n: vote among the η·n shortest; the others stop once the longest kept one has finished."""
    k = _kept_count(len(rs), cfg.eta)
    kept = _top([-float(r.length) for r in rs], k)
    longest = max(rs[i].length for i in kept)
    cost = sum(rs[i].length if i in kept else min(rs[i].length, longest) for i in range(len(rs)))
    paper = sum(rs[i].length for i in kept) + longest * cfg.eta * len(rs)
    return _outcome(rs, kept, [1.0] * k, cost, paper, cfg)


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


def _deepconf(kind: str, keep: float | None) -> Callable[[Sequence[Response], VotingConfig], Outcome]:
    def method(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
        answered = [i for i, r in enumerate(rs) if r.key is not None]  # dropped before scoring, as theirs
        conf = [trace_confidence(rs[i].confidence, kind, cfg.deepconf_window) for i in answered]
        chosen = range(len(answered)) if keep is None else percentile_kept(conf, keep)
        kept = [answered[j] for j in chosen]
        t = tally(
            rs, kept, [conf[j] for j in chosen], [0.0] * len(kept), "first"
        )  # their rule, whatever cfg's
        return Outcome(t.credit, _total(rs), _total(rs), t.answer, tuple(kept), tied=float(t.tied))

    which = "every answered trace" if keep is None else f"the top {keep:.0%} of answered traces by {kind}"
    method.__doc__ = f"DeepConf (offline, {kind} score): a confidence-weighted vote over {which}."
    return method


DEEPCONF_FILTERS = {"": None, "low-": 0.1, "high-": 0.9}
"""DeepConf's offline variants: no filter (their ``*_weighted``), DeepConf-low (top 10 %), -high (top 90 %)."""

METHODS: dict[str, Callable[[Sequence[Response], VotingConfig], Outcome]] = {
    "mean@n": mean_at_n,
    "cons@n": cons_at_n,
    "think@n": think_at_n,
    "random@n": random_at_n,
    "self-certainty@n": self_certainty_at_n,
    "long@n": long_at_n,
    "short@n": short_at_n,
    **{
        f"deepconf-{prefix}{kind}@n": _deepconf(kind, keep)
        for prefix, keep in DEEPCONF_FILTERS.items()
        for kind in TRACE_SCORES
    },
}

PAPER_METHODS = ("think@n", "cons@n", "random@n", "mean@n", "long@n", "short@n", "self-certainty@n")
"""The deep-thinking paper's Table 2 rows with random@n, Think@n's control, after Think@n and Cons@n: shown first in
this order (``thinkn``'s table, the explorer's); DeepConf's variants follow."""

DRAW_SEEDED = frozenset({"random@n"})
"""Methods that take the draw's (trial, question) as ``draw=``, to seed what they sample."""


def in_order(methods: Sequence[str]) -> list[str]:
    """``methods`` with the paper's first (in ``PAPER_METHODS``' order), the rest as they came."""
    first = [m for m in PAPER_METHODS if m in methods]
    return first + [m for m in methods if m not in first]
