"""Every error depthlens raises on purpose: what was received, what was expected, and the fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


class DepthlensError(Exception):
    """Base class: the CLI turns any of these into a one-line message and exit code 2."""


class ConfigError(DepthlensError, ValueError):
    """A setting is out of range or unknown.

    ``setting`` (the config field), ``value``, ``requirement`` and ``flag`` (the command-line flag that sets it)
    come from ``config.base.invalid``; ``flag_line`` is what the CLI prints: ``--rho 1.5: must be in (0, 1]``.
    """

    def __init__(
        self,
        message: str,
        *,
        setting: str | None = None,
        value: object = None,
        requirement: str = "",
        flag: str | None = None,
    ) -> None:
        super().__init__(message)
        self.setting = setting
        self.value = value
        self.requirement = requirement
        self.flag = flag

    @property
    def flag_line(self) -> str:
        """The error as a command-line user reads it: the flag, the value given and what it must be."""
        if self.flag and self.requirement:
            return f"{self.flag} {self.value}: {self.requirement}"
        return str(self)


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
