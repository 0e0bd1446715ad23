"""Table 2 with its paired tests: online replays against Cons@n, and every method pooled over a model's stores.

- ``replay_paired``: the online policy replayed over a store's pools (``voting.online``) and Cons@n voted on the same
  questions (``voting.trials``), compared question by question (``stats.paired``); written beside the store as
  ``online_replay-<signal>.json`` with the per-question accuracies.
- ``pooled_comparisons``: a model's families together — the per-question accuracies every summary stores,
  concatenated (questions of different families are independent draws too), so the test of "Think@n beats
  Cons@n on this model" has every question behind it. Benjamini–Hochberg over the methods of the pooled table.
- ``control_rows`` / ``pooled_control_rows``: Think@n − random@n (``stats.paired.control_comparison``), each
  store's as its summary holds it and each model's over all its questions — one test each, outside the family.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import DTRConfig, OnlineConfig, VotingConfig
from depthlens.errors import InputError
from depthlens.stats.resampling import mean_bootstrap
from depthlens.stores.files import write_json
from depthlens.stores.samples import read_manifest
from depthlens.studies.comparisons import (
    BASELINE,
    CONTROL,
    Comparison,
    control_comparison,
    paired_comparisons,
)
from depthlens.studies.footprint import check_trials
from depthlens.studies.online import ordered_pools
from depthlens.voting.online import OnlineSummary, replay_outcomes, summarise_replay
from depthlens.voting.trials import trial_outcomes

ONLINE_NAMES = {"dtr": "online think@n", "confidence": "online deepconf"}
REPLAYS = "online_replay-*.json"
"""The replays a report puts beside a store's Think@n summary (``replay_paired`` writes them)."""


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    summary: OnlineSummary
    cons_n: int
    comparison: Comparison | None  # None: a live online store, or pools smaller than n
    holes: list[str]
    path: Path


def replay_paired(
    store: Path, online: OnlineConfig, dtr: DTRConfig, trials: int, seed: int, n: int
) -> ReplayReport:
    """Replay ``online`` over the store and compare it with Cons@n (n drawn per trial) on the same questions."""
    pools, holes = ordered_pools(store, dtr)
    if not pools:
        raise InputError(f"{store}: no question has a complete pool to replay")
    outcomes = replay_outcomes(pools, online, trials, seed)
    summary = summarise_replay(outcomes, online)
    name = ONLINE_NAMES[online.signal]
    accuracy = {name: outcomes.accuracy.mean(0)}
    payload: dict[str, Any] = {
        "store": str(store),
        "online": online.to_dict(),
        "dtr": dtr.to_dict(),
        "method": name,
        "summary": summary.to_dict(),
        "cons_n": None,
        "paired": None,
        "command": " ".join(sys.argv),
    }
    comparison = None
    # A live online store keeps only what the policy let run, so only a pool sampled in full can also vote Cons@n.
    if n <= min(len(p) for p in pools.values()) and "online" not in read_manifest(store):
        voting = VotingConfig(
            n=n,
            eta=online.keep,
            rank_prefix=online.decision_prefix,
            trials=trials,
            seed=seed,
            deepconf_window=online.window,
        )
        check_trials(voting, len(pools), [BASELINE])
        cons = trial_outcomes(pools, voting, [BASELINE])
        accuracy[BASELINE] = cons.accuracy[BASELINE].mean(0)
        (comparison,) = paired_comparisons({BASELINE: accuracy[BASELINE], name: accuracy[name]}, seed=seed)
        payload.update(
            cons_n=n,
            cons_cost_mean=float(cons.cost[BASELINE].mean()),
            cons_accuracy_mean=float(cons.accuracy[BASELINE].mean()),
            paired=comparison.row(),
        )
    interval = mean_bootstrap(accuracy[name], 10_000, [seed, 2_000])  # Figure 5's bar, as for offline methods
    payload.update(accuracy_lo=interval.low, accuracy_hi=interval.high)
    payload["per_question"] = {
        "questions": list(outcomes.questions),
        "cost": _rounded(outcomes.cost.mean(0)),
        "accuracy": {k: _rounded(v) for k, v in accuracy.items()},
    }
    path = store / f"online_replay-{online.signal}.json"
    write_json(path, payload)
    return ReplayReport(summary, n, comparison, holes, path)


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(v), 6) for v in values]


def per_question(summary: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """A written summary's (or replay's) per-question accuracies, or None for one written before they were kept."""
    table = summary.get("per_question")
    if not table:
        return None
    return {m: np.asarray(v, dtype=np.float64) for m, v in table["accuracy"].items()}


def pooled_comparisons(stores: Sequence[dict[str, np.ndarray]], seed: int = 0) -> list[Comparison]:
    """Every method present in all of ``stores`` against Cons@n over all their questions together."""
    common = [m for m in stores[0] if all(m in s for s in stores)] if stores else []
    if BASELINE not in common:
        return []
    joined = {m: np.concatenate([s[m] for s in stores]) for m in common}
    return paired_comparisons(joined, seed=seed)


# ---------------------------------------------------------------------------------------------------------
# Table 2 of a report: every store's methods and online replays, then each model's stores pooled.


def table_two_rows(
    label: str, summary: dict[str, Any], replays: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per voted method and per online replay compared on this summary's Cons@n (same n)."""
    n = summary["voting"]["n"]
    cons = next((m for m in summary["methods"] if m["method"] == BASELINE), None)
    # Model, task and questions in every row, so that a table written out names what each number is of.
    named = {
        "store": label,
        "model": summary.get("model"),
        "task": str((summary.get("task") or {}).get("name", "?")).removeprefix("reasoning_gym:"),
    }
    rows = [{**named, **m} for m in summary["methods"]]
    for replay in replays:
        if replay.get("cons_n") != n or replay.get("paired") is None:
            continue  # compared with another Cons@n than this table's, or not at all
        s = replay["summary"]
        rows.append(
            {
                **named,
                "questions": len((replay.get("per_question") or {}).get("questions", [])) or None,
                "method": f"{replay['method']} (max n {s['max_n']}, β {s['consensus']:g})",
                "accuracy_mean": s["accuracy_mean"],
                "accuracy_std": s["accuracy_std"],
                "cost_mean": s["cost_mean"],
                "cost_std": s["cost_std"],
                "cost_vs_cons": s["cost_mean"] / cons["cost_mean"] if cons and cons["cost_mean"] else None,
                "accuracy_lo": replay.get("accuracy_lo"),
                "accuracy_hi": replay.get("accuracy_hi"),
                "command": replay.get("command"),
                **replay["paired"],
            }
        )
    return rows


def store_per_question(
    summary: dict[str, Any], replays: Sequence[dict[str, Any]]
) -> dict[str, np.ndarray] | None:
    """The summary's per-question accuracies with those of the replays compared on the same Cons@n."""
    table = per_question(summary)
    if table is None:
        return None
    # A replay's Cons@n is the trials' (its draws): matched against the summary's trial means, where it keeps them.
    trials = (summary.get("per_question") or {}).get("accuracy_trials") or {}
    drawn = np.asarray(trials[BASELINE], dtype=np.float64) if BASELINE in trials else table[BASELINE]
    for replay in replays:
        theirs = per_question(replay)
        if (  # the same questions and draws
            theirs is not None
            and replay.get("cons_n") == summary["voting"]["n"]
            and BASELINE in theirs
            and np.array_equal(theirs[BASELINE], drawn)
        ):
            table[f"{replay['method']} (max n {replay['summary']['max_n']})"] = theirs[replay["method"]]
    return table


def pooled_rows(by_model: dict[str, list[dict[str, np.ndarray]]], seed: int = 0) -> list[dict[str, Any]]:
    """Per model, every method against Cons@n over the questions of all its stores (one BH family per model)."""
    rows = []
    for model, stores in by_model.items():
        for c in pooled_comparisons(stores, seed):
            rows.append({"model": model, "stores": len(stores), "method": c.method, **c.row()})
    return rows


def control_rows(label: str, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's Think@n − random@n as a row of the report's control table (none for a summary written
    before random@n was voted)."""
    control = summary.get("control")
    return (
        [{"store": label, **control, "method": f"{control['method']} − {control['vs']}"}] if control else []
    )


def pooled_control_rows(
    by_model: dict[str, list[dict[str, np.ndarray]]], seed: int = 0
) -> list[dict[str, Any]]:
    """Per model, Think@n − random@n over the questions of all its stores (where every one voted both)."""
    rows = []
    for model, stores in by_model.items():
        if not stores or not all("think@n" in s and CONTROL in s for s in stores):
            continue
        joined = {m: np.concatenate([s[m] for s in stores]) for m in ("think@n", CONTROL)}
        c = control_comparison(joined, seed=seed)
        if c is not None:
            rows.append(
                {"model": model, "stores": len(stores), "method": f"{c.method} − {c.baseline}", **c.row()}
            )
    return rows
