"""``depthlens thinkn --online`` (the ``thinkn`` verb's online mode): online Think@n live (--out) or replayed over a
stored pool (--from)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from depthlens.cli.app import console, err_console, load_for, writes_to
from depthlens.cli.progress import make_progress
from depthlens.config import DTRConfig, ModelSpec, OnlineConfig, OnlineRun, VotingConfig

if TYPE_CHECKING:
    from depthlens.studies.runs import Built
    from depthlens.voting.online import OnlineSummary


@dataclasses.dataclass(frozen=True)
class Replay:
    """How a stored pool is replayed: sampling orders (trials), their seed, and whether to sweep budgets."""

    trials: int
    seed: int
    sweep: bool = False
    n: int = VotingConfig.n  # Cons@n beside the replay, on the same questions (a pool sampled in full only)


def run_live(model: ModelSpec, built: Built[OnlineRun]) -> None:
    """Online Think@n live: the run comes built and checked (``studies.runs.online_run``); say its warnings, check
    that a response fits the context, load the model, run it into its store, print the outcome."""
    from depthlens.cli.runs import refuse_unfitting, say_warnings

    run, questions = built.run, list(built.questions)
    say_warnings(built.warnings)
    refuse_unfitting(model, run, questions)  # before the weights load
    from depthlens.stores.guard import new_out
    from depthlens.studies.online import DECISIONS

    out = run.store.out
    # a failure before the first record leaves no --out
    with new_out(out, out / "samples.jsonl", out / DECISIONS):
        report, name = _live(model, run, questions)
    _print_live(run, report, name)


def _live(model: ModelSpec, run: OnlineRun, questions: list[Any]) -> tuple[Any, str]:
    from depthlens.studies.online import OnlineEvents, run_online

    lm = load_for(run.engine, model)
    writes_to(run.store.out / "samples.jsonl")  # an interruption says what it kept, and how to continue
    with make_progress(err_console) as progress:
        done = progress.add_task("questions", total=len(questions))
        tokens = progress.add_task("tokens", total=None)
        events = OnlineEvents(
            on_question=lambda o: progress.advance(done, 1), on_token=lambda n: progress.advance(tokens, n)
        )
        return run_online(lm, run, questions, events=events), lm.name


def _print_live(run: OnlineRun, report: Any, name: str) -> None:
    table = Table(title=f"online think@n · signal {run.online.signal} · {name}", title_justify="left")
    for column in ("questions", "accuracy %", "tokens / question", "stopped by"):
        table.add_column(column, justify="right")
    n = max(report.questions, 1)
    stops = ", ".join(f"{k} {v}" for k, v in sorted(report.stops.items()))
    table.add_row(
        str(report.questions), f"{100 * report.correct / n:.1f}", f"{report.tokens / n:,.0f}", stops
    )
    console.print(table)
    out = run.store.out
    err_console.print(
        f"decisions: {out / 'online.jsonl'} (replay with `depthlens thinkn --online --from {out}`)"
    )


def run_replay(online: OnlineConfig, store: Path, dtr: DTRConfig, replay: Replay) -> None:
    """Replay the policy over a stored pool in its sampling order (and ``replay.trials`` − 1 shuffled ones)."""
    trials, seed, sweep = replay.trials, replay.seed, replay.sweep
    from depthlens.cli.paired_view import verdict_line
    from depthlens.stores.samples import read_manifest
    from depthlens.studies.online import budget_sweep
    from depthlens.studies.paired_tables import replay_paired
    from depthlens.studies.tables import write_csv

    manifest = read_manifest(store)
    with err_console.status("replaying"):
        replayed = replay_paired(store, online, dtr, trials, seed, replay.n)
    holes, summary = replayed.holes, replayed.summary
    if holes:
        err_console.print(
            f"[yellow]{len(holes)} question(s) left out (a failed or missing response):[/] "
            + ", ".join(holes[:10])
        )
    _print_summaries([summary], f"online replay · {manifest['model']} · {store}")
    if (c := replayed.comparison) is not None:
        err_console.print(
            f"Cons@n beside it: n = {replay.n} drawn per trial.", verdict_line([c], c.method), highlight=False
        )
    from depthlens.stores.state import store_state

    payload: dict[str, Any] = {
        "store": str(store),
        "store_state": store_state(store),
        "online": online.to_dict(),
        "dtr": dtr.to_dict(),
        "summary": summary.to_dict(),
    }
    (store / "online_replay.json").write_text(json.dumps(payload, indent=2) + "\n")
    if sweep:
        from depthlens.viz.online import draw_budget_curves

        with err_console.status("sweeping budgets"):
            rows = budget_sweep(store, online, dtr, trials, seed)
        write_csv(store / "online_sweep.csv", rows)
        figure = draw_budget_curves(
            rows, store / "online_sweep.png", title=f"{manifest['model']} · accuracy vs tokens"
        )
        err_console.print(f"sweep: {store / 'online_sweep.csv'}, {figure}")
    err_console.print(f"summary: {store / 'online_replay.json'}, {replayed.path.name} (with the paired test)")


def _print_summaries(summaries: list[OnlineSummary], title: str) -> None:
    table = Table(title=title, title_justify="left")
    # ± is the s.d. over sampling orders of one pool: the spread of re-orderings, not an error bar
    for column in (
        "signal",
        "β",
        "max n",
        "accuracy % ± order s.d.",
        "tokens / q ± order s.d.",
        "started",
        "consensus stops",
    ):
        table.add_column(column, justify="right")
    for s in summaries:
        table.add_row(
            s.signal,
            f"{s.consensus:g}",
            str(s.max_n),
            f"{100 * s.accuracy_mean:.1f} ± {100 * s.accuracy_std:.1f}",
            f"{s.cost_mean:,.0f} ± {s.cost_std:,.0f}",
            f"{s.started_mean:.1f}",
            f"{100 * s.consensus_rate:.0f} %",
        )
    console.print(table)
    err_console.print(
        f"{summaries[0].trials} sampling orders × {summaries[0].questions} questions (order 0 = as stored)"
    )
