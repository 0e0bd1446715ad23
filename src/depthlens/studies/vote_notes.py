"""The lines under a vote's table (``thinkn``'s, the explorer's; docs/definitions.md §5): what the exact column
averages over, votes with no answer, votes tied at the top and the rule that scored them, η cuts that fell inside a
tie of the ranking score, and which subsets random@n averaged over."""

from __future__ import annotations

import math
from collections.abc import Sequence

from depthlens.config import VotingConfig
from depthlens.voting.trials import MethodSummary


def vote_notes(summaries: Sequence[MethodSummary], voting: VotingConfig) -> list[str]:
    """The lines under the vote's table (``thinkn``'s, the explorer's): what the exact column averages over, votes
    with no answer, votes tied at the top and the tie rule that scored them, η cuts that fell in a tie, and which
    subsets random@n averaged over — each from the expectation over every draw where it was computed."""
    lines = _exact_notes(summaries)
    exact = all(s.accuracy_exact is not None for s in summaries)
    per = "per set of draws (expected)" if exact else "per trial"
    unanswered = {
        s.method: (s.no_answer_exact if exact else s.no_answer)
        for s in summaries
        if s.no_answer or s.no_answer_exact
    }
    if unanswered:
        lines.append(
            f"votes with no answer (wrong), questions {per}: "
            + ", ".join(f"{m} {v:.3g}" for m, v in unanswered.items())
        )
    share = {s.method: _share(s, exact, "tie_share_exact", s.tie_draws) for s in summaries}
    tied = {m: v for m, v in share.items() if v}
    if tied:
        rule = (
            "uniform: the share of right answers among the tied"
            if voting.tie_break == "uniform"
            else "summed-dtr: the highest summed prefix DTR, then the first given"
        )
        lines.append(
            f"votes tied at the top, share of the draws ({rule}; DeepConf's rows: the first seen): "
            + ", ".join(f"{m} {v:.0%}" for m, v in tied.items())
        )
    cut = {s.method: _share(s, exact, "cut_tie_share_exact", s.cut_tie_draws) for s in summaries}
    cut = {m: v for m, v in cut.items() if v}
    if cut:
        lines.append(
            "η cut inside a tie of the ranking score, share of the draws (scored as the expectation over the tied "
            "responses' orders): " + ", ".join(f"{m} {v:.0%}" for m, v in cut.items())
        )
    return lines + _subset_notes(summaries, voting)


def _share(s: MethodSummary, exact: bool, field: str, count: float) -> float:
    """A share of the draws: the expectation's where computed, else the trials' count over their draws."""
    return float(getattr(s, field) or 0.0) if exact else count / (s.trials * s.questions)


def _exact_notes(summaries: Sequence[MethodSummary]) -> list[str]:
    """What the exact column averages over: every draw of n from each pool, or a seeded sample of them."""
    s = next((s for s in summaries if s.accuracy_exact is not None), None)
    if s is None:
        return []
    per = s.draws_exact / max(1, s.questions)
    if s.draws_all and per == 1:
        over = "the one draw of n each question's pool allows (pool = n)"
    elif s.draws_all:
        over = f"all {per:,.0f} draws of n from each question's pool (C(pool, n); {s.draws_exact:,} in all)"
    else:
        over = f"{per:,.0f} uniform draws of n per question (seeded; fewer than the C(pool, n) there are)"
    return [
        f"exact: each method's expectation over {over}; the paired tests and intervals are on it, and ± is "
        f"the spread of the {s.trials} trials' means (one draw per question each)"
    ]


def _subset_notes(summaries: Sequence[MethodSummary], voting: VotingConfig) -> list[str]:
    lines = []
    k = max(1, math.ceil(round(voting.eta * voting.n, 9)))
    every = math.comb(voting.n, k)
    for s in summaries:
        if s.subsets_exact:
            lines.append(
                f"{s.method} exact: the mean vote over {s.subsets_exact:,} subsets of {k} of each pool — every "
                "subset of every draw, as a uniform subset of a uniform draw is a uniform subset of the pool"
                + ("" if s.draws_all else " (sampled, seeded)")
            )
        if s.subsets:
            lines.append(
                f"{s.method} trials: the expectation over all {every:,} subsets of {k} of each draw"
                if s.subsets >= every
                else f"{s.method} trials: the mean over {s.subsets:,} of the {every:,} subsets of {k} of each draw, "
                "sampled uniformly (seeded per draw)"
            )
    return lines
