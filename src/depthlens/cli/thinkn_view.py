"""What ``thinkn`` prints: the vote over a store's pools, its table (accuracy — the exact expectation over every draw
and the trials' mean ± draw s.d. —, tokens per question, cost against Cons@n per method, DeepConf's variants
folded), the paired comparisons, the notes and the ablation."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from depthlens.cli.app import console, err_console
from depthlens.config import DTRConfig, VotingConfig

if TYPE_CHECKING:
    from depthlens.studies.thinkn import ThinkReport


def vote(
    store: Path,
    voting: VotingConfig,
    dtr: DTRConfig,
    methods: list[str] | None,
    ablation: bool,
    overwrite: bool,
    every: bool = False,
) -> None:
    """Vote over the store's pools, print the table (DeepConf folded unless ``every``) and where the summary
    went."""
    from depthlens.studies.thinkn import summarise, summary_stem

    with err_console.status("voting"):
        report = summarise(store, voting, dtr, methods, with_ablation=ablation, overwrite=overwrite)
    print_report(report, store, every)
    if report.voting.trials > 1 and report.info.manifest["pool"] == voting.n:
        err_console.print(
            "note: pool = n, so every trial draws the same responses (draw s.d. 0); use --pool > n"
        )
    stem = store / summary_stem(report.voting)
    err_console.print(f"summary: {stem}.json, {stem}.csv")


def print_report(report: ThinkReport, store: Path | None = None, every: bool = False) -> None:
    """The table ``thinkn`` prints: accuracy, tokens per question, cost against Cons@n, per method — the paper's
    methods first, DeepConf's variants one line per filter (their range over the trace scores) unless ``every``."""
    from depthlens.cli.paired_view import folded

    info = report.info
    v = report.voting
    prefix = "full" if v.rank_prefix is None else v.rank_prefix
    table = Table(
        title=f"{info.manifest['model']} · {(info.manifest.get('task') or {}).get('name', '?')} · n={v.n} "
        f"η={v.eta} ℓ={prefix} · {v.trials} trials × {info.questions - len(info.excluded)} questions",
        title_justify="left",
    )
    from depthlens.studies.tables import METHOD_COLUMNS, folded_cells, method_cells

    table.add_column(METHOD_COLUMNS[0], no_wrap=True)  # never cut: the names are what --methods takes
    for column in METHOD_COLUMNS[1:]:
        table.add_column(column, justify="right")
    cons = next((s for s in report.summaries if s.method == "cons@n"), None)
    plain, groups = folded(report.summaries, lambda s: s.method)
    if every:
        plain, groups = plain + [s for rows in groups.values() for s in rows], {}
    for s in plain:
        table.add_row(*method_cells(s, cons))
    for group, rows in groups.items():
        table.add_row(*folded_cells(group, rows, cons))
    console.print(table)
    if groups:
        err_console.print(
            f"DeepConf: {sum(len(r) for r in groups.values())} variants folded into {len(groups)} lines (the range "
            "over their trace scores); --methods all shows each, as the summary CSV holds them",
            highlight=False,
        )
    if report.paired:
        from depthlens.cli.paired_view import paired_table, verdict_line

        paired = folded(report.paired, lambda c: c.method)[0] if groups else report.paired
        console.print(paired_table(paired, report.control, console.width))
        for line in (verdict_line(report.paired), verdict_line([report.control] if report.control else [])):
            if line is not None:
                err_console.print(line, highlight=False)
    _print_notes(report, store)
    if report.ablation:
        _print_ablation(report.ablation)


def _print_notes(report: ThinkReport, store: Path | None) -> None:
    """How the answers were read, and what was left out of the vote."""
    from depthlens.evals.answers import RULES

    info = report.info
    err_console.print(info.answers.line(), highlight=False)
    if info.answers.rules != RULES:
        err_console.print(
            f"[yellow]these answers were read by older rules ({info.answers.rules}); `depthlens regrade "
            f"{store or 'STORE'}` re-reads them under {RULES}[/]"
        )
    from depthlens.studies.thinkn import vote_notes

    for line in vote_notes(report.summaries, report.voting):
        err_console.print(line, highlight=False)
    if info.excluded:
        err_console.print(
            f"[yellow]{len(info.excluded)} question(s) left out (fewer than n usable responses):[/] "
            + ", ".join(info.excluded[:10])
        )
    if info.failed:
        err_console.print(
            f"[yellow]{len(info.failed)} response(s) failed to generate[/] (status 'failed' in the store)"
        )


def _print_ablation(rows: list[dict[str, Any]]) -> None:
    if rows:
        ab = Table(title="Think@n ablation (same pool)", title_justify="left")
        ab.add_column("method", no_wrap=True)
        for column in ("ℓ_prefix", "η", "accuracy % ± draw s.d.", "cost vs Cons@n"):
            ab.add_column(column, justify="right")
        for row in rows:
            ratio = row["cost_vs_cons"]
            ab.add_row(
                row["method"],
                str(row["prefix"]),
                f"{row['eta']:g}",
                f"{100 * row['accuracy_mean']:.1f} ± {100 * row['accuracy_std']:.1f}",
                f"{ratio:.0%}" if ratio is not None else "—",
            )
        console.print(ab)
