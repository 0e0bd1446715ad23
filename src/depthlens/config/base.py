"""The config mixin and its checks: every config round-trips through a plain dict (``to_dict`` / ``from_dict``) so a
run's manifest reproduces it; ``from_dict`` rejects keys it does not know rather than silently ignoring a typo.

Every bad setting is raised by ``invalid``, which names the setting (the config field) and what it must be; each
front phrases it in its own terms (the command line's ``--rho 1.5: must be in (0, 1]``, ``cli.flags``)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Self, get_args

from depthlens.errors import ConfigError


class Config:
    """Mixin: dict round-trip with unknown keys rejected."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # every config is a dataclass

    DICT_KEYS: ClassVar[dict[str, str]] = {}
    """A field renamed after stores held it → the key its dict (a manifest, a summary, a server response) keeps:
    the formats stay as they were, and a dict with either name reads back."""

    def to_dict(self) -> dict[str, Any]:
        # Tuples become lists, as they come back from a JSON manifest (so a resumed run compares equal).
        data = dataclasses.asdict(self)
        return {self.DICT_KEYS.get(k, k): list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        fields = {key: name for name, key in cls.DICT_KEYS.items()}
        data = {fields.get(k, k): v for k, v in data.items()}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown key(s) {unknown}; known keys are {sorted(known)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def invalid(owner: str, name: str, value: object, requirement: str, hint: str = "") -> ConfigError:
    """The error for setting ``owner.name`` = ``value``, which ``requirement`` (``must be ≥ 1``) it breaks.

    It names the setting, never a front's spelling of it: Python reads ``eta=1.5: must be in (0, 1]
    (VotingConfig.eta; the share of n kept)``, the command line ``--eta 1.5: must be in (0, 1]`` (``cli.flags``),
    a server request ``depthlens.eta 1.5: …`` (``errors.DepthlensError.phrased``)."""
    return ConfigError(setting=name, value=value, requirement=requirement, owner=owner, hint=hint)


MOST_QUESTIONS = 100_000
"""The most questions a run may ask for (``--questions``): reasoning-gym generates about 2,000 a second, so more is a
typo that would spend minutes before the first response, never a run."""
MOST_RESPONSES = 100_000
"""The most responses a question's pool may hold (``--pool``, online ``--max-n``): at 512 tokens × 30 layers each,
more than a store could hold."""

MOST_BATCH = MOST_RESPONSES
"""The most rows one batch may hold (``--batch-size``: responses sampled together, records scored together, a
served request's prompts): a pool holds no more; what a batch of a given model holds in memory is checked against
the machine once the model's shape is read (``studies.footprint``)."""

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
