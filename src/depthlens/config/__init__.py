"""Frozen settings for each stage, and the run specs built from them. Defaults are stated here once; the CLI and
docs read them from here. Every config round-trips through a plain dict (``to_dict`` / ``from_dict``);
``from_dict`` rejects keys it does not know rather than silently ignoring a typo."""

from depthlens.config.answers import AnswerConfig, AnswerType, Fallback, PromptStyle
from depthlens.config.base import Config, invalid
from depthlens.config.lens import JACOBIAN_SKIP_FIRST, JacobianFitConfig, LensKind, LensSpec
from depthlens.config.readout import (
    DIVERGENCE_MAX,
    PREFIX_TOKENS,
    Compile,
    DeepRule,
    Divergence,
    DTRConfig,
    LensFitConfig,
    ReadoutConfig,
    TCBConfig,
    TCBStudies,
    VEff,
    depth_prefix,
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
from depthlens.config.serve import ServeConfig
from depthlens.config.voting import CorrelationConfig, OnlineConfig, Signal, TieBreak, VotingConfig

__all__ = [
    "DIVERGENCE_MAX", "JACOBIAN_SKIP_FIRST", "PREFIX_TOKENS", "AnswerConfig", "AnswerType", "Backend", "Compile",
    "Config", "CorrelationConfig", "DTRConfig", "DeepRule", "Divergence", "EngineConfig", "EngineDType", "Fallback",
    "GenerateRun", "JacobianFitConfig", "LensFitConfig", "LensKind", "LensSpec",
    "ModelSpec", "OnlineConfig", "OnlineRun", "PromptStyle", "RayConfig", "ReadoutConfig",
    "SamplingConfig", "ScoreRun", "ServeConfig", "Signal", "StoreFormat", "StoreSpec", "TCBConfig", "TCBStudies",
    "TaskSpec", "TieBreak", "VEff", "VotingConfig", "depth_prefix", "invalid",
]  # fmt: skip
