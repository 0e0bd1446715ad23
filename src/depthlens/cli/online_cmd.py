"""``depthlens thinkn --online``: online Think@n live (--out) or replayed over a stored pool (--from)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from depthlens.cli.app import console, err_console, load_model
from depthlens.cli.progress import make_progress
from depthlens.config import (
    AnswerConfig,
    DTRConfig,
    EngineConfig,
    OnlineConfig,
    ReadoutConfig,
    SamplingConfig,
)
from depthlens.errors import InputError

if TYPE_CHECKING:
    from depthlens.voting.online import OnlineSummary

_O = OnlineConfig()

Online = Annotated[
    bool,
    typer.Option(
        "--online",
        help="Online Think@n (docs/architecture.md): warm-up sets τ, later responses stop early, "
        "sampling stops at consensus.",
    ),
]
SignalOpt = Annotated[
    str, typer.Option("--signal", help="Online signal: dtr (prefix DTR) or confidence (DeepConf's peer).")
]
Warmup = Annotated[
    int, typer.Option("--warmup", help="Online: responses per question generated in full first.")
]
MaxN = Annotated[int, typer.Option("--max-n", help="Online: most responses started per question.")]
Consensus = Annotated[
    float,
    typer.Option("--consensus", help="Online: stop once the leading answer holds this share, (0.5, 1]."),
]
DeepconfWindow = Annotated[
    int, typer.Option("--deepconf-window", help="DeepConf's group size in tokens (their 2,048).")
]
Sweep = Annotated[
    bool, typer.Option("--sweep", help="With --online --from: accuracy vs tokens over budgets, CSV + figure.")
]


def online_config(
    signal: str,
    warmup: int,
    max_n: int,
    consensus: float,
    eta: float,
    prefix: int | None,
    window: int,
    batch: int,
) -> OnlineConfig:
    if prefix is None:
        raise InputError("--online decides on a finite --prefix ℓ; 'full' is an offline ablation")
    return OnlineConfig(signal, warmup, max_n, consensus, eta, prefix, window, batch)  # type: ignore[arg-type]


def task_info(
    task: str, questions: int | None, task_seed: int, task_config: str | None, data: Path | None
) -> dict[str, Any]:
    """How the questions were made, as a store's manifest records it."""
    return {"name": task, "questions": questions, "task_seed": task_seed, "task_config": task_config,
            "data": str(data) if data else None}  # fmt: skip


def run_live(
    *,
    online: OnlineConfig,
    out: Path,
    model: str,
    task: str,
    data: Path | None,
    questions: int | None,
    task_seed: int,
    task_config: str | None,
    seed: int,
    sampling: SamplingConfig,
    dtr: DTRConfig,
    divergence: str,
    device: str,
    dtype: str,
    trust_remote_code: bool,
    resume: bool,
    overwrite: bool,
    answers: AnswerConfig,
    engine: EngineConfig = EngineConfig(),
) -> None:
    from depthlens.studies.online import check_online, online_store
    from depthlens.studies.tasks import load_task, parse_task_config

    check_online(online, sampling)  # before the task, the model or any generation
    qs = load_task(task, questions, task_seed, data, parse_task_config(task_config))
    lm = load_model(model, device, dtype, trust_remote_code)
    with make_progress(err_console) as progress:
        done = progress.add_task("questions", total=len(qs))
        tokens = progress.add_task("tokens", total=None)
        report = online_store(
            lm, out, qs, online=online, seed=seed, sampling=sampling,
            readout=ReadoutConfig(divergence=divergence), dtr=dtr,  # type: ignore[arg-type]
            resume=resume, overwrite=overwrite, task=task_info(task, questions, task_seed, task_config, data),
            answers=answers, engine=engine,
            on_question=lambda o: progress.advance(done, 1), on_token=lambda n: progress.advance(tokens, n),
        )  # fmt: skip
    table = Table(title=f"online think@n · signal {online.signal} · {lm.name}", title_justify="left")
    for column in ("questions", "accuracy %", "tokens / question", "stopped by"):
        table.add_column(column, justify="right")
    n = max(report.questions, 1)
    stops = ", ".join(f"{k} {v}" for k, v in sorted(report.stops.items()))
    table.add_row(
        str(report.questions), f"{100 * report.correct / n:.1f}", f"{report.tokens / n:,.0f}", stops
    )
    console.print(table)
    err_console.print(
        f"decisions: {out / 'online.jsonl'} (replay with `depthlens thinkn --online --from {out}`)"
    )


def run_replay(
    *, online: OnlineConfig, store: Path, dtr: DTRConfig, trials: int, seed: int, sweep: bool, n: int = 16
) -> None:
    from depthlens.cli.paired_view import power_line
    from depthlens.studies.online import budget_sweep
    from depthlens.studies.paired_tables import replay_paired
    from depthlens.studies.tables import write_csv
    from depthlens.studies.thinkn import read_manifest

    manifest = read_manifest(store)
    with err_console.status("replaying"):
        replayed = replay_paired(store, online, dtr, trials, seed, n)
    holes, summary = replayed.holes, replayed.summary
    if holes:
        err_console.print(f"[yellow]{len(holes)} question(s) left out (a failed or missing response):[/] "
                          + ", ".join(holes[:10]))  # fmt: skip
    _print_summaries([summary], f"online replay · {manifest['model']} · {store}")
    c = replayed.comparison
    if c is not None:
        err_console.print(
            f"Cons@n beside it: n = {n} drawn per trial.", power_line([c], c.method), highlight=False
        )
    payload: dict[str, Any] = {"store": str(store), "online": online.to_dict(), "dtr": dtr.to_dict(),
                               "summary": summary.to_dict()}  # fmt: skip
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
    for column in ("signal", "β", "max n", "accuracy %", "tokens / question", "started", "consensus stops"):
        table.add_column(column, justify="right")
    for s in summaries:
        table.add_row(
            s.signal, f"{s.consensus:g}", str(s.max_n), f"{100 * s.accuracy_mean:.1f} ± {100 * s.accuracy_std:.1f}",
            f"{s.cost_mean:,.0f} ± {s.cost_std:,.0f}", f"{s.started_mean:.1f}", f"{100 * s.consensus_rate:.0f} %",
        )  # fmt: skip
    console.print(table)
    err_console.print(
        f"{summaries[0].trials} sampling orders × {summaries[0].questions} questions (order 0 = as stored)"
    )
