"""Trials: draw n of each question's pool, run every method, and average (definitions.md §5). Pure: no model, no I/O.

Trial t draws, for each question, n responses without replacement from its pool with a generator seeded by
(seed, t, question index), so a trial's draw does not depend on which methods run or on other questions.
Accuracy is the mean over questions; cost the mean generated tokens per question; both are then summarised as
mean ± std (sample std, ddof = 1) over trials. Ablations over ℓ_prefix and η reuse the same pool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from depthlens.config import VotingConfig
from depthlens.errors import InputError
from depthlens.voting.methods import METHODS, Response


@dataclasses.dataclass(frozen=True)
class MethodSummary:
    method: str
    accuracy_mean: float
    accuracy_std: float
    cost_mean: float  # exact generated tokens per question, mean over trials
    cost_std: float
    cost_paper_mean: float  # the paper's printed formula, per question
    trials: int
    questions: int
    no_answer: float = 0.0  # questions per trial where the method's vote had no answer (wrong); 0 for Mean@n

    def to_dict(self) -> dict[str, float | int | str]:
        return dataclasses.asdict(self)


def _std(values: Sequence[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def draw(pool_size: int, n: int, seed: int, trial: int, question: int) -> list[int]:
    """The indices of trial ``trial``'s n responses for question number ``question``, in pool order."""
    rng = np.random.default_rng([seed, trial, question])
    return sorted(rng.choice(pool_size, size=n, replace=False).tolist())


def run_trials(
    pools: Mapping[str, Sequence[Response]], cfg: VotingConfig, methods: Sequence[str] | None = None
) -> list[MethodSummary]:
    """Every method's accuracy and cost, mean ± std over ``cfg.trials`` draws of n per question."""
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
            f"short); lower --n or generate a larger --pool"
        )
    accuracy = {m: [] for m in names}
    cost = {m: [] for m in names}
    paper = {m: [] for m in names}
    unanswered = {m: [] for m in names}
    questions = sorted(pools)
    for trial in range(cfg.trials):
        per_q = {m: ([], [], [], []) for m in names}
        for qi, q in enumerate(questions):
            pool = pools[q]
            drawn = [pool[i] for i in draw(len(pool), cfg.n, cfg.seed, trial, qi)]
            for m in names:
                outcome = METHODS[m](drawn, cfg)
                per_q[m][0].append(outcome.accuracy)
                per_q[m][1].append(outcome.cost)
                per_q[m][2].append(outcome.cost_paper)
                per_q[m][3].append(outcome.answer is None and outcome.voted)
        for m in names:
            accuracy[m].append(float(np.mean(per_q[m][0])))
            cost[m].append(float(np.mean(per_q[m][1])))
            paper[m].append(float(np.mean(per_q[m][2])))
            unanswered[m].append(float(np.sum(per_q[m][3])))
    return [
        MethodSummary(
            m,
            float(np.mean(accuracy[m])),
            _std(accuracy[m]),
            float(np.mean(cost[m])),
            _std(cost[m]),
            float(np.mean(paper[m])),
            cfg.trials,
            len(questions),
            float(np.mean(unanswered[m])),
        )
        for m in names
    ]


def ablation(
    pools: Mapping[str, Sequence[Response]],
    cfg: VotingConfig,
    prefixes: Sequence[int | None] = (50, 100, 500, None),
    etas: Sequence[float] = (0.25, 0.5, 0.75),
    methods: Sequence[str] = ("think@n", "self-certainty@n"),
) -> list[dict[str, object]]:
    """Think@n (and Self-Certainty@n) over a grid of ℓ_prefix × η, each row with Cons@n's cost beside it."""
    cons = {s.method: s for s in run_trials(pools, cfg, ["cons@n"])}["cons@n"]
    rows = []
    for prefix in prefixes:
        for eta in etas:
            varied = dataclasses.replace(cfg, prefix=prefix, eta=eta)
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
