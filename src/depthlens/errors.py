"""Every error depthlens raises on purpose: what was received, what was expected, and the fix."""

from __future__ import annotations


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
