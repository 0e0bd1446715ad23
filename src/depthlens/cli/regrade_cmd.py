"""``depthlens regrade``: read a store's answers again under the current rules (no model, no generation)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console, warn

if TYPE_CHECKING:
    from depthlens.studies.regrade import RegradeReport


def print_regrade(report: RegradeReport) -> None:
    """The store before and after: answers per source, grades, and what changed."""
    b, a = report.before, report.after
    console.print(
        f"{report.store}: {report.rules_before} → {report.rules_after}, {report.responses} responses "
        f"({a.prompt_style} prompts, fallback {a.fallback})",
        soft_wrap=True,
        highlight=False,
    )
    table = Table()
    for column in ("", "before", "after"):
        table.add_column(column, justify="left" if not column else "right")
    for source in a.sources:
        table.add_row(f"answer from {source}", str(b.sources.get(source, 0)), str(a.sources[source]))
    for status in ("correct", "wrong", "no_answer", "unparsed"):
        table.add_row(
            f"graded {status}",
            str(report.grades_before.get(status, 0)),
            str(report.grades_after.get(status, 0)),
        )
    accuracy = [
        g.get("correct", 0) / report.responses if report.responses else 0.0
        for g in (report.grades_before, report.grades_after)
    ]
    table.add_row("accuracy per response %", f"{100 * accuracy[0]:.1f}", f"{100 * accuracy[1]:.1f}")
    table.add_row("truncated (cut at the token cap)", str(b.truncated), str(a.truncated))
    table.add_row(
        "questions with no answer at all", str(len(b.unanswered_questions)), str(len(a.unanswered_questions))
    )
    console.print(table)
    if report.wrong_references:
        first, why = next(iter(report.wrong_references.items()))
        warn(
            f"{report.store}: {len(report.wrong_references)} question(s) carry a reference answer their own "
            f"arithmetic contradicts (e.g. {first}: {why}); their responses are graded against it — regenerate "
            "the store, which now skips such questions (docs/definitions.md §5)"
        )
    err_console.print(
        f"{report.changed_answer} response(s) changed answer, {report.changed_grade} changed grade; the previous "
        "answer fields are kept in each record's answer_history"
        + ("; its summaries re-voted with their own settings" if report.summary_rewritten else ""),
        highlight=False,
    )


@app.command("regrade")
def regrade(
    stores: opt.SampleStores,
    answer_type: opt.AnswerTypeOpt = None,
    answer_fallback: opt.RegradeFallback = None,
    store_format: opt.StoreFormatOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            file_okay=False,
            help="Regrade a copy written here (a new directory) and leave the store as it was.",
        ),
    ] = None,
) -> None:
    """Re-extract and re-grade stored responses under the current answer rules, in place or (--out) into a copy
    (docs/definitions.md §5).

    No model and no generation: reasoning-gym questions are regenerated from the store's seed and config, so
    each dataset's own scorer grades them. Each record keeps its previous answer in answer_history.
    """
    from depthlens.cli.specs import answer_config
    from depthlens.errors import InputError
    from depthlens.studies.regrade import regrade_copy, regrade_store

    answer_config("paper", answer_type, answer_fallback or "none")  # checks the values before any work
    if out is not None and len(stores) != 1:
        raise InputError(f"--out copies one store; {len(stores)} were given: regrade them one at a time")
    from depthlens.stores.samples import picking

    for store in stores:
        with picking(store_format), err_console.status(f"regrading {store}"):
            if out is None:
                report = regrade_store(store, answer_type, answer_fallback)
            else:
                report = regrade_copy(store, out, answer_type, answer_fallback)
        print_regrade(report)
