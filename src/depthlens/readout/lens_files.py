"""What every fitted lens on disk shares: the matrices a lens kind loads (``Translators``), the interface each kind's
class fills (``LensFormat``: one class per kind — ``readout.tuned``, ``readout.tuned_package``,
``readout.jacobian`` —, one row each in ``readout.lenses.FORMATS``), a file's digest, a model's fingerprint and the
one check that a fit belongs to the model that reads through it (``check_fit``: the transformers readout's and the
vLLM driver's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import weakref
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch

from depthlens.config import LensKind, LensSpec
from depthlens.errors import InputError
from depthlens.models.load import LoadedModel

FINGERPRINT_VALUES = (
    4096  # values per parameter hashed: enough to tell two checkpoints apart, cheap for any size
)

_FINGERPRINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class Translators:
    """A lens's pre-norm transform for layers 1..L−1: ``weight`` [L−1, d, d] (row l − 1 is W_l, read as W_l h) and
    ``bias`` [L−1, d] or None, float32."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Translators:
        return Translators(self.weight.to(device), None if self.bias is None else self.bias.to(device))


class LensFormat(Protocol):
    """One lens kind on disk: which paths hold it, its stamp and digest, its matrices as the readout applies them.

    ``read`` and ``load`` raise ``InputError`` naming the ``lens`` setting (``given``: the text it came as) when
    the path does not hold a valid lens of the kind; ``read`` is what resolving a ``LensSpec`` costs (a stamp file,
    or the artifact itself where the stamp is inside it), ``load`` what a readout costs once per fit and device."""

    kind: ClassVar[LensKind]

    def holds(self, path: Path) -> bool:
        """Whether ``path`` holds a lens of this kind (its files are there; not yet whether they are valid)."""
        ...

    def weights_file(self, path: Path) -> Path:
        """The file the fit's digest is taken of."""
        ...

    def read(self, path: Path, given: str) -> dict[str, Any]:
        """The lens's stamp (``n_layers``, ``d``; ``model`` and ``model_hash`` where it records them; ``digest``)."""
        ...

    def load(self, path: Path, given: str) -> Translators:
        """Its matrices in the readout's form, float32 on the CPU."""
        ...


def file_digest(path: Path) -> str:
    """The first 16 hex digits of ``path``'s sha256: a fit's identity in stores and manifests."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


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
    return int(lm.parts.unembed_weight.shape[1])


def model_facts(lm: LoadedModel) -> dict[str, Any]:
    """What a lens's stamp is checked against on the transformers side: fingerprint, depth L and width d."""
    return {"model_hash": model_fingerprint(lm), "n_layers": lm.n_layers, "d": hidden_size(lm)}


def refused(given: str, requirement: str) -> InputError:
    """The one-line error about the lens ``given`` (``--lens jacobian:x: …``, ``lens='jacobian:x': …``)."""
    return InputError(setting="lens", value=given, requirement=requirement)


def check_fit(lens: LensSpec, mine: dict[str, Any], model: str) -> None:
    """Refuse a lens fitted to another model: the stamp's width d, depth L or fingerprint (``model_hash``, where
    the stamp records one: a lens fitted elsewhere has none) differ from ``mine`` — the loaded model's, or on the
    vLLM driver the checkpoint's (``sampling.vllm.tuned``); ``mine`` leaves out what cannot be known."""
    stamp = lens.stamp or {}
    compared = {k: v for k, v in mine.items() if k in stamp or k != "model_hash"}
    wrong = [f"{k} {stamp.get(k)!r} ≠ {v!r}" for k, v in compared.items() if stamp.get(k) != v]
    if not wrong:
        return
    if (
        lens.kind == "jacobian"
        and stamp.get("d") == mine.get("d")
        and stamp.get("n_layers") != mine["n_layers"]
    ):
        have, want = stamp.get("n_layers", 1) - 1, mine["n_layers"] - 1
        gap = f"layers {have + 1}..{want} missing" if have < want else f"layers {want + 1}..{have} extra"
        wrong = [f"it holds J for layers 1..{have}, {model} has L − 1 = {want} ({gap})"]
    fitted = (
        f"this lens was fitted to {stamp['model']!r}, not to {model!r}"
        if stamp.get("model")
        else (f"this lens does not fit {model!r}")
    )
    fit = "lens fit --kind jacobian" if lens.kind == "jacobian" else "lens fit"
    raise refused(
        str(lens),
        f"{fitted} ({', '.join(wrong)}); fit one for it with `depthlens {fit} --model {model} --out LENS`",
    )
