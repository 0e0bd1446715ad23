"""A fitted lens inside the vLLM engine — a tuned lens (either form) or a Jacobian lens: checked against the model by
the driver, its matrices loaded by the worker (``readout.lenses.matrices``, the transformers readout's own cache).

The driver holds no transformers copy of the weights, so a lens's fingerprint (``readout.tuned.model_fingerprint``,
a hash over ``named_parameters``) is recomputed from the checkpoint's safetensors files, in the order of a model
built on the meta device (no memory): the same names, shapes and values the transformers model would hash. Where
the files do not name the model's parameters as transformers does (a GGUF file, renamed keys), or the lens records
no fingerprint (one fitted elsewhere), only the depth L and width d are checked. The worker receives the lens as
``KIND:ABSOLUTE_PATH`` and the fit's digest (``RequestReadout.lens``, ``lens_digest``) and refuses a path that holds
another fit by then.

No vllm import: shared by the driver and the worker.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import torch

from depthlens.config import LensSpec, ReadoutConfig
from depthlens.errors import InputError
from depthlens.readout.lens_files import FINGERPRINT_VALUES, check_fit, model_fingerprint
from depthlens.readout.lenses import FORMATS, matrices, resolve_lens


def engine_lens(readout: ReadoutConfig, model: Any, info: Any) -> dict[str, str | None]:
    """``RequestReadout``'s ``lens`` (``KIND:ABSOLUTE_PATH``) and ``lens_digest`` for ``readout`` (both None under the
    logit lens), the lens resolved if it was not and checked to fit the model (``readout.lens_files.check_fit``,
    the transformers readout's own check): ``model`` a ``LoadedModel`` (its own fingerprint) or the ``ModelInfo``
    ``info`` (the checkpoint's)."""
    if readout.lens.path is None:
        return {"lens": None, "lens_digest": None}
    lens = resolve_lens(readout.lens)
    mine: dict[str, Any] = {"n_layers": info.n_layers, "d": info.hidden_size}
    if "model_hash" in (lens.stamp or {}):  # only a lens that records one is worth hashing the checkpoint for
        fingerprint = model_fingerprint(model) if hasattr(model, "parts") else checkpoint_fingerprint(info)
        if fingerprint is not None:
            mine["model_hash"] = fingerprint
    check_fit(lens, mine, info.name)
    return {"lens": f"{lens.kind}:{Path(str(lens.path)).resolve()}", "lens_digest": lens.digest}


def checkpoint_fingerprint(info: Any) -> str | None:
    """``model_fingerprint`` of the model ``info`` describes, from its safetensors files (one tensor in memory at a
    time); None where they do not hold every parameter under its transformers name."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    files = sorted(Path(str(info.source)).glob("*.safetensors")) if Path(str(info.source)).is_dir() else []
    if not files:
        return None
    opened = [safe_open(str(f), "pt") for f in files]
    where = {key: handle for handle in opened for key in handle.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(info.config)
    except (ValueError, KeyError, ImportError, OSError):  # a model_type transformers does not know
        return None
    digest = hashlib.sha256()
    for name, param in skeleton.named_parameters():
        handle = where.get(name)
        if handle is None:
            return None
        values = _leading(handle, name).to(torch.bfloat16).float()
        digest.update(f"{name}:{tuple(param.shape)}".encode())
        digest.update(values.numpy().tobytes())
    return digest.hexdigest()[:16]


def _leading(handle: Any, name: str) -> torch.Tensor:
    """The first ``FINGERPRINT_VALUES`` values of tensor ``name``, flattened, reading only the leading rows that
    hold them (a 7B model's checkpoint is not read whole to hash 4,096 values per tensor)."""
    part = handle.get_slice(name)
    shape = part.get_shape()
    if not shape:
        return handle.get_tensor(name).flatten()
    per_row = math.prod(shape[1:]) or 1
    return part[: -(-FINGERPRINT_VALUES // per_row)].flatten()[:FINGERPRINT_VALUES]


def load_translators(
    lens: str, digest: str | None, n_layers: int, d: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The worker's copy of the matrices of ``lens`` (``KIND:PATH``, as ``engine_lens`` sent it; a bare folder is a
    tuned lens's) — ``readout.lenses.matrices``: once per fit and device, refused when the path holds another fit
    than ``digest`` by now —, refused when they do not fit the engine's model. (weight [L−1, d, d], bias or
    None)."""
    spec = LensSpec.parse(lens if ":" in lens else f"tuned:{lens}", digest)
    if spec.kind == "tuned" and not FORMATS["tuned"].holds(Path(str(spec.path))):
        spec = LensSpec("tuned-package", spec.path, digest)
    found = matrices(spec, device)
    weight, bias = found.weight, found.bias
    if tuple(weight.shape) != (n_layers - 1, d, d) or (
        bias is not None and tuple(bias.shape) != (n_layers - 1, d)
    ):
        raise InputError(
            setting="lens",
            value=str(spec),
            requirement=f"its matrices {tuple(weight.shape)} do not fit the engine's model (L = {n_layers}, d = "
            f"{d}); fit one for it with `depthlens lens fit`",
        )
    return weight, bias
