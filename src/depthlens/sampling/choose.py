"""Which generation engine a run gets: ``--backend hf | vllm | auto``, and building it (vllm imported only when
chosen, so ``depthlens --help`` and the core install never need it)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

from depthlens.config import Backend, EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.errors import ConfigError
from depthlens.models.load import LoadedModel
from depthlens.sampling.backend import GenerationBackend
from depthlens.sampling.hf import HFGenerator

VLLM_MISSING = (
    "--backend vllm needs the vllm extra: pip install 'depthlens[vllm]' (on CUDA: pip install vllm)"
)


def vllm_available() -> bool:
    """Whether the vllm extra is installed (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


AUTO_ENV = "DEPTHLENS_BACKEND"  # what ``--backend auto`` means on a machine, when set (hf or vllm)


def resolve_backend(name: str, recorded: str | None = None) -> Backend:
    """``auto`` → the backend ``recorded`` by the run being resumed, else ``$DEPTHLENS_BACKEND``, else vllm where
    the extra is installed, else hf; ``vllm`` needs the extra.

    vLLM is the default wherever it is installed because it was measured the faster (docs/performance.md): on a
    2-core CPU 2× the transformers sampler's tokens/s at n = 48 (bfloat16 engine), once its engine has started
    (7 s eager, 15 s compiled from the second start on).
    """
    if name == "auto":
        name = recorded or os.environ.get(AUTO_ENV) or ("vllm" if vllm_available() else "hf")
    if name not in ("hf", "vllm"):
        raise ConfigError(f"--backend {name!r} is not one of auto, hf, vllm")
    if name == "vllm" and not vllm_available():
        raise ConfigError(VLLM_MISSING)
    return name  # type: ignore[return-value]


def make_backend(
    lm: LoadedModel,
    engine: EngineConfig,
    sampling: SamplingConfig = SamplingConfig(),
    readout: ReadoutConfig = ReadoutConfig(),
    on_token: Callable[[int], None] = lambda n: None,
) -> GenerationBackend:
    """The generation backend ``engine.backend`` names; vllm is imported only when chosen."""
    if engine.backend == "vllm":
        resolve_backend("vllm")  # the one-line install hint where the extra is missing
        from depthlens.sampling.vllm.backend import VLLMGenerator

        return VLLMGenerator(lm, sampling, readout, engine, on_token=on_token)
    return HFGenerator(lm, sampling, readout, on_token=on_token)
