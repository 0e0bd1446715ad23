"""Trials: draw n of each question's pool, run every method, and average (definitions.md §5). Pure: no model, no I/O.

Trial t draws, for each question, n responses without replacement from its pool with a generator seeded by
(seed, t, question index), so a trial's draw does not depend on which methods run or on other questions.
Accuracy is the mean over questions; cost the mean generated tokens per question; both are then summarised as
mean and draw s.d. (sample std, ddof = 1) over trials. The draw s.d. is the spread of re-draws from one fixed pool,
not an error bar: the uncertainty about the task is the interval over resampled questions
(``studies.thinkn.accuracy_intervals``). Ablations over ℓ_prefix and η reuse the same pool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from depthlens.config import VotingConfig
from depthlens.errors import InputError, named
from depthlens.voting.exact import ExactOutcomes
from depthlens.voting.methods import DRAW_SEEDED, METHODS, RANKINGS, Response


@dataclasses.dataclass(frozen=True)
class MethodSummary:
    method: str
    accuracy_mean: float
    accuracy_std: float  # the draw s.d.: over trials re-drawn from one pool, not an error bar
    cost_mean: float  # exact generated tokens per question, mean over trials
    cost_std: float
    cost_paper_mean: float  # the paper's printed formula, per question
    trials: int
    questions: int
    no_answer: float = 0.0  # questions per trial where the method's vote had no answer (wrong); 0 for Mean@n
    tie_draws: float = 0.0  # draws (trials × questions) whose vote was tied at the top (random@n: expected)
    subsets: int = 0  # random@n: subsets averaged per draw (all C(n, k) up to 10⁴, else a sample of 10⁴)
    cut_tie_draws: float = 0.0  # ranked methods: draws whose η cut fell inside a tie of the ranking score
    # The expectation over every draw of n from each pool (``voting.exact``); None where it was not computed.
    accuracy_exact: float | None = None  # mean over questions of each question's expectation
    cost_exact: float | None = None  # exact generated tokens per question, its expectation
    cost_paper_exact: float | None = None
    draws_exact: int = 0  # draws of n counted, over all questions
    draws_all: bool | None = (
        None  # every C(pool, n) draw of every question (else a seeded sample, counted above)
    )
    tie_share_exact: float | None = None  # share of draws whose vote tied at the top
    cut_tie_share_exact: float | None = None  # ranked methods: share of draws whose η cut fell inside a tie
    no_answer_exact: float | None = None  # questions with no answer, expected per set of draws (as no_answer)
    subsets_exact: int = (
        0  # random@n: the pool's ⌈η·n⌉-subsets averaged per question (all, or a seeded sample)
    )

    def to_dict(self) -> dict[str, float | int | str]:
        return dataclasses.asdict(self)


def _std(values: Sequence[float]) -> float:
    """The sample spread; exactly 0.0 for equal values (their mean, rounded, would leave ~1e-17), by measuring from
    the first value."""
    if len(values) < 2:
        return 0.0
    shifted = np.asarray(values, dtype=float) - values[0]
    return float(np.std(shifted, ddof=1))


def draw(pool_size: int, n: int, seed: int, trial: int, question: int) -> list[int]:
    """The indices of trial ``trial``'s n responses for question number ``question``, in pool order."""
    rng = np.random.default_rng([seed, trial, question])
    return sorted(rng.choice(pool_size, size=n, replace=False).tolist())


@dataclasses.dataclass(frozen=True, eq=False)  # identity equality: fields are arrays
class TrialOutcomes:
    """Every method's outcome on every question in every trial: arrays [trials, questions] per method.

    The per-question rows are what a paired comparison between methods needs (``per_question_accuracy``, then
    ``stats.paired``): the methods voted on the same draws, so question q's difference between two methods is
    paired.
    """

    questions: tuple[str, ...]
    accuracy: dict[str, np.ndarray]
    cost: dict[str, np.ndarray]
    cost_paper: dict[str, np.ndarray]
    unanswered: dict[
        str, np.ndarray
    ]  # 1 where the method's vote had no answer (random@n: the expected share)
    tied: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # 1 where the top was tied
    subsets: dict[str, int] = dataclasses.field(default_factory=dict)  # random@n's subsets per draw
    cut_tied: dict[str, np.ndarray] = dataclasses.field(
        default_factory=dict
    )  # 1 where the η cut fell in a tie

    def summaries(self, exact: ExactOutcomes | None = None) -> list[MethodSummary]:
        """Mean and draw s.d. over trials of the per-trial means over questions; with ``exact`` (the same pools'
        expectations over every draw, ``voting.exact``) beside them."""
        rows = [
            MethodSummary(
                m,
                float(np.mean(self.accuracy[m].mean(1))),
                _std(self.accuracy[m].mean(1).tolist()),
                float(np.mean(self.cost[m].mean(1))),
                _std(self.cost[m].mean(1).tolist()),
                float(np.mean(self.cost_paper[m].mean(1))),
                self.accuracy[m].shape[0],
                len(self.questions),
                float(np.mean(self.unanswered[m].sum(1))),
                float(self.tied[m].sum()) if m in self.tied else 0.0,
                self.subsets.get(m, 0),
                float(self.cut_tied[m].sum()) if m in self.cut_tied else 0.0,
            )
            for m in self.accuracy
        ]
        return rows if exact is None else [with_exact(s, exact) for s in rows]


def with_exact(summary: MethodSummary, exact: ExactOutcomes) -> MethodSummary:
    """``summary`` with its method's expectations over every draw (``voting.exact``), when they were computed."""
    m = summary.method
    if m not in exact.accuracy:
        return summary
    v = exact.values
    return dataclasses.replace(
        summary,
        accuracy_exact=float(v["accuracy"][m].mean()),
        cost_exact=float(v["cost"][m].mean()),
        cost_paper_exact=float(v["cost_paper"][m].mean()),
        draws_exact=int(exact.draws.sum()),
        draws_all=bool(exact.every.all()),
        tie_share_exact=float(v["tied"][m].mean()),
        cut_tie_share_exact=float(v["cut_tied"][m].mean()) if m in RANKINGS else None,
        no_answer_exact=float(v["unanswered"][m].sum()),
        subsets_exact=exact.subsets.get(m, (0, True))[0],
    )


def per_question_accuracy(outcomes: TrialOutcomes) -> dict[str, np.ndarray]:
    """Each method's accuracy per question, averaged over trials ([questions], in ``outcomes.questions`` order)."""
    return {m: a.mean(axis=0) for m, a in outcomes.accuracy.items()}


def trial_outcomes(
    pools: Mapping[str, Sequence[Response]],
    cfg: VotingConfig,
    methods: Sequence[str] | None = None,
    on_trial: Callable[[int], None] = lambda n: None,
) -> TrialOutcomes:
    """Every method on ``cfg.trials`` draws of n per question (see the module docstring for the draws);
    ``on_trial`` is told each finished trial (a progress display)."""
    names = list(METHODS) if methods is None else list(methods)
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise InputError(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    if not pools:
        raise InputError("no questions with responses to vote on")
    small = {q: len(p) for q, p in pools.items() if len(p) < cfg.n}
    if small:
        q, size = next(iter(small.items()))
        raise InputError(
            f"question {q!r} has {size} responses but n = {cfg.n} are drawn per trial ({len(small)} question(s) "
            f"short); lower {named('n')} or generate a larger {named('pool')}"
        )
    questions = sorted(pools)
    shape = (cfg.trials, len(questions))
    accuracy, cost, cost_paper, unanswered, tied = ({m: np.zeros(shape) for m in names} for _ in range(5))
    out = TrialOutcomes(tuple(questions), accuracy, cost, cost_paper, unanswered, tied)
    out.cut_tied.update({m: np.zeros(shape) for m in names if m in RANKINGS})
    for trial in range(cfg.trials):
        for qi, q in enumerate(questions):
            pool = pools[q]
            drawn = [pool[i] for i in draw(len(pool), cfg.n, cfg.seed, trial, qi)]
            for m in names:
                seeded = {"draw": (trial, qi)} if m in DRAW_SEEDED else {}
                outcome = METHODS[m](drawn, cfg, **seeded)
                out.accuracy[m][trial, qi] = outcome.accuracy
                out.cost[m][trial, qi] = outcome.cost
                out.cost_paper[m][trial, qi] = outcome.cost_paper
                out.unanswered[m][trial, qi] = outcome.no_answer
                out.tied[m][trial, qi] = outcome.tied
                if m in out.cut_tied:
                    out.cut_tied[m][trial, qi] = outcome.cut_tied
                if outcome.subsets:
                    out.subsets[m] = outcome.subsets
        on_trial(1)
    return out


def run_trials(
    pools: Mapping[str, Sequence[Response]], cfg: VotingConfig, methods: Sequence[str] | None = None
) -> list[MethodSummary]:
    """Every method's accuracy and cost, mean and draw s.d. over ``cfg.trials`` draws of n per question."""
    return trial_outcomes(pools, cfg, methods).summaries()


def ablation(
    pools: Mapping[str, Sequence[Response]],
    cfg: VotingConfig,
    prefixes: Sequence[int | None] = (50, 100, 500, None),
    etas: Sequence[float] = (0.25, 0.5, 0.75),
    methods: Sequence[str] = ("think@n", "self-certainty@n"),
) -> list[dict[str, object]]:
    """Think@n (and Self-Certainty@n) over a grid of ℓ_prefix × η, each row with Cons@n's cost beside it."""
    cons = {s.method: s for s in run_trials(pools, cfg, ["cons@n"])}["cons@n"]
    rows: list[dict[str, object]] = []
    for prefix in prefixes:
        for eta in etas:
            varied = dataclasses.replace(cfg, rank_prefix=prefix, eta=eta)
            for s in run_trials(pools, varied, methods):
                rows.append(
                    {
                        "method": s.method,
                        "prefix": "full" if prefix is None else prefix,
                        "eta": eta,
                        "accuracy_mean": s.accuracy_mean,
                        "accuracy_std": s.accuracy_std,
                        "cost_mean": s.cost_mean,
                        "cost_vs_cons": s.cost_mean / cons.cost_mean if cons.cost_mean else None,
                        "cons_accuracy_mean": cons.accuracy_mean,
                    }
                )
    return rows
