"""The vLLM backend's entry points that need no engine: which model source vLLM loads (``check_source``,
``engine_source``), and the names callers of the re-scoring backend used (``VLLMGenerator``, ``start_engine``).

The backend itself is ``sampling.vllm.generator.EngineGenerator``: the engine reads every layer out of its own
forward pass (``sampling.vllm.worker``), so no transformers copy of the model is loaded beside it. Importing this
module imports no vllm (``check_source`` runs before anything loads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthlens.config import EngineConfig
from depthlens.errors import ConfigError
from depthlens.models import catalogue
from depthlens.sampling.vllm.engine import EngineError, JobSize
from depthlens.sampling.vllm.generator import EngineGenerator

VLLMGenerator = EngineGenerator
__all__ = ["EngineError", "VLLMGenerator", "check_source", "engine_source", "start_engine"]


def check_source(name: str) -> None:
    """Refuse, before any model loads, a model vLLM cannot take as it is (a ``.gguf`` file)."""
    if name not in catalogue.CATALOGUE and Path(name).expanduser().suffix == ".gguf":
        raise ConfigError(
            f"{name}: --backend vllm loads safetensors model directories, not a .gguf file; convert it, use a "
            "catalogue name (its cached safetensors copy is used), or --backend hf"
        )


def engine_source(name: str) -> str:
    """What vLLM loads for the model ``name``: a catalogue entry's cached safetensors copy, a directory, a hub id."""
    check_source(name)
    if name in catalogue.CATALOGUE:
        return str(catalogue.install(name))
    path = Path(name).expanduser()
    return str(path) if path.is_dir() else name


def start_engine(source: str, config: EngineConfig, job: JobSize | None = None) -> Any:
    """An engine with the in-engine readout for the model at ``source`` (a name or a directory)."""
    from depthlens.models.info import load_info
    from depthlens.sampling.vllm import engine

    return engine.start_engine(load_info(source), config, job)
