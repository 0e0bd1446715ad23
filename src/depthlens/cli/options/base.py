"""The one check an option type carries: typer's ranges let nan and ±inf through (nan compares false)."""

from __future__ import annotations

import math

import typer


def finite(value: float | None) -> float | None:
    """Callback of every float option: a finite number, or typer's one-line error naming the option."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, not {value}")
    return value
