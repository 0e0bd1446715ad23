"""The lens kinds, one registry row each, and the two things a run does with a lens: resolve it once where the run
is built (``resolve_lens``: which form the path holds, its stamp read, its fit's digest taken) and read through it
(``build``: checked to fit the model, its matrices loaded once per fit and device).

``FORMATS`` holds one class per fitted kind (``readout.lens_files.LensFormat``): ``tuned`` (depthlens's own
W_l h + b_l, ``readout.tuned``), ``tuned-package`` (the ``tuned-lens`` package's h + W_l h + b_l,
``readout.tuned_package``), ``jacobian`` (J_l h, ``readout.jacobian``). The logit lens has no file. ``tuned:PATH``
reads either tuned form — the folder says which — and the resolved kind (``str(spec)``) states it in every store.
A new lens kind is one module with its class and one row here.
"""

from __future__ import annotations

import dataclasses
import weakref
from pathlib import Path
from typing import Any

import torch

from depthlens.config import LensKind, LensSpec, ReadoutConfig
from depthlens.models.load import LoadedModel
from depthlens.readout.jacobian import JacobianArtifact
from depthlens.readout.lens import LogitLens, TranslatedLens
from depthlens.readout.lens_files import LensFormat, Translators, check_fit, file_digest, model_facts, refused
from depthlens.readout.tuned import TunedFolder
from depthlens.readout.tuned_package import TunedPackageFolder

FORMATS: dict[LensKind, LensFormat] = {
    "tuned": TunedFolder(),
    "tuned-package": TunedPackageFolder(),
    "jacobian": JacobianArtifact(),
}
"""Each fitted lens kind's class: which paths hold it, its stamp, its matrices."""

_MATRICES: dict[tuple[str, str, str, str], Translators] = {}  # (kind, path, digest, device)
_CHECKED: weakref.WeakKeyDictionary[Any, set[str]] = (
    weakref.WeakKeyDictionary()
)  # model → digests that fit it


def format_of(spec: LensSpec) -> LensFormat:
    """The class of the lens ``spec`` names: its kind's, or — for ``tuned:PATH`` not yet resolved — whichever tuned
    form the folder holds. Refused naming the ``lens`` setting where the path holds none."""
    path, given = Path(str(spec.path)), str(spec)
    if spec.kind != "tuned":
        fmt = FORMATS[spec.kind]
        if not fmt.holds(path):
            hint = (
                "a J-lens .pt artifact (`depthlens lens fit --kind jacobian --out FILE`)"
                if (spec.kind == "jacobian")
                else "a tuned-lens package folder (params.pt + config.json)"
            )
            raise refused(given, f"no such file there; give {hint}" if not path.exists() else f"not {hint}")
        return fmt
    for kind in ("tuned", "tuned-package"):
        if FORMATS[kind].holds(path):
            return FORMATS[kind]
    return FORMATS["tuned"]  # whose read says what is missing


def resolve_lens(lens: str | LensSpec, digest: str | None = None) -> LensSpec:
    """``lens`` (the text a front was given, or a spec) resolved once: its form found, its stamp read and its fit's
    digest taken. ``digest`` — a store's record of the fit — refuses a path that holds another fit by now. The
    logit lens, and a spec already resolved, are returned as they are."""
    spec = LensSpec.parse(lens, digest)
    if spec.path is None or spec.stamp is not None:
        return spec
    fmt = format_of(spec)
    path = Path(spec.path)
    stamp = fmt.read(path, str(spec))
    found = stamp.get("digest") or file_digest(fmt.weights_file(path))
    if spec.digest not in (None, found):
        raise refused(
            str(spec),
            f"the lens there is fit {found}, not {spec.digest} that this store was read with; write a new store, or "
            "restore that lens",
        )
    return LensSpec(fmt.kind, spec.path, found, {**stamp, "digest": found})


def matrices(spec: LensSpec, device: torch.device | str) -> Translators:
    """The pre-norm matrices of the fit ``spec`` names, float32 on ``device``, read once per fit and device — the
    one cache the transformers readout and the vLLM worker share; refused when the path holds another fit than
    ``spec.digest`` by now (refitted since the run was set up)."""
    fmt = FORMATS[spec.kind]
    path = Path(str(spec.path)).resolve()
    key = (spec.kind, str(path), str(spec.digest), str(device))
    if key not in _MATRICES:
        if not fmt.holds(path) or file_digest(fmt.weights_file(path)) != spec.digest:
            raise refused(
                str(spec),
                f"the path holds another fit than {spec.digest}, which this run was checked against; restore "
                "that lens, or start the run again",
            )
        _MATRICES[key] = fmt.load(path, str(spec)).to(device)
    return _MATRICES[key]


def check_model(lm: LoadedModel, spec: LensSpec) -> None:
    """``lens_files.check_fit`` against ``lm``, once per model and fit."""
    checked = _CHECKED.setdefault(lm.model, set())
    if spec.digest not in checked:
        check_fit(spec, model_facts(lm), lm.name)
        checked.add(str(spec.digest))


def build(lm: LoadedModel, config: ReadoutConfig, vocab: int | None) -> LogitLens:
    """The lens ``config`` carries, for ``lm``: the logit lens, or a fitted lens (resolved here if the config was
    built without it) checked to fit ``lm`` and read through its matrices."""
    spec = config.lens
    if spec.path is None:
        return LogitLens(lm.parts, vocab_size=vocab, final_norm=config.final_norm)
    spec = resolve_lens(spec)
    check_model(lm, spec)
    found = matrices(spec, lm.device)
    return TranslatedLens(
        lm.parts, found.weight, found.bias, vocab, config.final_norm, stamp=spec.stamp, kind=spec.kind
    )


def with_lens(config: ReadoutConfig, lens: str | LensSpec) -> ReadoutConfig:
    """``config`` reading through ``lens`` (resolved)."""
    return dataclasses.replace(config, lens=resolve_lens(lens))
