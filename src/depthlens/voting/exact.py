"""Every method's exact expectation over all draws of n from each question's pool (docs/definitions.md §5). Pure numpy.

The trials (``voting.trials``) re-draw n from a question's pool ten times: their mean carries draw noise (a point or
so of accuracy at n = 8 of 16), and their spread is what a reader needs to see how much one draw moves a method.
The number a method stands for on a question is the expectation over every draw: here it is computed exactly,
over all C(pool, n) draws where there are at most ``MOST_DRAWS`` (C(16, 8) = 12,870), else over ``SAMPLED_DRAWS``
uniform draws seeded per question (the count stated: ``draws``, ``every``). Each draw is voted as the trials vote
it, all draws of a question at once as arrays:

- Mean@n, Cons@n: the draw's mean grade, its plain majority (``subsets.subset_votes``);
- random@n: over all draws, a uniform ⌈η·n⌉-subset of a uniform draw is a uniform ⌈η·n⌉-subset of the pool, so its
  expectation is the mean vote over the pool's subsets — every one where there are at most ``MOST_DRAWS``
  (C(16, 4) = 1,820), else ``SAMPLED_DRAWS`` seeded (``subsets``); its cost over the draws;
- the ranked methods (``methods.RANKINGS``): each draw's cut with its ties uniform (``ranked.ranked_votes``);
- DeepConf's: each draw's filter and weighted vote (``deepconf.deepconf_draws``).

Per question: accuracy, cost (exact and the paper's formula), the share of draws whose vote tied at the top, of
those with no answer, and (ranked methods) of those whose η cut fell inside a tie of the ranking score.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from depthlens.config import VotingConfig
from depthlens.errors import InputError
from depthlens.voting.deepconf import DEEPCONF_FILTERS, TRACE_SCORES, deepconf_draws, trace_confidence
from depthlens.voting.methods import METHODS, RANKINGS, ranked_cost
from depthlens.voting.ranked import ranked_votes
from depthlens.voting.responses import Response, draw_arrays, kept_count
from depthlens.voting.subsets import subset_votes, subsets

MOST_DRAWS = 100_000
"""Draws of n per question (and random@n's subsets of the pool) enumerated at most: beyond, ``SAMPLED_DRAWS``."""
SAMPLED_DRAWS = 10_000
"""Uniform draws (or subsets) per question, seeded, where there are more than ``MOST_DRAWS``."""
_DEEPCONF = {
    f"deepconf-{prefix}{kind}@n": (kind, keep)
    for prefix, keep in DEEPCONF_FILTERS.items()
    for kind in TRACE_SCORES
}
FIELDS = ("accuracy", "cost", "cost_paper", "tied", "unanswered", "cut_tied")
"""Per method and question: accuracy; exact cost and the paper's formula (tokens); the shares of draws whose vote
tied at the top, that had no answer, and whose η cut fell inside a tie of the ranking score (ranked methods)."""


@dataclasses.dataclass(frozen=True, eq=False)  # identity equality: fields are arrays
class ExactOutcomes:
    """Every method's expectation over the draws of each question: arrays [questions] per method and field."""

    questions: tuple[str, ...]
    values: dict[str, dict[str, np.ndarray]]  # field (``FIELDS``) → method → [Q]
    draws: np.ndarray  # [Q] draws of n averaged over per question
    every: np.ndarray  # [Q] bool: all C(pool, n) of them
    subsets: dict[
        str, tuple[int, bool]
    ]  # random@n: (the most pool subsets averaged per question, all of them)

    @property
    def accuracy(self) -> dict[str, np.ndarray]:
        return self.values["accuracy"]

    def methods(self) -> list[str]:
        return list(self.accuracy)


def _draws(size: int, n: int, seed: Sequence[int]) -> tuple[np.ndarray, bool]:
    return subsets(size, n, seed, MOST_DRAWS, SAMPLED_DRAWS)


Per = dict[str, np.ndarray]  # field → [D] per draw (or a scalar expectation)


def _cons(rs: Sequence[Response], cfg: VotingConfig, draws: np.ndarray, length: np.ndarray) -> Per:
    answer, correct, tiebreak = draw_arrays(rs, cfg)
    votes = subset_votes(answer, correct, tiebreak, draws, cfg.tie_break)
    total = length[draws].sum(axis=1)
    return {
        "accuracy": votes.credit,
        "cost": total,
        "cost_paper": total,
        "tied": votes.tied,
        "unanswered": votes.unanswered,
    }


def _mean(rs: Sequence[Response], cfg: VotingConfig, draws: np.ndarray, length: np.ndarray) -> Per:
    correct = np.array([r.correct for r in rs], dtype=np.float64)
    total = length[draws].sum(axis=1)
    return {"accuracy": correct[draws].mean(axis=1), "cost": total, "cost_paper": total}


def _random(
    rs: Sequence[Response], cfg: VotingConfig, draws: np.ndarray, length: np.ndarray, seed: Sequence[int]
) -> tuple[Per, tuple[int, bool]]:
    n, size = draws.shape[1], len(rs)
    k = kept_count(n, cfg.eta)
    answer, correct, tiebreak = draw_arrays(rs, cfg)
    chosen, every = subsets(size, k, seed, MOST_DRAWS, SAMPLED_DRAWS)
    votes = subset_votes(answer, correct, tiebreak, chosen, cfg.tie_break)
    prefix = cfg.rank_prefix
    stop = length if prefix is None else np.minimum(length, prefix)
    drawn, share = length[draws], k / n
    prefix_len = drawn.max(axis=1) if prefix is None else float(prefix)
    per = {
        "accuracy": votes.credit.mean(),
        "cost": (share * drawn + (1 - share) * stop[draws]).sum(axis=1),
        "cost_paper": share * drawn.sum(axis=1) + prefix_len * cfg.eta * n,
        "tied": votes.tied.mean(),
        "unanswered": votes.unanswered.mean(),
    }
    return per, (len(chosen), every)


def _ranked(
    name: str,
    rs: Sequence[Response],
    cfg: VotingConfig,
    draws: np.ndarray,
    length: np.ndarray,
    seed: Sequence[int],
) -> Per:
    ranking = RANKINGS[name]
    answer, correct, tiebreak = draw_arrays(rs, cfg)
    k = kept_count(draws.shape[1], cfg.eta)
    v = ranked_votes(answer, correct, tiebreak, draws, ranking.scores(rs, cfg, draws), k, cfg.tie_break, seed)
    cost, paper = ranked_cost(ranking.cost, v.keep, length[draws], cfg)
    return {
        "accuracy": v.credit,
        "cost": cost,
        "cost_paper": paper,
        "tied": v.tied,
        "unanswered": v.unanswered,
        "cut_tied": v.cut_tied,
    }


def _deepconf(
    name: str, rs: Sequence[Response], cfg: VotingConfig, draws: np.ndarray, length: np.ndarray
) -> Per:
    kind, keep = _DEEPCONF[name]
    answer, correct, _ = draw_arrays(rs, cfg)
    score = np.array(
        [trace_confidence(r.confidence, kind, cfg.deepconf_window) for r in rs], dtype=np.float64
    )
    credit, tied, unanswered = deepconf_draws(answer, correct, score, draws, keep)
    total = length[draws].sum(axis=1)
    return {"accuracy": credit, "cost": total, "cost_paper": total, "tied": tied, "unanswered": unanswered}


def question_expectations(
    rs: Sequence[Response], cfg: VotingConfig, methods: Sequence[str], seed: Sequence[int] = ()
) -> tuple[dict[str, dict[str, float]], int, bool, tuple[int, bool] | None]:
    """One question's expectations: method → field → value, the draws averaged, whether they are all C(pool, n),
    and random@n's subsets of the pool (None when it was not asked)."""
    draws, every = _draws(len(rs), cfg.n, [*seed, 0])
    length = np.array([r.length for r in rs], dtype=np.float64)
    out: dict[str, dict[str, float]] = {}
    random_subsets = None
    for name in methods:
        if name == "random@n":
            per, random_subsets = _random(rs, cfg, draws, length, [*seed, 1])
        elif name in RANKINGS:
            per = _ranked(name, rs, cfg, draws, length, [*seed, 2])
        elif name in _DEEPCONF:
            per = _deepconf(name, rs, cfg, draws, length)
        else:
            per = (_mean if name == "mean@n" else _cons)(rs, cfg, draws, length)
        out[name] = {f: float(np.mean(per[f])) if f in per else 0.0 for f in FIELDS}
    return out, len(draws), every, random_subsets


def exact_outcomes(
    pools: Mapping[str, Sequence[Response]],
    cfg: VotingConfig,
    methods: Sequence[str] | None = None,
    on_question: Callable[[int], None] = lambda n: None,
) -> ExactOutcomes:
    """Every method's expectation over the draws of n from each question's pool (questions sorted, as the trials
    order them; each question seeded by (``cfg.seed``, its place), so a method's figures do not depend on which
    others run); ``on_question`` is told each finished question."""
    names = list(METHODS) if methods is None else list(methods)
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise InputError(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    questions = sorted(pools)
    values = {f: {m: np.zeros(len(questions)) for m in names} for f in FIELDS}
    draws, every = np.zeros(len(questions), dtype=np.int64), np.zeros(len(questions), dtype=bool)
    random_subsets: tuple[int, bool] = (0, True)
    for qi, q in enumerate(questions):
        if len(pools[q]) < cfg.n:
            raise InputError(f"question {q!r} has {len(pools[q])} responses but n = {cfg.n} are drawn")
        per, draws[qi], every[qi], subs = question_expectations(pools[q], cfg, names, [cfg.seed, qi, 7_001])
        for m, fields in per.items():
            for f, value in fields.items():
                values[f][m][qi] = value
        if subs is not None:
            random_subsets = (max(random_subsets[0], subs[0]), random_subsets[1] and subs[1])
        on_question(1)
    subsets_asked = {"random@n": random_subsets} if "random@n" in names else {}
    return ExactOutcomes(tuple(questions), values, draws, every, subsets_asked)


def draw_count(pool: int, n: int) -> tuple[int, bool]:
    """The draws of n from a pool of ``pool`` the expectation averages over, and whether they are all of them."""
    every = math.comb(pool, n)
    return (every, True) if every <= MOST_DRAWS else (SAMPLED_DRAWS, False)
