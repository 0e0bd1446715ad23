"""What the vLLM backend says before any engine: the install hint where the extra is missing (``VLLM_MISSING``,
for ``sampling.choose`` and ``sampling.vllm.engine`` alike) and whether vLLM can load a model as given
(``check_source``).

The backend itself is ``sampling.vllm.generator.EngineGenerator``: the engine reads every layer out of its own
forward pass (``sampling.vllm.worker``), so no transformers copy of the model is loaded beside it. Importing this
module imports no vllm (``check_source`` runs before anything loads).
"""

from __future__ import annotations

from pathlib import Path

from depthlens.errors import ConfigError
from depthlens.models import catalogue

VLLM_MISSING = (
    "--backend vllm needs the vllm extra: pip install 'depthlens[vllm]' (on CUDA: pip install vllm)"
)


def check_source(name: str) -> None:
    """Refuse, before any model loads, a model vLLM cannot take as it is (a ``.gguf`` file)."""
    if name not in catalogue.CATALOGUE and Path(name).expanduser().suffix == ".gguf":
        raise ConfigError(
            f"{name}: --backend vllm loads safetensors model directories, not a .gguf file; convert it, use a "
            "catalogue name (its cached safetensors copy is used), or --backend hf"
        )
