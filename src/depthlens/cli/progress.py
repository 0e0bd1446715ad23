"""One set of progress columns shared by every command — plain lines where stderr is a log or a pipe — and the
display of a catalogue model's first install."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def make_progress(console: Console | None = None) -> Any:
    """A command's progress display: rich's bars on a terminal; elsewhere (a log, a pipe, a job's output) plain
    lines, one per item or every 5 % and at least every half minute (``api.progress.Lines``: no cursor escapes,
    and a long run says where it is)."""
    console = console or Console(stderr=True)
    if not console.is_terminal:
        from depthlens.api.progress import Lines

        return Lines(lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True))
    return Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


def quiet_transformers() -> None:
    """Silence transformers' own tqdm bars (loading, writing shards): our displays say what is happening."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def install_with_progress(name: str, console: Console) -> Path:
    """Install catalogue model ``name`` under one progress display: megabytes downloaded, then tensors converted."""
    from depthlens.models import catalogue

    quiet_transformers()
    console.print(f"installing {name} (first use: download, verify, convert once)", highlight=False)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(bar_width=16),
        TextColumn("{task.fields[amount]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("starting", total=None, amount="")

        def on_step(line: str) -> None:
            progress.update(task, description=line, total=None, completed=0, amount="")

        def on_amount(done: int, total: int, unit: str) -> None:
            amount = f"{done / 1e6:.0f}/{total / 1e6:.0f} MB" if unit == "bytes" else f"{done}/{total} {unit}"
            progress.update(task, total=total, completed=done, amount=amount)

        path = catalogue.install(name, progress=on_step, on_amount=on_amount)
        progress.update(task, description="installed", total=1, completed=1, amount="")
    return path
