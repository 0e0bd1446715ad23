"""A fitted tuned lens on disk, and the checks that it belongs to the model it reads.

A lens folder (``depthlens lens fit --out LENS``) holds ``translators.safetensors`` (``weight`` [L−1, d, d],
``bias`` [L−1, d], float32), ``lens.json`` (the stamp: the model, its weights' fingerprint, L, d, the data, token
counts, steps, held-out KL per layer for the logit and the tuned lens, and ``digest``, the safetensors file's
sha256) and, while a fit is resumable, ``checkpoint.pt``. A lens fitted to another model — another fingerprint,
depth or width — is refused by name: its translators would read nonsense without failing.
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from pathlib import Path
from typing import Any

import torch

from depthlens.config import LensSpec, ReadoutConfig
from depthlens.config.lens import STAMP, STAMP_FORMAT, WEIGHTS
from depthlens.errors import InputError
from depthlens.models.load import LoadedModel
from depthlens.readout.lens import TunedLens

CHECKPOINT = "checkpoint.pt"
FINGERPRINT_VALUES = (
    4096  # values per parameter hashed: enough to tell two checkpoints apart, cheap for any size
)

_FINGERPRINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_CHECKED: weakref.WeakKeyDictionary[Any, set[str]] = (
    weakref.WeakKeyDictionary()
)  # model → digests that fit it
_TRANSLATORS: dict[tuple[str, str, str], tuple[torch.Tensor, torch.Tensor]] = {}  # (folder, digest, device)


def model_fingerprint(lm: LoadedModel) -> str:
    """A hash of ``lm``'s weights: every parameter's name, shape and first ``FINGERPRINT_VALUES`` values rounded to
    bfloat16 (so the same checkpoint loaded as float32 or bfloat16 hashes the same). Cached per model object."""
    cached = _FINGERPRINTS.get(lm.model)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    for name, param in lm.model.named_parameters():
        values = param.detach().flatten()[:FINGERPRINT_VALUES].to(torch.bfloat16).float().cpu()
        digest.update(f"{name}:{tuple(param.shape)}".encode())
        digest.update(values.numpy().tobytes())
    _FINGERPRINTS[lm.model] = digest.hexdigest()[:16]
    return _FINGERPRINTS[lm.model]


def hidden_size(lm: LoadedModel) -> int:
    """d, the residual stream's width (the unembedding's input)."""
    return int(lm.parts.unembed.weight.shape[1])


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def save_lens(out: Path, weight: torch.Tensor, bias: torch.Tensor, stamp: dict[str, Any]) -> dict[str, Any]:
    """Write the translators and the stamp (``digest`` added) into the folder ``out``; returns the stamp.

    Both are written whole to temporary names, fsynced, then renamed (the translators first, the stamp naming
    their digest last): a write that fails (a full disk) raises the OSError, naming the file it was for, and leaves
    the folder's lens as it was, its temporary files removed."""
    from safetensors.torch import save

    out.mkdir(parents=True, exist_ok=True)
    # Written as bytes, not by save_file: its file is created mode 0600 whatever the umask (lens.json is 0644).
    data = save({"weight": weight.float().contiguous(), "bias": bias.float().contiguous()})
    stamp = {"format": STAMP_FORMAT, **stamp, "digest": hashlib.sha256(data).hexdigest()[:16]}
    write_whole({out / WEIGHTS: data, out / STAMP: (json.dumps(stamp, indent=1) + "\n").encode()})
    return stamp


def write_whole(files: dict[Path, bytes]) -> None:
    """Write each of ``files`` (path → bytes) whole: all to temporary names beside them, fsynced, then renamed in
    order. An OSError (a full disk) removes every temporary file and is raised naming the file it was for."""
    staged = {path: path.with_name(f".{path.name}.tmp") for path in files}
    try:
        for path, data in files.items():
            with staged[path].open("wb") as f:
                try:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                except OSError as exc:
                    exc.filename = str(path)
                    raise
        for path, tmp in staged.items():
            tmp.replace(path)
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)


def check_fit(lens: LensSpec, mine: dict[str, Any], model: str) -> None:
    """Refuse a lens fitted to another model: the stamp's fingerprint (``model_hash``), depth L or width d differ
    from ``mine`` — the loaded model's, or on the vLLM driver the checkpoint's (``sampling.vllm.tuned``). One check
    for both backends; ``mine`` leaves out what cannot be known (a checkpoint without transformers names)."""
    stamp = lens.stamp or {}
    wrong = [f"{k} {stamp.get(k)!r} ≠ {v!r}" for k, v in mine.items() if stamp.get(k) != v]
    if wrong:
        raise InputError(
            setting="lens",
            value=str(lens),
            requirement=f"this lens was fitted to {stamp.get('model')!r}, not to {model!r} ({', '.join(wrong)}); "
            f"fit one for it with `depthlens lens fit --model {model} --out LENS`",
        )


def translators(lens: LensSpec, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The translators of the fit ``lens`` names (weight [L−1, d, d], bias [L−1, d], float32 on ``device``), read
    once per fit and device — the one cache the transformers readout and the vLLM worker share; refused when the
    folder holds another fit than ``lens.digest`` by now (refitted since the run was set up)."""
    from safetensors.torch import load_file

    folder = Path(str(lens.path)).resolve()
    key = (str(folder), str(lens.digest), str(device))
    if key not in _TRANSLATORS:
        if file_digest(folder / WEIGHTS) != lens.digest:
            raise InputError(
                setting="lens",
                value=str(lens),
                requirement=f"the folder holds another fit than {lens.digest}, which this run was checked "
                "against; restore that lens, or start the run again",
            )
        tensors = load_file(str(folder / WEIGHTS))
        _TRANSLATORS[key] = (tensors["weight"].float().to(device), tensors["bias"].float().to(device))
    return _TRANSLATORS[key]


def load_tuned(lm: LoadedModel, config: ReadoutConfig, vocab: int | None) -> TunedLens:
    """The tuned lens ``config`` carries (``config.lens_spec``, resolved when the config was built), checked to fit
    ``lm`` (``check_fit``, once per model and fit)."""
    lens = config.lens_spec
    checked = _CHECKED.setdefault(lm.model, set())
    if lens.digest not in checked:
        mine = {"model_hash": model_fingerprint(lm), "n_layers": lm.n_layers, "d": hidden_size(lm)}
        check_fit(lens, mine, lm.name)
        checked.add(str(lens.digest))
    weight, bias = translators(lens, lm.device)
    return TunedLens(lm.parts, weight, bias, vocab_size=vocab, final_norm=config.final_norm, stamp=lens.stamp)
