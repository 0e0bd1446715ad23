"""``depthlens models``: the offline catalogue, and installing from it."""

from __future__ import annotations

import shutil

from rich.table import Table

from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console
from depthlens.cli.progress import install_with_progress
from depthlens.models import catalogue


@app.command("models", short_help="List the offline model catalogue; install from it.")
def models(
    install: opt.Install = None,
    reinstall: opt.Reinstall = None,
) -> None:
    """List the models depthlens can load offline, and whether each is installed (or damaged)."""
    names = list(catalogue.CATALOGUE) if install and "all" in install else (install or [])
    for name in [*names, *(reinstall or [])]:
        catalogue.entry(name)  # unknown name: error before any download
    for name in reinstall or []:
        shutil.rmtree(catalogue.converted_dir(name), ignore_errors=True)
    for name in [*names, *(n for n in reinstall or [] if n not in names)]:
        if catalogue.is_installed(name):
            err_console.print(f"{name}: already installed at {catalogue.converted_dir(name)}")
            continue
        path = install_with_progress(name, err_console)
        err_console.print(f"{name}: installed at {path}")
    # The description sits under the name, so the table fits 80 columns.
    installed = {name: catalogue.is_installed(name) for name in catalogue.CATALOGUE}
    damaged = {name: d for name in catalogue.CATALOGUE if installed[name] and (d := catalogue.damage(name))}
    table = Table(title=f"Offline catalogue (cache: {catalogue.cache_dir()})")
    table.add_column("name · description")
    for column in ("layers", "GGUF", "weights", "installed"):
        table.add_column(column, justify="right", no_wrap=True)
    for item in catalogue.CATALOGUE.values():
        default = " (default)" if item.name == catalogue.DEFAULT_MODEL else ""
        table.add_row(
            f"[bold]{item.name}[/]{default}\n[dim]{item.description}[/]",
            str(item.n_layers),
            f"{item.size_bytes / 1e6:.0f} MB",
            item.quantisation,
            "[red]damaged[/]" if item.name in damaged else "[green]yes[/]" if installed[item.name] else "no",
        )
    console.print(table)
    err_console.print(
        "weights: the GGUF's quantisation, dequantised to float32 on install; the lens reads that quantised "
        "model (docs/definitions.md)",
        highlight=False,
        soft_wrap=True,
    )
    for name, damage in damaged.items():  # below the table: the explanation would not fit a column
        err_console.print(
            f"{name} is damaged ({damage}); reinstall it with: depthlens models --reinstall {name}",
            highlight=False,
            soft_wrap=True,
        )
