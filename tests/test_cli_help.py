"""Help that cannot drift (issue 39): every flag a command's help names is an option of that command, every flag
the config's error table names is an option of some command, and docs/cli.md's (and docs/serve.md's) option tables
name exactly each command's options, with the defaults ``--help`` shows."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

import depthlens.config as config
from depthlens.cli.app import app
from depthlens.errors import ConfigError

DOCS = Path(__file__).resolve().parent.parent / "docs"
CLI = typer.main.get_command(app)


def _commands(command: Any = CLI, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    if path:
        yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands())


def _options(command: Any) -> dict[str, Any]:
    """Every flag of ``command`` (aliases and ``--no-`` forms included) → its parameter; ``--help`` left out."""
    return {
        flag: param
        for param in command.params
        for flag in (*param.opts, *param.secondary_opts)
        if flag.startswith("-")
    }


def _named_flags(text: str) -> Iterator[tuple[str, str]]:
    """(command, flag) for every flag ``text`` names: a flag written after a command's name (``depthlens thinkn
    --online --from``, ``generate --task``) is that command's, every other one the text's own (command '')."""
    qualified = "|".join(re.escape(name) for name in sorted(COMMANDS, key=len, reverse=True))
    phrase = re.compile(rf"(?<![\w-])({qualified})((?:\s+--[a-z][a-z0-9-]*(?:\s+[A-Z]+)?)+)")
    spans = []
    for match in phrase.finditer(text):
        spans.append(match.span(2))
        for flag in re.findall(r"--[a-z][a-z0-9-]*", match.group(2)):
            yield match.group(1), flag
    for match in re.finditer(r"(?<![\w-])--[a-z][a-z0-9-]*", text):
        if not any(start <= match.start() < end for start, end in spans):
            yield "", match.group()


def _help_texts(command: Any) -> list[str]:
    texts = [command.help or "", command.short_help or ""]
    return texts + [getattr(param, "help", None) or "" for param in command.params]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_names_only_the_commands_own_flags(name):
    """`generate --help` once explained --readout-tokens by --ablation, which only thinkn has."""
    command = COMMANDS[name]
    wrong = []
    for text in _help_texts(command):
        for owner, flag in _named_flags(text):
            if flag not in _options(COMMANDS.get(owner, command)) | {"--help": None}:
                wrong.append(f"{owner or name} {flag}")
    assert not wrong, f"depthlens {name} --help names flags that are not its options: {wrong}"


def test_config_errors_name_real_flags():
    """``cli.flags.FLAGS`` (and the default ``--field-name``) maps every field of a validated config to a flag some
    command has, or to None: a ConfigError never names a flag that does not exist."""
    from depthlens.cli.flags import flag_for, flag_line

    every = set().union(*(_options(c) for c in COMMANDS.values()))
    classes = [
        config.ReadoutConfig,
        config.DTRConfig,
        config.TCBConfig,
        config.SamplingConfig,
        config.EngineConfig,
        config.AnswerConfig,
        config.VotingConfig,
        config.CorrelationConfig,
        config.OnlineConfig,
        config.RayConfig,
        config.ServeConfig,
    ]
    missing = [
        f"{cls.__name__}.{field.name} → {flag}"
        for cls in classes
        for field in dataclasses.fields(cls)
        if (flag := flag_for(cls.__name__, field.name)) is not None and flag not in every
    ]
    assert not missing, missing
    with pytest.raises(ConfigError) as raised:
        config.VotingConfig(eta=1.5)
    assert flag_line(raised.value) == "--eta 1.5: must be in (0, 1]"  # the command line's phrasing
    assert (
        str(raised.value) == "eta=1.5: must be in (0, 1] (VotingConfig.eta; the share of n kept)"
    )  # Python's


# ---- docs/cli.md's option tables against --help --------------------------------------------------------------

MARKER = re.compile(r"<!-- options: (.+?) -->")
# thinkn takes generate's options, documented once in generate's tables ("all of generate's options").
INHERITS = {"thinkn": "generate"}


@dataclasses.dataclass
class Row:
    where: str
    commands: list[str]
    flags: list[str]
    defaults: list[str | None]  # None: the row states no default


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _row_flags(cell: str) -> list[str]:
    """The flags of a table's first cell: ``--g``, ``--final-norm/--no-final-norm`` (its first), ``--model, -m``
    (its first), ``--questions N`` (metavar dropped)."""
    flags = []
    for code in re.findall(r"`([^`]+)`", cell):
        names = [n for n in re.split(r"[\s,/]+", code) if n.startswith("-")]
        flags += names[:1]
    return flags


def _split_defaults(cell: str, count: int) -> list[str | None]:
    if count > 1:
        for sep in (" / ", ", "):
            parts = cell.split(sep)
            if len(parts) == count:
                return [p.strip() for p in parts]
    return [cell] * count


def _table(lines: list[str], start: int) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of each row of the table whose header is ``lines[start]``."""
    for j in range(start + 2, len(lines)):
        if not lines[j].startswith("|"):
            return
        yield j + 1, _cells(lines[j])


def _doc_rows(path: Path) -> Iterator[Row]:
    """Every row of every option table in ``path``: a table after ``<!-- options: CMD[, CMD…] -->`` (option |
    default | meaning), and the rows of a ``| command | … | options |`` table (``--split`` (4))."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if marker := MARKER.search(line):
            commands = [c.strip() for c in marker.group(1).split(",")]
            assert _cells(lines[i + 1])[:2] == ["option", "default"], f"{path.name}:{i + 2}: option | default"
            for number, cells in _table(lines, i + 1):
                flags = _row_flags(cells[0])
                yield Row(f"{path.name}:{number}", commands, flags, _split_defaults(cells[1], len(flags)))
        elif line.startswith("| command |") and _cells(line)[-1] == "options":
            for number, cells in _table(lines, i):
                words = re.findall(r"`([^`]+)`", cells[0])[0].split()  # `tcb regimes --out DIR`
                command = " ".join(w for w in words if w.isalpha() and w.islower())
                for flag, default in re.findall(r"`(--[a-z0-9/-]+)`(?: \(`?([^)`]+)`?\))?", cells[-1]):
                    yield Row(f"{path.name}:{number}", [command], [flag.split("/")[0]], [default or None])


ROWS = [row for doc in ("cli.md", "serve.md") for row in _doc_rows(DOCS / doc)]


def _shown_default(param: Any) -> str | None:
    """The default ``--help`` shows, as the docs write it (``off`` / ``on`` for a flag); None where it shows none."""
    if getattr(param, "is_flag", False):
        return "on" if param.default else "off"
    if param.default is None or param.default == "":
        return None
    return str(param.default)


def _same(documented: str, shown: str) -> bool:
    documented = re.sub(r"\s*\(.*\)$", "", documented.replace("`", "")).strip()  # "1048576 (1 MiB)"
    try:
        return float(documented) == float(shown)
    except ValueError:
        return documented == shown


def test_every_documented_option_is_one_with_the_default_help_shows():
    wrong = []
    for row in ROWS:
        for name in row.commands:
            options = _options(COMMANDS[name])
            for flag, default in zip(row.flags, row.defaults, strict=True):
                if flag not in options:
                    wrong.append(f"{row.where}: `depthlens {name}` has no {flag}")
                    continue
                shown = _shown_default(options[flag])
                if shown is not None and (default is None or not _same(default, shown)):
                    wrong.append(f"{row.where}: {name} {flag} defaults to {shown}, the docs say {default}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", sorted(n for n, c in COMMANDS.items() if _options(c)))
def test_every_option_of_a_command_is_documented(name):
    documented = {
        f for row in ROWS if name in row.commands or INHERITS.get(name) in row.commands for f in row.flags
    }
    params = {id(p): p for p in _options(COMMANDS[name]).values() if p.name != "help"}
    missing = [p.opts[0] for p in params.values() if not set(p.opts) & documented]
    assert not missing, f"docs/cli.md has no table row for `depthlens {name}` {missing}"


def test_the_docs_name_the_manifest_a_store_writes():
    from depthlens.stores.layout import MANIFEST

    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert MANIFEST in text and not re.search(r"(?<![_\w.])manifest\.json", text)


def test_no_option_type_name_is_exported_twice():
    """`cli/options/` re-exports every module's names as `opt`: a name in two modules would silently resolve to the
    last one imported (a sampling `TopK` once became the TCB study's `--top-k` on `generate`)."""
    import importlib
    import pkgutil

    from depthlens.cli import options

    owners: dict[str, str] = {}
    for module in pkgutil.iter_modules(options.__path__):
        for name in getattr(importlib.import_module(f"{options.__name__}.{module.name}"), "__all__", []):
            assert name not in owners, f"{name} exported by both {owners[name]} and {module.name}"
            owners[name] = module.name
