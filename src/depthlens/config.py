"""Frozen settings for each stage. Defaults are stated here once; the CLI and docs read them from here.

Every config round-trips through a plain dict (``to_dict`` / ``from_dict``) so a run's manifest reproduces it;
``from_dict`` rejects keys it does not know rather than silently ignoring a typo.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, Self, get_args

from depthlens.errors import ConfigError

Divergence = Literal["jsd", "jsd-nat", "kl", "cosine"]
"""``jsd``: Jensen–Shannon divergence in bits (base 2, bounded by 1); ``jsd-nat``: the same in nats;
``kl``: KL(p_L ‖ p_l) in nats; ``cosine``: 1 − cos(norm(h_l), norm(h_L))."""

DeepRule = Literal["spec", "paper-literal"]
"""``spec``: deep when c_t ≥ ⌈ρ·L⌉ (SPEC §2, the paper's figures); ``paper-literal``: c_t ≥ ⌈(1−ρ)·L⌉
(the paper's Algorithm 1 as printed)."""


class _Config:
    """Mixin: dict round-trip with unknown keys rejected."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown key(s) {unknown}; known keys are {sorted(known)}")
        return cls(**data)


def _check_choice(owner: str, name: str, value: object, literal: object) -> None:
    choices = get_args(literal)
    if value not in choices:
        raise ConfigError(f"{owner}.{name} = {value!r} is not one of {list(choices)}")


@dataclasses.dataclass(frozen=True)
class ReadoutConfig(_Config):
    """How hidden states become per-layer distributions and divergences (SPEC §1).

    Attributes:
        divergence: which divergence to the final layer is measured (see ``Divergence``).
        final_norm: apply the model's final norm before the unembedding at layers < L (the logit lens);
            False is the ``--no-final-norm`` ablation, never the default.
        memory_mb: budget for the readout's working tensors (vocab-sized chunks and the forward segment);
            chunk sizes are derived from it so peak memory does not grow with sequence length or depth.
        vocab_size: cut logits to this many rows (padded vocabularies); None = the tokenizer's length.
    """

    divergence: Divergence = "jsd"
    final_norm: bool = True
    memory_mb: int = 512
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        _check_choice("ReadoutConfig", "divergence", self.divergence, Divergence)
        if self.memory_mb < 16:
            raise ConfigError(f"ReadoutConfig.memory_mb = {self.memory_mb} is too small; use at least 16")
        if self.vocab_size is not None and self.vocab_size < 2:
            raise ConfigError(
                f"ReadoutConfig.vocab_size = {self.vocab_size}; a distribution needs ≥ 2 tokens"
            )


@dataclasses.dataclass(frozen=True)
class DTRConfig(_Config):
    """Settling and deep-thinking settings (SPEC §2).

    Attributes:
        g: settling threshold on the cumulative-minimum divergence (units of the divergence: bits for jsd).
        rho: depth fraction defining the deep regime.
        deep_rule: how ρ becomes a layer threshold (see ``DeepRule``).
        prefix: when set, ``dtr_prefix`` is also reported over the first ``prefix`` completion tokens.
    """

    g: float = 0.5
    rho: float = 0.85
    deep_rule: DeepRule = "spec"
    prefix: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.g) and self.g >= 0):
            raise ConfigError(f"DTRConfig.g = {self.g} must be a finite number ≥ 0 (default 0.5)")
        if not (0 < self.rho <= 1):
            raise ConfigError(f"DTRConfig.rho = {self.rho} must lie in (0, 1] (default 0.85)")
        _check_choice("DTRConfig", "deep_rule", self.deep_rule, DeepRule)
        if self.prefix is not None and self.prefix < 1:
            raise ConfigError(f"DTRConfig.prefix = {self.prefix} must be ≥ 1 token, or None for no prefix")


VEff = Literal["ipr", "exp-entropy"]
"""``ipr``: 1 / Σ o_i² (inverse participation ratio, SPEC §6 default); ``exp-entropy``: exp H(o)."""


@dataclasses.dataclass(frozen=True)
class TCBConfig(_Config):
    """Token Constraint Bound settings (SPEC §6).

    Attributes:
        epsilon: the tolerated output change ε in δ_TCB = ε / ‖J‖_F.
        v_eff: which effective-vocabulary size is reported as ``v_eff``.
        spectral: also report ``tcb_spectral`` = ε / ‖J‖_2 (power iteration; costs ~2 unembedding products per
            iteration).
        power_iterations: the most power-iteration steps for the spectral norm.
    """

    epsilon: float = 1.0
    v_eff: VEff = "ipr"
    spectral: bool = False
    power_iterations: int = 100

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigError(f"TCBConfig.epsilon = {self.epsilon} must be a finite number > 0 (default 1.0)")
        _check_choice("TCBConfig", "v_eff", self.v_eff, VEff)
        if self.power_iterations < 1:
            raise ConfigError(f"TCBConfig.power_iterations = {self.power_iterations} must be ≥ 1")
