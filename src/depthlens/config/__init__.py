"""Frozen settings for each stage, and the run specs built from them. Defaults are stated here once; the CLI and
docs read them from here. Every config round-trips through a plain dict (``to_dict`` / ``from_dict``);
``from_dict`` rejects keys it does not know rather than silently ignoring a typo."""

from depthlens.config.answers import AnswerConfig, AnswerType, Fallback, PromptStyle
from depthlens.config.base import Config
from depthlens.config.readout import (
    DIVERGENCE_MAX,
    Compile,
    DeepRule,
    Divergence,
    DTRConfig,
    ReadoutConfig,
    TCBConfig,
    VEff,
    degenerate_settings,
)
from depthlens.config.run import (
    GenerateRun,
    ModelSpec,
    OnlineRun,
    RayConfig,
    ScoreRun,
    StoreFormat,
    StoreSpec,
    TaskSpec,
)
from depthlens.config.sampling import Backend, EngineConfig, EngineDType, SamplingConfig
from depthlens.config.voting import CorrelationConfig, OnlineConfig, Signal, VotingConfig

__all__ = [
    "DIVERGENCE_MAX", "AnswerConfig", "AnswerType", "Backend", "Compile", "Config", "CorrelationConfig", "DTRConfig",
    "DeepRule", "Divergence", "EngineConfig", "EngineDType", "Fallback", "GenerateRun", "ModelSpec", "OnlineConfig",
    "OnlineRun", "PromptStyle", "RayConfig", "ReadoutConfig", "SamplingConfig", "ScoreRun", "Signal", "StoreFormat",
    "StoreSpec", "TCBConfig", "TaskSpec", "VEff", "VotingConfig", "degenerate_settings",
]  # fmt: skip
