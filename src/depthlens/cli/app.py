"""``depthlens``: the typer app. Each verb lives in its own module; heavy imports happen inside commands."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from depthlens.errors import ConfigError, DepthlensError

if TYPE_CHECKING:
    from depthlens.models.load import LoadedModel

app = typer.Typer(
    name="depthlens",
    help="How deeply and how stably a causal language model thinks: logit-lens DTR and its baselines. "
    "Every metric is defined in docs/definitions.md.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # click's plain help wraps within 80 columns and shows flags as flags
    context_settings={"help_option_names": ["-h", "--help"]},
)
err_console = Console(stderr=True)
console = Console()  # results (tables) go to stdout

# Config fields whose command-line flag is not ``--`` + the field name with dashes.
_FLAGS = {"also": "--also-divergences", "compile": "--compile"}
# Config fields without a flag of their own: their errors keep the config's wording.
_NO_FLAG = {"vocab_size", "early_exit", "power_iterations", "deepconf_window", "confidence_top_k"}


def _version(value: bool) -> None:
    if value:
        from depthlens import __version__

        console.print(f"depthlens {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit."),
    ] = False,
) -> None:
    """Options of ``depthlens`` itself (the app's ``help`` above is what ``-h`` shows)."""


def error_line(exc: DepthlensError) -> str:
    """The one line a user reads: a config error names the flag that set it (``--rho 1.5: must be in (0, 1]``)."""
    if isinstance(exc, ConfigError) and exc.setting and exc.requirement and exc.setting not in _NO_FLAG:
        flag = _FLAGS.get(exc.setting, "--" + exc.setting.replace("_", "-"))
        return f"{flag} {exc.value}: {exc.requirement}"
    return str(exc)


def warn(message: str) -> None:
    """One warning line on stderr: the run goes on and its results are written."""
    err_console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def load_model(model: str, device: str, dtype: str, trust_remote_code: bool) -> LoadedModel:
    """Load ``model`` for a command: a first install as a progress display, then a status line."""
    from depthlens.cli.progress import install_with_progress, quiet_transformers
    from depthlens.models.locate import locate

    source = locate(model)  # a name that points nowhere fails now, in milliseconds
    if source.kind == "catalogue" and source.path is None:
        install_with_progress(model, err_console)
    from depthlens.models.load import load

    quiet_transformers()
    with err_console.status(f"loading {model}") as status:
        return load(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code,  # type: ignore[arg-type]
                    progress=status.update, on_offline=warn)  # fmt: skip


# Registration by import: each module adds its command to ``app``.
from depthlens.cli import models_cmd, score_cmd, study_cmd, tcb_cmd, thinkn_cmd  # noqa: E402, F401


def main() -> None:
    """Entry point: a DepthlensError becomes one line on stderr and exit code 2."""
    try:
        app()
    except DepthlensError as exc:
        err_console.print(f"[bold red]error:[/] {error_line(exc)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted; finished records are kept — rerun with --resume to continue")
        sys.exit(130)
