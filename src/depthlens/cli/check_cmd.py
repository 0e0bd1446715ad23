"""``depthlens check``: a store's files against its manifest (like ``git fsck``), with the safe remedy for each."""

from __future__ import annotations

import typer

from depthlens.cli import options as opt
from depthlens.cli.app import app, console

INCOMPLETE = 3
"""``check``'s exit status for a store whose records are whole but fewer than its run set out to write."""


@app.command("check", short_help="Check a store's files against its manifest; say how to mend each problem.")
def check(
    store: opt.StoreArg,
    quick: opt.Quick = False,
) -> None:
    """Verify every shard against the manifest — present, its size, row count, ids, run and content hash — and
    list what is missing, cut, changed, of another run, or not listed, each with its one safe remedy.

    Reads only. Exit status 0 when the store is whole, 1 when a problem was found, 3 when its records are whole
    but fewer than its run set out to write (questions × pool responses, or its input's records): interrupted,
    or cut by hand.
    """
    from depthlens.stores.check import check as check_store
    from depthlens.stores.check import own_remedy

    reports = check_store(store, verify=not quick)
    problems, incomplete = 0, []
    for report in reports:
        console.print(
            f"{report.store}: {report.shards} shard(s), {report.records} committed record(s)"
            if report.store.is_dir()
            else f"{report.store}: {report.records} record(s)",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        for note in report.notes:
            console.print(f"  note: {note}", highlight=False, soft_wrap=True, markup=False)
        for p in report.problems:
            console.print(
                f"  {p.kind}: {p.path}: {p.detail}\n    remedy: {own_remedy(p.remedy)}",
                highlight=False,
                soft_wrap=True,
                markup=False,
            )
        problems += len(report.problems)
        if report.incomplete is not None:
            incomplete.append(report.incomplete)
    if problems:
        console.print(f"{problems} problem(s)", highlight=False)
        raise typer.Exit(1)
    if incomplete:
        for line in incomplete:
            console.print(line, highlight=False, soft_wrap=True, markup=False)
        raise typer.Exit(INCOMPLETE)
    console.print("ok: every committed record is whole", highlight=False)
