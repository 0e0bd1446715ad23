"""A fitted tuned lens on disk, and the checks that it belongs to the model it reads.

A lens folder (``depthlens lens fit --out LENS``) holds ``translators.safetensors`` (``weight`` [L−1, d, d],
``bias`` [L−1, d], float32), ``lens.json`` (the stamp: the model, its weights' fingerprint, L, d, the data, token
counts, steps, held-out KL per layer for the logit and the tuned lens, and ``digest``, the safetensors file's
sha256) and, while a fit is resumable, ``checkpoint.pt``. A lens fitted to another model — another fingerprint,
depth or width — is refused by name: its translators would read nonsense without failing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import weakref
from pathlib import Path
from typing import Any

import torch

from depthlens.config import LensSpec, ReadoutConfig
from depthlens.errors import InputError
from depthlens.models.load import LoadedModel
from depthlens.readout.lens import TunedLens

STAMP_FORMAT = "depthlens-tuned-lens-1"
WEIGHTS = "translators.safetensors"
STAMP = "lens.json"
CHECKPOINT = "checkpoint.pt"
FINGERPRINT_VALUES = (
    4096  # values per parameter hashed: enough to tell two checkpoints apart, cheap for any size
)

_FINGERPRINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_LOADED: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], TunedLens]] = weakref.WeakKeyDictionary()


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
    """Write the translators and the stamp (``digest`` added) into the folder ``out``; returns the stamp."""
    from safetensors.torch import save

    out.mkdir(parents=True, exist_ok=True)
    # Written as bytes, not by save_file: its file is created mode 0600 whatever the umask (lens.json is 0644).
    (out / WEIGHTS).write_bytes(
        save({"weight": weight.float().contiguous(), "bias": bias.float().contiguous()})
    )
    stamp = {"format": STAMP_FORMAT, **stamp, "digest": file_digest(out / WEIGHTS)}
    (out / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    return stamp


def read_stamp(path: Path) -> dict[str, Any]:
    """The stamp of the lens folder ``path``; InputError naming it when it is not one."""
    file = path / STAMP
    if not (file.is_file() and (path / WEIGHTS).is_file()):
        raise InputError(
            f"--lens tuned:{path}: no fitted lens there ({STAMP} and {WEIGHTS} expected); "
            f"fit one with `depthlens lens fit --model MODEL --out {path}`"
        )
    try:
        stamp = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(
            f"--lens tuned:{path}: {file} is not a lens stamp ({exc}); fit the lens again"
        ) from None
    if not isinstance(stamp, dict) or stamp.get("format") != STAMP_FORMAT:
        raise InputError(f"--lens tuned:{path}: {file} is not a {STAMP_FORMAT} stamp; fit the lens again")
    return stamp


def check_matches(stamp: dict[str, Any], lm: LoadedModel, where: str) -> None:
    """Refuse a lens fitted to another model: its fingerprint, depth L or width d differ from ``lm``'s."""
    mine = {"model_hash": model_fingerprint(lm), "n_layers": lm.n_layers, "d": hidden_size(lm)}
    wrong = [f"{k} {stamp.get(k)!r} ≠ {v!r}" for k, v in mine.items() if stamp.get(k) != v]
    if wrong:
        raise InputError(
            f"{where}: this lens was fitted to {stamp.get('model')!r}, not to {lm.name!r} ({', '.join(wrong)}); "
            f"fit one for it with `depthlens lens fit --model {lm.name} --out LENS`"
        )


def stamped(config: ReadoutConfig) -> ReadoutConfig:
    """``config`` with ``lens_digest`` set from its tuned lens's stamp (unchanged for the logit lens): the store's
    manifest then names the very fit that read it. Raises InputError when the lens folder is not one, or when it
    holds another fit than ``config.lens_digest`` already names."""
    spec = LensSpec.parse(config.lens)
    if spec.path is None:
        return config
    digest = read_stamp(Path(spec.path))["digest"]
    if config.lens_digest not in (None, digest):
        raise InputError(
            f"--lens {config.lens}: the lens there is fit {digest}, not {config.lens_digest} that this store was "
            "read with; score into a new --out, or restore that lens"
        )
    return dataclasses.replace(config, lens_digest=digest)


def same_lens(given: str, stored: str) -> bool:
    """Whether ``--lens given`` names the lens a store was read through (``stored``): the same kind, and for a
    tuned lens the same folder however it is spelled (``tuned:runs/l`` and ``tuned:./runs/l``)."""
    a, b = LensSpec.parse(given), LensSpec.parse(stored)
    if a.path is None or b.path is None:
        return a.path is None and b.path is None
    return Path(a.path).resolve() == Path(b.path).resolve()


def load_tuned(lm: LoadedModel, config: ReadoutConfig, vocab: int | None) -> TunedLens:
    """The tuned lens ``config.lens`` names, checked to fit ``lm`` (``check_matches``) and to be the fit
    ``config.lens_digest`` names; loaded once per model and folder."""
    from safetensors.torch import load_file

    spec = LensSpec.parse(config.lens)
    path = Path(str(spec.path))
    stamp = read_stamp(path)
    config = stamped(config)
    key = (str(path.resolve()), stamp["digest"])
    loaded = _LOADED.setdefault(lm.model, {})
    if key not in loaded:
        check_matches(stamp, lm, f"--lens {config.lens}")
        if file_digest(path / WEIGHTS) != stamp["digest"]:
            raise InputError(
                f"--lens {config.lens}: {WEIGHTS} does not match its stamp's digest; fit it again"
            )
        tensors = load_file(str(path / WEIGHTS))
        lens = TunedLens(lm.parts, tensors["weight"], tensors["bias"], stamp=stamp)
        loaded[key] = lens.to(lm.device)
    cached = loaded[key]
    return TunedLens(
        lm.parts, cached.weight, cached.bias, vocab_size=vocab, final_norm=config.final_norm, stamp=stamp
    )
