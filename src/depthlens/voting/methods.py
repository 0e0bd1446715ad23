"""Think@n and its comparators over one draw of n scored responses (docs/definitions.md §5). Pure: no model, no I/O.

Every method is a row of ``METHODS``: which responses it keeps (a ranking, a random subset, or all), how their votes
are weighted, and what the selection costs in generated tokens — the exact count, and the paper's printed formula
beside it. random@n is the control for Think@n: its vote size (⌈η·n⌉) without its ranking. The ranked methods
(``RANKINGS``: Think@n, Self-Certainty@n, Long@n, Short@n, Think@n within length strata) keep the ⌈η·n⌉ best-scored,
a tie at that cut counted as the expectation over the tied responses' orders (``voting.ranked``); the same rows vote
every draw of a pool at once in ``voting.exact``.

Tie rule (``VotingConfig.tie_break``) for every method but DeepConf's: ``uniform`` (the default) scores a vote tied
at the top as the share of right answers among the tied — the exact expectation of a uniform pick, so no baseline
leans on DTR; ``summed-dtr`` gives it to the answer with the highest summed prefix DTR among its voters, then to
the answer first given (lowest response index). An answer's grade is its first voter's. Responses with no
extractable answer do not vote; if no kept response has one, the method answers nothing and is wrong (counted as
``no_answer`` in the trials' summary). The DeepConf rows follow their authors' code instead (docs/definitions.md
§5): unanswered traces are dropped before scoring, the filter is a percentile with ties kept, and a tied weighted
vote goes to the answer seen first, whatever ``tie_break`` says (``voting.deepconf``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from depthlens.config import VotingConfig
from depthlens.voting.deepconf import (
    DEEPCONF_FILTERS,
    TRACE_SCORES,
    deepconf_method,
    group_confidences,
    percentile_kept,
    trace_confidence,
)
from depthlens.voting.ranked import ranked_votes, strata_scores
from depthlens.voting.responses import (
    Outcome,
    Response,
    Tally,
    draw_arrays,
    kept_count,
    tally,
    tiebreak_values,
    total_length,
    vote,
)
from depthlens.voting.subsets import subset_votes, subsets

__all__ = [  # what the voting room offers from here (the rest lives in its own modules)
    "DEEPCONF_FILTERS",
    "METHODS",
    "PAPER_METHODS",
    "RANKINGS",
    "TRACE_SCORES",
    "Outcome",
    "Response",
    "Tally",
    "draw_arrays",
    "group_confidences",
    "in_order",
    "percentile_kept",
    "ranked_cost",
    "tally",
    "trace_confidence",
    "vote",
]


def _top(values: Sequence[float], k: int) -> list[int]:
    """Indices of the k largest values (at ``voting.ranked``'s 12 decimals); equal values keep the earlier
    response — one order of a tie at the cut, the one a deployed run resumes."""
    rounded = [round(v, 12) for v in values]
    order = sorted(range(len(values)), key=lambda i: (-rounded[i], i))
    return sorted(order[:k])


def _outcome(
    responses: Sequence[Response],
    kept: list[int],
    weights: Sequence[float],
    cost: float,
    cost_paper: float,
    cfg: VotingConfig,
) -> Outcome:
    t = tally(responses, kept, weights, tiebreak_values(responses, kept, cfg), cfg.tie_break)
    return Outcome(t.credit, cost, cost_paper, t.answer, tuple(kept), tied=float(t.tied))


def mean_at_n(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
    """Mean@n = Pass@1: the mean accuracy of the n responses."""
    return Outcome(
        float(np.mean([r.correct for r in rs])),
        total_length(rs),
        total_length(rs),
        None,
        tuple(range(len(rs))),
        voted=False,
    )


def cons_at_n(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
    """Cons@n: plain majority over all n."""
    kept = list(range(len(rs)))
    return _outcome(rs, kept, [1.0] * len(rs), total_length(rs), total_length(rs), cfg)


CostRule = Literal["two-phase", "short", "all"]


@dataclasses.dataclass(frozen=True)
class Ranking:
    """A ranked method: its score of each drawn response, [D, n] for draws [D, n] of pool indices into ``rs``, and
    how its selection is paid for (``ranked_cost``)."""

    scores: Callable[[Sequence[Response], VotingConfig, np.ndarray], np.ndarray]
    cost: CostRule


def _fixed(score: Callable[[Response, VotingConfig], float]) -> Callable[..., np.ndarray]:
    """A score of each response alone (the same in every draw)."""

    def scores(rs: Sequence[Response], cfg: VotingConfig, draws: np.ndarray) -> np.ndarray:
        return np.array([score(r, cfg) for r in rs], dtype=np.float64)[draws]

    return scores


def _within_strata(rs: Sequence[Response], cfg: VotingConfig, draws: np.ndarray) -> np.ndarray:
    dtr = np.array([r.prefix_dtr(cfg.rank_prefix) for r in rs], dtype=np.float64)
    length = np.array([r.length for r in rs], dtype=np.float64)
    return strata_scores(dtr[draws], length[draws])


RANKINGS: dict[str, Ranking] = {
    "think@n": Ranking(_fixed(lambda r, cfg: r.prefix_dtr(cfg.rank_prefix)), "two-phase"),
    "self-certainty@n": Ranking(_fixed(lambda r, cfg: r.prefix_self_certainty(cfg.rank_prefix)), "two-phase"),
    "long@n": Ranking(_fixed(lambda r, cfg: float(r.length)), "all"),
    "short@n": Ranking(_fixed(lambda r, cfg: -float(r.length)), "short"),
    "think-strata@n": Ranking(_within_strata, "all"),
}
"""The methods that keep the ⌈η·n⌉ best-scored of a draw, ties at the cut uniform (``voting.ranked``)."""


def ranked_cost(
    rule: CostRule, keep: np.ndarray, length: np.ndarray, cfg: VotingConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Expected exact cost and the paper's formula per draw ([D] each) from each drawn response's chance of being
    kept (``keep``) and its length (``length``), both [D, n].

    ``two-phase`` (Think@n, Self-Certainty@n): every response runs to ℓ_prefix, the kept to their end; ``short``
    (Short@n): the others stop once the longest kept has finished — the k-th shortest, the same in every order of a
    tie; ``all`` (Long@n, Think@n within length strata: the lengths decide, so every response finishes).
    """
    n = length.shape[1]
    if rule == "all":
        total = length.sum(axis=1)
        return total, total
    kept = (keep * length).sum(axis=1)
    if rule == "short":
        longest = np.sort(length, axis=1)[:, kept_count(n, cfg.eta) - 1]
        stop = np.minimum(length, longest[:, None])
        return kept + ((1 - keep) * stop).sum(axis=1), kept + longest * cfg.eta * n
    prefix = cfg.rank_prefix
    stop = length if prefix is None else np.minimum(length, prefix)
    prefix_len = length.max(axis=1) if prefix is None else np.full(len(length), float(prefix))
    return kept + ((1 - keep) * stop).sum(axis=1), kept + prefix_len * cfg.eta * n


def _ranked(name: str) -> Callable[[Sequence[Response], VotingConfig], Outcome]:
    ranking = RANKINGS[name]

    def method(rs: Sequence[Response], cfg: VotingConfig) -> Outcome:
        n, k = len(rs), kept_count(len(rs), cfg.eta)
        answer, correct, tiebreak = draw_arrays(rs, cfg)
        draws = np.arange(n)[None]
        scores = ranking.scores(rs, cfg, draws)
        v = ranked_votes(answer, correct, tiebreak, draws, scores, k, cfg.tie_break)
        length = np.array([[r.length for r in rs]], dtype=np.float64)
        cost, paper = ranked_cost(ranking.cost, v.keep, length, cfg)
        kept = _top(scores[0].tolist(), k)
        realised = tally(rs, kept, [1.0] * k, tiebreak_values(rs, kept, cfg), cfg.tie_break)
        return Outcome(
            float(v.credit[0]),
            float(cost[0]),
            float(paper[0]),
            realised.answer,
            tuple(kept),
            tied=float(v.tied[0]),
            unanswered=float(v.unanswered[0]),
            cut_tied=float(v.cut_tied[0]),
            orders=int(v.orders[0]),
        )

    return method


think_at_n = _ranked("think@n")
think_at_n.__doc__ = "Think@n: keep the ⌈η·n⌉ highest prefix DTRs (ties at the cut uniform), vote among them."
self_certainty_at_n = _ranked("self-certainty@n")
self_certainty_at_n.__doc__ = "Self-Certainty@n: as Think@n, ranked by the prefix's mean self-certainty."
long_at_n = _ranked("long@n")
long_at_n.__doc__ = "Long@n: vote among the η·n longest (all n must finish to know which)."
short_at_n = _ranked("short@n")
short_at_n.__doc__ = (
    "Short@n: vote among the η·n shortest; the others stop once the longest kept one has finished."
)
think_strata_at_n = _ranked("think-strata@n")
think_strata_at_n.__doc__ = (
    "Think@n within length strata (a diagnostic, offline only): keep the ⌈η·n⌉ whose prefix DTR ranks highest "
    "among the draw's responses of similar length (``ranked.strata_scores``); every response finishes."
)


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
    k = kept_count(n, cfg.eta)
    answer, correct, tiebreak = draw_arrays(rs, cfg)
    chosen, _ = subsets(n, k, [cfg.seed, n, k, *draw])
    votes = subset_votes(answer, correct, tiebreak, chosen, cfg.tie_break)
    share = k / n
    stop = (lambda r: r.length) if cfg.rank_prefix is None else (lambda r: min(r.length, cfg.rank_prefix))
    cost = sum(share * r.length + (1 - share) * stop(r) for r in rs)
    prefix_len = max(r.length for r in rs) if cfg.rank_prefix is None else cfg.rank_prefix
    return Outcome(
        float(votes.credit.mean()),
        cost,
        share * total_length(rs) + prefix_len * cfg.eta * n,
        None,
        (),
        tied=float(votes.tied.mean()),
        unanswered=float(votes.unanswered.mean()),
        subsets=len(chosen),
    )


METHODS: dict[str, Callable[[Sequence[Response], VotingConfig], Outcome]] = {
    "mean@n": mean_at_n,
    "cons@n": cons_at_n,
    "think@n": think_at_n,
    "random@n": random_at_n,
    "self-certainty@n": self_certainty_at_n,
    "long@n": long_at_n,
    "short@n": short_at_n,
    "think-strata@n": think_strata_at_n,
    **{
        f"deepconf-{prefix}{kind}@n": deepconf_method(kind, keep)
        for prefix, keep in DEEPCONF_FILTERS.items()
        for kind in TRACE_SCORES
    },
}

PAPER_METHODS = (
    "think@n",
    "cons@n",
    "random@n",
    "short@n",
    "think-strata@n",
    "mean@n",
    "long@n",
    "self-certainty@n",
)
"""The deep-thinking paper's Table 2 rows with random@n, Think@n's control, Short@n (length alone) and Think@n within
length strata (DTR with length held fixed) after Think@n and Cons@n: shown first in this order (``thinkn``'s table,
the explorer's); DeepConf's variants follow."""

DRAW_SEEDED = frozenset({"random@n"})
"""Methods that take the draw's (trial, question) as ``draw=``, to seed what they sample."""


def in_order(methods: Sequence[str]) -> list[str]:
    """``methods`` with the paper's first (in ``PAPER_METHODS``' order), the rest as they came."""
    first = [m for m in PAPER_METHODS if m in methods]
    return first + [m for m in methods if m not in first]
