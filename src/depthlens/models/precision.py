"""The precision a run reads a model at: how its weights were stored (a GGUF quantisation, a quantised checkpoint,
or none) and the dtype the forward pass ran in. Every manifest records it as ``precision``, because a lens read
from dequantised 4-bit weights describes the quantised model, not the float one (docs/definitions.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from depthlens.config.sampling import EngineConfig
from depthlens.models import catalogue

Precision = dict[str, str]
"""``{"weights": "Q4_1, dequantised to float32", "compute_dtype": "float32"}`` — the ``precision`` entry."""


def gguf_quantisation(path: Path) -> str:
    """The quantisation a GGUF file's header names (``general.file_type``: ``Q4_1``, ``Q4_K_M`` …); ``GGUF`` where
    the header names none or cannot be read (the file's tensors then say it, per tensor)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields.get("general.file_type")
        if field is None:
            return "GGUF"
        code = int(field.parts[field.data[0]][0])
        return gguf.LlamaFileType(code).name.removeprefix("MOSTLY_")
    except (OSError, ValueError, KeyError, IndexError):
        return "GGUF"


def _checkpoint_quantisation(quant: Any) -> str:
    """A Hugging Face checkpoint's own quantisation (its config's ``quantization_config``: bitsandbytes, GPTQ,
    AWQ …) or ``none`` for float weights."""
    if not quant:
        return "none"
    quant = quant if isinstance(quant, dict) else getattr(quant, "to_dict", lambda: {})()
    method = str(quant.get("quant_method", "quantised"))
    bits = quant.get("bits") or (4 if quant.get("load_in_4bit") else 8 if quant.get("load_in_8bit") else None)
    return f"{method} {bits}-bit" if bits else method


def weights_quantisation(name: str, config: Any = None) -> str:
    """How the weights of model ``name`` were stored: a catalogue entry's or a ``.gguf`` file's quantisation,
    dequantised to float32 on load (``Q4_1, dequantised to float32``), a checkpoint's own quantisation
    (``config``'s ``quantization_config``), or ``none`` for a float checkpoint."""
    if name in catalogue.CATALOGUE:
        return f"{catalogue.CATALOGUE[name].quantisation}, dequantised to float32"
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return f"{gguf_quantisation(path)}, dequantised to float32"
    if config is None and (path / "config.json").is_file():
        try:
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = None
    if isinstance(config, dict):
        return _checkpoint_quantisation(config.get("quantization_config"))
    return _checkpoint_quantisation(getattr(config, "quantization_config", None))


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` → ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


def precision_of(lm: Any, engine: EngineConfig | None = None) -> Precision:
    """The ``precision`` entry of a run on ``lm`` (a ``LoadedModel`` or a ``models.info.ModelInfo``): the forward
    pass runs in a vLLM engine's dtype where ``engine`` is one (``auto`` = bfloat16), else in the dtype of the
    loaded model's parameters."""
    model = getattr(lm, "model", None)
    if engine is not None and engine.backend == "vllm":
        compute = "bfloat16" if engine.dtype == "auto" else engine.dtype
    elif model is not None:
        compute = dtype_name(next(model.parameters()).dtype)
    else:
        compute = "unknown"
    config = model.config if model is not None else getattr(lm, "config", None)
    return {"weights": weights_quantisation(lm.name, config), "compute_dtype": compute}


def planned_precision(name: str, dtype: str, device: str, engine: EngineConfig | None = None) -> Precision:
    """The ``precision`` entry of a run whose model is loaded elsewhere (Ray actors) with ``dtype`` on ``device``
    (``auto``: float32 on a CPU, bfloat16 on an accelerator, as ``models.load.resolve_dtype``)."""
    if engine is not None and engine.backend == "vllm":
        compute = "bfloat16" if engine.dtype == "auto" else engine.dtype
    elif dtype == "auto":
        compute = "float32" if device == "cpu" else "bfloat16"
    else:
        compute = dtype
    return {"weights": weights_quantisation(name), "compute_dtype": compute}
