"""The config mixin and its checks: every config round-trips through a plain dict (``to_dict`` / ``from_dict``) so a
run's manifest reproduces it; ``from_dict`` rejects keys it does not know rather than silently ignoring a typo.
Errors carry the setting so the CLI names its own flag."""

from __future__ import annotations

import dataclasses
from typing import Any, Self, get_args

from depthlens.errors import ConfigError


class Config:
    """Mixin: dict round-trip with unknown keys rejected."""

    def to_dict(self) -> dict[str, Any]:
        # Tuples become lists, as they come back from a JSON manifest (so a resumed run compares equal).
        data = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown key(s) {unknown}; known keys are {sorted(known)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def invalid(owner: str, name: str, value: object, requirement: str, hint: str = "") -> ConfigError:
    """The error for setting ``owner.name`` = ``value``, structured so the CLI can name its flag instead."""
    message = f"{owner}.{name} = {value!r} {requirement}" + (f" ({hint})" if hint else "")
    return ConfigError(message, setting=name, value=value, requirement=requirement)


def check_choice(owner: str, name: str, value: object, literal: object) -> None:
    choices = get_args(literal)
    if value not in choices:
        raise ConfigError(
            f"{owner}.{name} = {value!r} is not one of {list(choices)}",
            setting=name,
            value=value,
            requirement=f"must be one of {', '.join(choices)}",
        )
