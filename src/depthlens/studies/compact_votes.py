"""Table 2 of docs/findings.md §6 from the committed compact per-response tables (``studies.compact``), voted exactly
as ``thinkn --from`` votes the stores: every method's expectation over all draws of n from each pool
(``voting.exact``), the trials' means beside them, and the paired contrasts over questions on the exact figures.

One row per store and answer rule (``store_rows``), and per model and rule the stores pooled (``pooled_rows``:
their questions together, as ``report``'s pooled tests). The methods are those a compact table can vote
(``compact.COMPACT_METHODS``); Self-Certainty@n and DeepConf's need per-token signals the table does not keep.

The contrasts (``CONTRASTS``), each a sign-flip permutation test over questions with a paired-bootstrap interval:
Think@n − random@n (the primary, fixed before the stores were voted), Think@n − Cons@n (the paper's claim), random@n −
Cons@n (what the vote's size alone costs), Think@n within length strata − random@n (DTR with length held fixed),
Short@n − Cons@n (length alone), and — exploratory, not fixed before looking — Think@n ranked by whole-response DTR
− random@n (stores read out in full only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from depthlens.config import PREFIX_TOKENS, VotingConfig
from depthlens.errors import InputError, named
from depthlens.stats.paired import paired_test, questions_needed
from depthlens.studies.compact import compact_pools, readout_of
from depthlens.studies.footprint import check_trials
from depthlens.voting.exact import exact_outcomes
from depthlens.voting.methods import Response
from depthlens.voting.trials import trial_outcomes

METHODS = ("mean@n", "cons@n", "think@n", "random@n", "short@n", "think-strata@n")
"""The methods of the regenerated Table 2 (Long@n adds nothing the committed rows need)."""
FULL = "think-full@n"
"""Think@n ranked by DTR over the whole response (ℓ_prefix = all): the exploratory lead of §6.4."""
CONTRASTS = {
    "think_minus_random": ("think@n", "random@n"),
    "think_minus_cons": ("think@n", "cons@n"),
    "random_minus_cons": ("random@n", "cons@n"),
    "strata_minus_random": ("think-strata@n", "random@n"),
    "short_minus_cons": ("short@n", "cons@n"),
    "full_minus_random": (FULL, "random@n"),
}
"""Column prefix → (method, against): the paired contrasts of each row."""
RULES = {"correct": "strict", "correct_fallback": "final-result"}
"""A compact table's grade columns and the answer rule each is (docs/definitions.md §5)."""
EFFECT = 0.02
"""The effect (accuracy points / 100) whose questions for 80 % power each contrast states: the paper's +2.0."""
RESAMPLES = 10_000


@dataclasses.dataclass(frozen=True, eq=False)
class StoreVote:
    """One store under one answer rule: its per-question exact accuracies and its Table 2 row."""

    model: str
    task: str
    rule: str
    per_question: dict[str, np.ndarray]  # method → [questions], the exact expectation
    row: dict[str, Any]


def vote_store(
    model: str,
    task: str,
    pools: dict[str, list[Response]],
    cfg: VotingConfig,
    rule: str,
    full_readout: bool,
) -> StoreVote:
    """Every method of ``METHODS`` over the store's pools, exactly and in ``cfg.trials`` trials, and its row."""
    exact = exact_outcomes(pools, cfg, METHODS)
    check_trials(cfg, len(pools), ("cons@n", "think@n", "random@n"))
    trials = trial_outcomes(pools, cfg, ("cons@n", "think@n", "random@n"))
    accuracy = dict(exact.accuracy)
    if full_readout:  # whole-response DTR needs every token read out
        whole = exact_outcomes(pools, dataclasses.replace(cfg, rank_prefix=None), ["think@n"])
        accuracy[FULL] = whole.accuracy["think@n"]
    responses = [r for p in pools.values() for r in p]
    v = exact.values
    row: dict[str, Any] = {
        "model": model,
        "task": task,
        "rule": rule,
        "stores": 1,
        "questions": len(pools),
        "responses": len(responses),
        "n": cfg.n,
        "eta": cfg.eta,
        "prefix": cfg.rank_prefix,
        "tie_break": cfg.tie_break,
        "draws_per_question": int(exact.draws.max()),
        "draws_all": bool(exact.every.all()),
        "pass1": float(np.mean([r.correct for r in responses])),
        "unanswered": float(np.mean([r.key is None for r in responses])),
        **{_name(m): float(a.mean()) for m, a in accuracy.items()},
        **{f"{_name(m)}_trials": float(a.mean()) for m, a in trials.accuracy.items()},
        "trials": cfg.trials,
        **{f"ties_{_name(m)}": float(v["tied"][m].mean()) for m in ("cons@n", "think@n", "random@n")},
        **{
            f"cut_ties_{_name(m)}": float(v["cut_tied"][m].mean())
            for m in ("think@n", "short@n", "think-strata@n")
        },
        **{
            f"no_answer_{_name(m)}": float(v["unanswered"][m].sum())
            for m in ("cons@n", "think@n", "random@n")
        },
        "think_cost_vs_cons": float(v["cost"]["think@n"].mean() / v["cost"]["cons@n"].mean()),
        **contrasts(accuracy, cfg.seed),
    }
    return StoreVote(model, task, rule, accuracy, row)


def _name(method: str) -> str:
    """A method as a column name: ``think-strata@n`` → ``think_strata``."""
    return method.removesuffix("@n").replace("-", "_")


def contrasts(per_question: dict[str, np.ndarray], seed: int = 0) -> dict[str, Any]:
    """Each contrast of ``CONTRASTS`` whose methods were voted: difference, 95 % interval, p, questions won and
    lost, the s.d. of the per-question difference and the questions 80 % power would need for ``EFFECT``."""
    out: dict[str, Any] = {}
    for i, (column, (method, against)) in enumerate(CONTRASTS.items()):
        if method not in per_question or against not in per_question:
            continue
        t = paired_test(
            per_question[method], per_question[against], RESAMPLES, np.random.default_rng([seed, 56, i])
        )
        out.update(
            {
                column: t.difference,
                f"{column}_lo": t.low,
                f"{column}_hi": t.high,
                f"{column}_p": t.p,
                f"{column}_won": t.wins,
                f"{column}_lost": t.losses,
                f"{column}_sd": t.sd,
                f"{column}_questions_for_2pt": questions_needed(EFFECT, t.sd),
            }
        )
    return out


def store_votes(
    rows: Sequence[dict[str, Any]],
    cfg: VotingConfig,
    rules: Sequence[str] = tuple(RULES),
    prefix: int = PREFIX_TOKENS,
) -> list[StoreVote]:
    """Each (model, task) of a compact table under each grade column of ``rules`` whose grades differ from the
    store's own (a fallback that reads no more answers gives the same row, and is left out). ``prefix``: the ℓ of
    the table's ``dtr_prefix``, which ``cfg.rank_prefix`` must be; the tokens read out are the table's
    (``compact.readout_of``)."""
    if cfg.rank_prefix != prefix:
        raise InputError(
            f"{named('rank_prefix')} {cfg.rank_prefix}: a compact table ranks by its dtr_prefix, over {prefix} "
            "tokens; vote with that prefix"
        )
    readout = readout_of(rows, prefix)
    out = []
    for rule in rules:
        if rule != "correct" and all(r[rule] == r["correct"] for r in rows):
            continue
        for (model, task), pools in compact_pools(rows, prefix, readout, rule).items():
            out.append(vote_store(model, task, pools, cfg, RULES[rule], readout is None))
    return out


def pooled_rows(votes: Sequence[StoreVote], seed: int = 0) -> list[dict[str, Any]]:
    """Per model and rule with more than one store, the contrasts over all its stores' questions together."""
    groups: dict[tuple[str, str], list[StoreVote]] = {}
    for v in votes:
        groups.setdefault((v.model, v.rule), []).append(v)
    rows = []
    for (model, rule), stores in groups.items():
        if len(stores) < 2:
            continue
        common = [m for m in stores[0].per_question if all(m in s.per_question for s in stores)]
        joined = {m: np.concatenate([s.per_question[m] for s in stores]) for m in common}
        rows.append(
            {
                "model": model,
                "task": "pooled: " + " + ".join(s.task for s in stores),
                "rule": rule,
                "stores": len(stores),
                "questions": sum(s.row["questions"] for s in stores),
                "responses": sum(s.row["responses"] for s in stores),
                **{_name(m): float(a.mean()) for m, a in joined.items()},
                **contrasts(joined, seed),
            }
        )
    return rows
