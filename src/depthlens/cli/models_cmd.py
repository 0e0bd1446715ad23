"""``depthlens models``: the offline catalogue, and installing from it."""

from __future__ import annotations

import shutil
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from depthlens.cli.app import app, err_console
from depthlens.models import catalogue


def _state(name: str) -> str:
    if not catalogue.is_installed(name):
        return "no"
    damage = catalogue.damage(name)
    return f"[red]damaged[/] ({damage}; use --reinstall {name})" if damage else "[green]yes[/]"


@app.command("models")
def models(
    install: Annotated[
        list[str] | None,
        typer.Option("--install", help="Install this catalogue model (repeatable; 'all' for every one)."),
    ] = None,
    reinstall: Annotated[
        list[str] | None,
        typer.Option(
            "--reinstall", help="Delete this model's converted copy and install it again (repeatable)."
        ),
    ] = None,
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
        with err_console.status(f"{name}: starting") as status:
            path = catalogue.install(name, progress=lambda line, n=name: status.update(f"{n}: {line}"))
        err_console.print(f"{name}: installed at {path}")
    table = Table(title=f"Offline catalogue (cache: {catalogue.cache_dir()})")
    table.add_column("name", no_wrap=True)
    for column in ("layers", "GGUF size", "installed", "description"):
        table.add_column(column)
    for item in catalogue.CATALOGUE.values():
        table.add_row(
            item.name + (" (default)" if item.name == catalogue.DEFAULT_MODEL else ""),
            str(item.n_layers),
            f"{item.size_bytes / 1e6:.0f} MB",
            _state(item.name),
            item.description,
        )
    Console().print(table)
