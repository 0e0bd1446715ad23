"""``depthlens``: the typer app. Each verb lives in its own module; heavy imports happen inside commands."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import shlex
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from depthlens.errors import DepthlensError, DepthlensWarning, near_paths

try:  # typer ≥ 0.24 carries its own click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - an older typer on the real click
    from click.exceptions import UsageError  # type: ignore[assignment]  # the same class, from the real click

if TYPE_CHECKING:
    from depthlens.config import EngineConfig, ModelSpec
    from depthlens.models.load import LoadedModel
    from depthlens.models.threads import Work

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
# No emoji codes: a value the user typed (``--settle topk:-1``) is echoed as typed, never as 👎; text that echoes
# input is printed with its markup escaped (or markup off), so ``[bold]`` in a value stays ``[bold]``.
err_console = Console(stderr=True, emoji=False)
console = Console(emoji=False)  # results (tables) go to stdout


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
    """The one line a user reads: an error about a setting names the flag that sets it (``--rho 1.5: must be in
    (0, 1]``; ``cli.flags`` maps the settings to their flags)."""
    from depthlens.cli.flags import flag_line

    return flag_line(exc)


def warn(message: str) -> None:
    """One warning line on stderr: the run goes on and its results are written."""
    err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def load_model(spec: ModelSpec) -> LoadedModel:
    """Load the model ``spec`` names for a command: a first install as a progress display, then a status line."""
    from depthlens.cli.progress import install_with_progress, quiet_transformers
    from depthlens.models.locate import locate

    source = locate(spec.name)  # a name that points nowhere fails now, in milliseconds
    if source.kind == "catalogue" and source.path is None:
        install_with_progress(spec.name, err_console)
    from depthlens.models.load import load

    quiet_transformers()
    with err_console.status(f"loading {spec.name}") as status:
        return load(spec.name, progress=status.update, on_offline=warn, **spec.load_kwargs())


def load_for(engine: EngineConfig, spec: ModelSpec, work: Work = "sample") -> Any:
    """What generation or scoring (``work``) on ``engine`` needs of the model: for hf the loaded model
    (``load_model``), after a line saying the threads it will run on (``models.threads``); for vllm only its
    tokenizer and config (``models.info``) — the engine reads the layers out itself, so no transformers copy of
    the weights is loaded."""
    if engine.backend != "vllm":
        lm = load_model(spec)
        from depthlens.models.threads import threads_line, use_threads

        # set here too for ``serve``, whose sampler is built without ``make_backend``
        use_threads(work, lm.device.type, engine.threads)
        err_console.print(threads_line(work, lm.device.type, engine.threads), highlight=False)
        return lm
    from depthlens.cli.progress import install_with_progress, quiet_transformers
    from depthlens.models.info import load_info
    from depthlens.models.locate import locate

    source = locate(spec.name)
    if source.kind == "catalogue" and source.path is None:
        install_with_progress(spec.name, err_console)
    quiet_transformers()
    with err_console.status(f"reading {spec.name}'s tokenizer and config"):
        return load_info(spec.name, spec.trust_remote_code)


def read_info(spec: ModelSpec) -> Any | None:
    """The model's tokenizer and config (``models.info.ModelInfo``), read without its weights where nothing has to
    be fetched or converted for it — a local directory, an installed catalogue model —, so what they tell (prompt
    lengths against the context) is checked before any weights load; None elsewhere (a .gguf file, a hub id, a
    catalogue model still to install): the loaded model is checked instead, before anything is sampled."""
    from depthlens.models.locate import locate

    source = locate(spec.name)
    if source.path is None or source.kind not in ("directory", "catalogue"):
        return None
    from depthlens.cli.progress import quiet_transformers
    from depthlens.models.info import load_info

    quiet_transformers()
    try:
        return load_info(spec.name, spec.trust_remote_code)
    except DepthlensError:  # no tokenizer or config to read: loading the model says what is wrong
        return None


class Terminated(BaseException):
    """SIGTERM, handled like Ctrl-C: finished records are on disk already (each is fsynced as it completes).
    Not a KeyboardInterrupt: typer turns those into a bare exit code 130, and this one must say 143."""


def _terminate(_signum: int, _frame: object) -> NoReturn:
    raise Terminated


# The store the running command writes its finished records to, once it has opened it.
_written: list[Path] = []


def writes_to(path: Path) -> None:
    """Record that the running command writes its finished records to ``path`` (for the interrupt message)."""
    _written[:] = [path]


def _complete_lines(path: Path) -> int:
    """Finished records in a JSONL store (whole lines) or a Parquet store (rows of its committed shards)."""
    try:
        if path.is_dir():
            # stores.layout's manifest names, not imported: pyarrow would slow the start of every command
            meta = next((path / n for n in ("_manifest.json", "manifest.json") if (path / n).is_file()), None)
            shards = json.loads(meta.read_bytes()).get("shards", []) if meta else []
            return sum(int(s.get("rows", 0)) for s in shards)
        with path.open("rb") as f:
            return sum(1 for raw in f if raw.endswith(b"\n") and raw.strip())
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def continue_command(argv: list[str]) -> str:
    """The command line that continues an interrupted run: the same, with --resume instead of --overwrite."""
    args = [a for a in argv[1:] if a not in ("--overwrite", "--resume")]
    return shlex.join(["depthlens", *args, "--resume"])


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The ``kind`` exception ``exc`` was raised from, if any (walking the chain of causes)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _interrupted(exc: BaseException) -> NoReturn:
    what = "terminated" if isinstance(exc, Terminated) else "interrupted"
    if _written:
        kept = _complete_lines(_written[0])
        err_console.print(
            f"{what}: {kept} finished record(s) kept in {_written[0]}", highlight=False, markup=False
        )
        err_console.print(
            f"continue with: {continue_command(sys.argv)}", highlight=False, soft_wrap=True, markup=False
        )
    else:
        err_console.print(f"{what} before any record was written", highlight=False, markup=False)
    sys.exit(143 if isinstance(exc, Terminated) else 130)


# Registration by import: each module adds its command to ``app``.
from depthlens.cli import (  # noqa: E402, F401
    check_cmd,
    correlate_cmd,
    export_cmd,
    generate_cmd,
    heatmap_cmd,
    lens_cmd,
    models_cmd,
    regrade_cmd,
    report_cmd,
    score_cmd,
    serve_cmd,
    tasks_cmd,
    tcb_cmd,
    thinkn_cmd,
    view_cmd,
)


class _WarnHandler(logging.Handler):
    """The library's own warnings (``depthlens.*`` loggers) as the CLI's warning lines."""

    def emit(self, record: logging.LogRecord) -> None:
        warn(record.getMessage())


@contextlib.contextmanager
def _setting_warnings() -> Iterator[None]:
    """A setting's warning raised in the library (``errors.DepthlensWarning``: a compiled readout that fell back
    to eager) as the CLI's warning line, its settings named as flags (``--compile off``); other warnings as
    Python shows them."""
    from depthlens.cli.flags import flag_line

    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if isinstance(message, DepthlensWarning):
            warn(flag_line(message))
            return
        shown(message, category, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("default", DepthlensWarning)
        warnings.showwarning = show
        yield


def main() -> None:
    """Entry point: a DepthlensError becomes one line on stderr and exit code 2."""
    signal.signal(signal.SIGTERM, _terminate)
    from depthlens.models.threads import passive_wait, threads_kept
    from depthlens.stores.shortfall import forget

    forget()  # a store's shortfall is said once per command (the same process may run another)

    passive_wait()  # before torch starts OpenMP: idle threads sleep instead of spinning (a shared machine)
    library = logging.getLogger("depthlens")
    if not any(isinstance(h, _WarnHandler) for h in library.handlers):
        library.addHandler(_WarnHandler(logging.WARNING))
    library.propagate = False
    try:
        with threads_kept(), _setting_warnings():  # a command's threads and warning display end with it
            code = app(standalone_mode=False)
    except UsageError as exc:  # typer's own option checks (``--n 0``): one line naming the option, as ours
        if type(exc).__name__ == "NoArgsIsHelpError":  # ``depthlens`` alone: the help, as before
            exc.show()
            sys.exit(exc.exit_code)
        err_console.print(f"[bold red]error:[/] {escape(usage_line(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except Terminated as exc:
        _interrupted(exc)
    except DepthlensError as exc:
        # escaped: a message may hold brackets (pip install 'depthlens[vllm]') that are not markup
        err_console.print(f"[bold red]error:[/] {escape(error_line(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (
        OSError
    ) as exc:  # a file that cannot be written (disk full, permissions) where no record was at stake
        where = f"{exc.filename}: " if exc.filename else ""
        hint = "free some space" if exc.errno == errno.ENOSPC else "check the path and its permissions"
        err_console.print(
            f"[bold red]error:[/] {escape(f'{where}{exc.strerror or exc}; {hint}')}",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(2)
    except KeyboardInterrupt as exc:
        _interrupted(exc)
    except SystemExit as exc:  # typer turns Ctrl-C (and so SIGTERM) into exit code 130 on its own
        interrupt = _cause(exc, KeyboardInterrupt)
        if interrupt is None:
            raise
        _interrupted(interrupt)
    if code == 130:  # typer's answer to a KeyboardInterrupt (Ctrl-C) outside its standalone mode
        _interrupted(KeyboardInterrupt())
    sys.exit(code if isinstance(code, int) else 0)  # as typer's standalone mode ends, so callers see one exit


def usage_line(exc: UsageError) -> str:
    """A usage error of typer's (a value out of range, an unknown or missing option) as one line that names the
    option and where the command's options are listed."""
    message = " ".join(exc.format_message().split())
    names, ctx = [], exc.ctx
    while ctx is not None and ctx.parent is not None:  # the verb (and sub-verb), without the program's name
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    command = " ".join(reversed(names))
    missing = re.search(r"path '([^']+)' does not exist\.", message)
    if missing:  # typer's check of an existing --in / store path: name the close files beside it
        message = message.replace(
            missing.group(0), missing.group(0)[:-1] + near_paths(Path(missing.group(1)))
        )
    return f"{message[:1].lower()}{message[1:]}; see `depthlens {command + ' ' if command else ''}--help`"
