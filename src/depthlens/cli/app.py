"""``depthlens``: the typer app. Each verb lives in its own module; heavy imports happen inside commands."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from depthlens.errors import DepthlensError

if TYPE_CHECKING:
    from depthlens.models.load import LoadedModel

app = typer.Typer(
    name="depthlens",
    help="How deeply and how stably a causal language model thinks: logit-lens DTR and its baselines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err_console = Console(stderr=True)
console = Console()  # results (tables) go to stdout


def load_model(model: str, device: str, dtype: str, trust_remote_code: bool) -> LoadedModel:
    """Load ``model`` for a command, its slow steps shown on a status line."""
    from depthlens.models.load import load

    with err_console.status(f"loading {model}") as status:
        return load(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code,  # type: ignore[arg-type]
                    progress=status.update)  # fmt: skip


# Registration by import: each module adds its command to ``app``.
from depthlens.cli import models_cmd, regrade_cmd, score_cmd, study_cmd, tcb_cmd, thinkn_cmd  # noqa: E402, F401


def main() -> None:
    """Entry point: a DepthlensError becomes one line on stderr and exit code 2."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own status line and progress bars say what is happening
    try:
        app()
    except DepthlensError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted; finished records are kept — rerun with --resume to continue")
        sys.exit(130)
