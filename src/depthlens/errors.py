"""Every error depthlens raises on purpose: what was received, what was expected, and the fix.

An error about one setting names the *setting* (``setting``: a config field's name, ``lens``), the value and what
it must be (``requirement``), and any setting it mentions as ``named('max_n')`` — or, set to a value, as
``named('n', 3)`` —, never how a front spells it: each front phrases it (``phrased``) — the command line as
``--lens tuned:x: …`` and ``use --n 3`` (``cli.flags``), Python as ``lens='tuned:x': …`` and ``use n=3`` (the
default ``str``), the server as ``depthlens.lens 'tuned:x': …`` (``serve.errors``). A setting that runs but cannot
mean much is a ``DepthlensWarning``, a value of the same shape that each front shows in its own words."""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable, Iterable
from pathlib import Path

_NAMED = re.compile(r"‹([a-z_][a-z0-9_]*)(?:=([^›]*))?›")
_BARE = object()


class Written(str):
    """A value shown as it is written on every front, never quoted: a placeholder (``K`` in
    ``named('layer_top_k', Written('K'))``) or a number already formatted (``Written(f"{g:g}")``)."""

    def __repr__(self) -> str:
        return str(self)


def named(setting: str, value: object = _BARE) -> str:
    """``setting`` named inside an error's text (``f"pass {named('resume')} to continue"``), or the setting set to
    ``value`` (``f"use {named('n', 3)} or less"``): each front spells it its own way when it phrases the error
    (``--n 3`` on the command line, ``n=3`` in Python, ``depthlens.think.n 3`` in a request)."""
    return f"‹{setting}›" if value is _BARE else f"‹{setting}={value!r}›"


Spell = Callable[[str], str]
"""A front's spelling of a setting's name (``eta`` → ``--eta``)."""
Assign = Callable[[str, str], str]
"""A front's spelling of a setting set to a value: (the setting, the value's ``repr``) → text (``--n 3``)."""


def plain(value: str) -> str:
    """A value's ``repr`` as a command line or a request writes it (``'tuned:x'`` → ``tuned:x``)."""
    try:
        literal = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value
    return literal if isinstance(literal, str) else value


def keyword(setting: str, value: str) -> str:
    """A setting set to a value as Python writes it: ``n=3``, ``lens='tuned:x'``, ``tokens=True``."""
    return f"{setting}={value}"


def spaced(spell: Spell) -> Assign:
    """A setting set to a value as a command line or a request writes it: its name, a space, the value
    (``--n 3``, ``depthlens.think.n 3``)."""
    return lambda setting, value: f"{spell(setting)} {plain(value)}"


def spelt(text: str, spell: Spell | None = None, assign: Assign | None = None) -> str:
    """``text`` with every ``named`` setting in it spelt by ``spell`` and, set to a value, by ``assign`` (``spell``
    None: as Python reads it — the bare name, ``name=value``)."""
    if spell is None:
        spell, assign = str, assign or keyword
    to = assign or spaced(spell)
    return _NAMED.sub(lambda m: spell(m.group(1)) if m.group(2) is None else to(m.group(1), m.group(2)), text)


class Said:
    """What an error or a warning about one setting carries, and its phrasing by a front.

    ``setting`` / ``value`` / ``requirement`` are set where it is about one setting (``config.base.invalid``, or
    raised with them); ``owner`` is the config class holding it, ``hint`` a gloss a Python caller reads after the
    requirement. Any other setting the text mentions is ``named``."""

    setting: str | None
    value: object
    requirement: str
    owner: str | None
    hint: str
    template: str

    def _said(
        self, message: str, setting: str | None, value: object, requirement: str, owner: str | None, hint: str
    ) -> str:
        """Keep what was said; the message as Python reads it."""
        self.setting, self.value, self.requirement, self.owner, self.hint = (
            setting,
            value,
            requirement,
            owner,
            hint,
        )
        if not message and setting is not None:
            where = "; ".join(p for p in (f"{owner}.{setting}" if owner else "", hint) if p)
            message = self.phrased(f"{setting}=", repr_value=True) + (f" ({where})" if where else "")
        self.template = message  # settings still ``named``: each front spells them (``phrased``)
        return spelt(message)

    def phrased(
        self,
        name: str | None = None,
        *,
        repr_value: bool = False,
        spell: Spell | None = None,
        assign: Assign | None = None,
    ) -> str:
        """The text as a front spells its setting ``name`` (``--lens``, ``lens=``, ``depthlens.lens``; None: as
        Python reads it) and every other setting it names (``spell`` / ``assign``: the front's spellings)."""
        if self.setting is None or not self.requirement or name is None:
            return spelt(self.template, spell, assign)
        value = repr(self.value) if repr_value else str(self.value)
        joiner = "" if name.endswith("=") else " "
        requirement = self.requirement.replace(named(self.setting), name.removesuffix("="))  # named again
        return f"{name}{joiner}{value}: {spelt(requirement, spell, assign)}"


class DepthlensError(Said, Exception):
    """Base class: the CLI turns any of these into a one-line message and exit code 2 (``Said``: what it is
    about, phrased by each front)."""

    def __init__(
        self,
        message: str = "",
        *,
        setting: str | None = None,
        value: object = None,
        requirement: str = "",
        owner: str | None = None,
        hint: str = "",
    ) -> None:
        super().__init__(self._said(message, setting, value, requirement, owner, hint))


class DepthlensWarning(Said, RuntimeWarning):
    """A setting that runs but cannot mean much (``studies.runs.degenerate``): the run goes on, and each front
    says it in its own words — a ``warning:`` line on the command line, ``warnings.warn`` in Python."""

    def __init__(
        self, message: str = "", *, setting: str | None = None, value: object = None, requirement: str = ""
    ) -> None:
        super().__init__(self._said(message, setting, value, requirement, None, ""))


class ConfigError(DepthlensError, ValueError):
    """A setting is out of range or unknown (``config.base.invalid``)."""


class UnsupportedArchitectureError(DepthlensError):
    """The model's layers, final norm or unembedding could not be located."""


class ModelNotFoundError(DepthlensError):
    """A model name is neither a catalogue entry, a local path nor a reachable hub id."""


class ModelInstallError(DepthlensError):
    """Fetching or verifying a catalogue model failed."""


class InputError(DepthlensError, ValueError):
    """A record of the input is malformed, empty where it must not be, or too long for the model."""


class NonFiniteError(DepthlensError, FloatingPointError):
    """A hidden state or logit is NaN or infinite."""


class StoreError(DepthlensError):
    """An output file cannot be resumed: it belongs to another configuration or is corrupt."""


class ClusterError(DepthlensError):
    """Ray is missing, its cluster cannot be reached, or a Ray worker failed."""


def close_names(name: str, known: Iterable[str], cutoff: float = 0.6) -> list[str]:
    """The known names closest to ``name``: the same but for underscores, dashes or case (``chainsum`` →
    ``chain_sum``), else up to three close spellings (``difflib``)."""
    known = list(known)

    def squash(text: str) -> str:
        return text.replace("_", "").replace("-", "").lower()

    same = [k for k in known if squash(k) == squash(name)]
    return same or difflib.get_close_matches(name, known, n=3, cutoff=cutoff)


def did_you_mean(name: str, known: Iterable[str], prefix: str = "", cutoff: float = 0.6) -> str:
    """``"; did you mean chain_sum?"`` (each suggestion after ``prefix``), or ``""`` where nothing is close."""
    close = close_names(name, known, cutoff)
    return f"; did you mean {' or '.join(prefix + c for c in close)}?" if close else ""


def near_paths(path: Path) -> str:
    """``"; did you mean runs/inputs.jsonl?"`` for the files beside a missing ``path`` whose names are close to
    its name; ``""`` where none is (or its folder is missing too)."""
    folder = path.parent
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return ""
    # a file name shares its suffix with many: only a near spelling of the whole name is suggested
    return did_you_mean(path.name, names, "" if folder == Path(".") else f"{folder}/", cutoff=0.8)


def missing_path(path: Path, what: str) -> str:
    """``"<what> 'runs/in.jsonl' does not exist"``, with ``near_paths``'s suggestion or the missing folder."""
    if not path.parent.is_dir():
        return f"{what} {str(path)!r} does not exist (nor does its folder {str(path.parent)!r})"
    return f"{what} {str(path)!r} does not exist{near_paths(path)}"
