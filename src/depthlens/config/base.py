"""The config mixin and its checks: every config round-trips through a plain dict (``to_dict`` / ``from_dict``) so a
run's manifest reproduces it; ``from_dict`` rejects keys it does not know rather than silently ignoring a typo.

Every bad setting is raised by ``invalid``, which names the command-line flag that sets it (``FLAGS``: the one
table of config field ↔ flag), so a user reads ``--rho 1.5: must be in (0, 1]``, never a dataclass field."""

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


FLAGS: dict[tuple[str, str], str | None] = {
    ("ReadoutConfig", "also"): "--also-divergences",
    ("ReadoutConfig", "vocab_size"): None,
    ("ReadoutConfig", "early_exit"): None,
    ("ReadoutConfig", "lens_digest"): None,
    ("TCBConfig", "power_iterations"): None,
    ("LensFitConfig", "ridge"): None,
    ("LensFitConfig", "checkpoint_every"): None,
    ("TCBConfig", "exact"): "--tcb-exact",
    ("SamplingConfig", "confidence_top_k"): None,
    ("AnswerConfig", "fallback"): "--answer-fallback",
    ("CorrelationConfig", "permutations"): None,
    ("CorrelationConfig", "min_responses"): None,
    ("CorrelationConfig", "min_questions"): None,
    ("CorrelationConfig", "min_outcome"): None,
    ("OnlineConfig", "keep"): "--eta",
    ("OnlineConfig", "window"): "--deepconf-window",
    ("OnlineConfig", "threshold"): None,
    ("RayConfig", "address"): "--ray-address",
    ("RayConfig", "block"): "--block-rows",
    ("ServeConfig", "model_id"): "--served-model-name",
}
"""The config fields whose command-line flag is not ``--`` + the field's name with dashes (None: no flag sets it,
so its errors name the field); every other field's flag is that one."""


def flag_for(owner: str, name: str) -> str | None:
    """The command-line flag that sets ``owner.name`` (None: set from Python or a manifest only)."""
    return FLAGS.get((owner, name), "--" + name.replace("_", "-"))


def invalid(owner: str, name: str, value: object, requirement: str, hint: str = "") -> ConfigError:
    """The error for setting ``owner.name`` = ``value``, which ``requirement`` (``must be ≥ 1``) it breaks.

    It names the flag: ``--eta 1.5: must be in (0, 1] (VotingConfig.eta; the share of n kept)``; the CLI prints
    the part before the parentheses (``ConfigError.flag_line``), Python callers see the keyword too. A field no
    flag sets keeps the config's wording: ``ReadoutConfig.vocab_size = 1 must be ≥ 2``."""
    flag = flag_for(owner, name)
    where = f"{owner}.{name}" + (f"; {hint}" if hint else "")
    if flag is None:
        message = f"{owner}.{name} = {value!r} {requirement}" + (f" ({hint})" if hint else "")
    else:
        message = f"{flag} {value}: {requirement} ({where})"
    return ConfigError(message, setting=name, value=value, requirement=requirement, flag=flag)


MOST_QUESTIONS = 100_000
"""The most questions a run may ask for (``--questions``): reasoning-gym generates about 2,000 a second, so more is a
typo that would spend minutes before the first response, never a run."""
MOST_RESPONSES = 100_000
"""The most responses a question's pool may hold (``--pool``, online ``--max-n``): at 512 tokens × 30 layers each,
more than a store could hold."""

MOST_REPEATS = 100_000
"""The most repetitions a study may draw (``--trials``, ``--seeds``, ``--bootstrap``): each is a pass over every
question (10 and 30 by default, 1,000 bootstrap resamples), so more is a typo that would run for hours or fill the
memory, never a study."""


def check_repeats(owner: str, name: str, value: int) -> None:
    """A repetition count lies in 1..``MOST_REPEATS``."""
    if not (1 <= value <= MOST_REPEATS):
        raise invalid(owner, name, value, f"must be in 1..{MOST_REPEATS:,}")


def check_seed(owner: str, name: str, value: int) -> None:
    """A seed is an integer ≥ 0 (numpy's generators refuse negative ones — a traceback mid-run — and a store records
    the seed it was sampled with)."""
    if value < 0:
        raise invalid(owner, name, value, "must be an integer ≥ 0")


def check_choice(owner: str, name: str, value: object, literal: object) -> None:
    """``value`` is one of the ``Literal`` ``literal``'s choices, or ``invalid`` says which."""
    choices = get_args(literal)
    if value not in choices:
        raise invalid(owner, name, value, f"must be one of {', '.join(choices)}")
