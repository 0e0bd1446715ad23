"""The Jacobian lens (``kind`` ``jacobian``; Gurnee et al. 2026, the reference estimator of
``anthropics/jacobian-lens``, TransformerLens ≥ 4's ``JacobianLens``): its published artifact, read and written as
published, and its estimator on one prompt. docs/definitions.md §1.

Layer l (1..L−1) is read as z = post(W_U · norm(J_l h_l)), with

    J_l = E_prompt[ (1/|V|) Σ_{t∈V} Σ_{t'∈V, t'≥t} ∂h_{final,t'} / ∂h_{l,t} ],

``h_final`` the last block's output before the final norm, ``h_l`` block l's output, V a prompt's positions after
the first ``SKIP_FIRST`` (attention sinks) but the last. Layer L is the model's own output (the identity).

The artifact is one ``torch.save`` dict: ``J`` {block: [d, d]} (float16 as published, or float32), ``n_prompts``,
``source_layers`` (the blocks fitted, 0..L−2), ``d_model`` and ``metadata`` (TransformerLens's provenance keys,
and depthlens's stamp under ``metadata["depthlens"]``). Its numbering is the blocks': depthlens's layer l is
``J[l − 1]``. It is loaded with ``torch.load(weights_only=True)`` — a file that needs pickled code is refused —
and refused, naming the ``lens`` setting, when it is not square, not finite, or leaves a layer out.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from depthlens.config import JACOBIAN_SKIP_FIRST, LensKind
from depthlens.models.load import LoadedModel
from depthlens.readout.lens_files import Translators, hidden_size, refused
from depthlens.readout.tuned_package import safe_state

SKIP_FIRST = (
    JACOBIAN_SKIP_FIRST  # leading positions no source or target is read at (the SPEC's; the reference's)
)
ARTIFACT_FORMAT = "jacobian-lens"
METADATA_TYPES = (type(None), bool, int, float, str)


class JacobianArtifact:
    """A J-lens ``.pt`` artifact (``readout.lens_files.LensFormat``)."""

    kind: ClassVar[LensKind] = "jacobian"

    def holds(self, path: Path) -> bool:
        return path.is_file()

    def weights_file(self, path: Path) -> Path:
        return path

    def read(self, path: Path, given: str) -> dict[str, Any]:
        """The stamp: L (the blocks fitted + 1), d, the prompts averaged, and the stamp depthlens's own fit
        leaves in ``metadata["depthlens"]`` (model, fingerprint, corpus, positions, held-out KL)."""
        matrices, payload = checked_payload(path, given)
        metadata = payload.get("metadata") or {}
        ours = metadata.get("depthlens")
        ours = ours if isinstance(ours, dict) else {}
        provenance = {k: v for k, v in metadata.items() if k != "depthlens" and isinstance(v, METADATA_TYPES)}
        return {
            **ours,
            "format": ARTIFACT_FORMAT,
            "n_layers": len(matrices) + 1,
            "d": int(payload["d_model"]),
            "n_prompts": int(payload.get("n_prompts", 0)),
            "provenance": provenance,
        }

    def load(self, path: Path, given: str) -> Translators:
        matrices, _ = checked_payload(path, given)
        return Translators(torch.stack([m.float() for m in matrices]))


def checked_payload(path: Path, given: str) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """The artifact's matrices in layer order (J[0] = depthlens's layer 1) and the payload, or a one-line refusal
    naming what is wrong: another schema, layers missing or out of order, a matrix not d × d, NaN or inf."""
    payload = safe_state(path, given)
    if "J" not in payload:
        what = (
            "a J-lens fit checkpoint (jacobian_sum), not an artifact: finish its fit with --resume"
            if ("jacobian_sum" in payload)
            else f"no J key (its keys: {sorted(map(str, payload))[:6]})"
        )
        raise refused(given, f"{path} is not a J-lens artifact: {what}")
    jmap, d = payload["J"], payload.get("d_model")
    if not isinstance(jmap, dict) or not jmap or not isinstance(d, int) or d < 1:
        raise refused(given, f"{path}: J must be a non-empty dict of matrices and d_model a whole number ≥ 1")
    layers = sorted(int(k) for k in jmap)
    listed = payload.get("source_layers", layers)
    if sorted(int(x) for x in listed) != layers:
        raise refused(given, f"{path}: J holds blocks {layers} but source_layers says {list(listed)}")
    missing = sorted(set(range(layers[-1] + 1)) - set(layers))
    if layers[0] < 0 or missing:
        raise refused(
            given,
            f"{path}: blocks {missing or layers[:1]} missing — depthlens reads every layer 1..L−1 (blocks "
            "0..L−2) through the lens; fit it on every layer",
        )
    matrices = [jmap[k] for k in sorted(jmap, key=int)]
    for block, matrix in enumerate(matrices):
        if not isinstance(matrix, torch.Tensor) or matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            shape = tuple(matrix.shape) if isinstance(matrix, torch.Tensor) else type(matrix).__name__
            raise refused(given, f"{path}: J[{block}] is {shape}, not a square d × d matrix")
        if matrix.shape[0] != d:
            raise refused(given, f"{path}: J[{block}] is {tuple(matrix.shape)} but d_model is {d}")
        if not torch.isfinite(matrix).all():
            raise refused(given, f"{path}: J[{block}] holds NaN or infinite values")
    return matrices, payload


def save_artifact(
    path: Path, weight: torch.Tensor, n_prompts: int, metadata: dict[str, Any], dtype: torch.dtype
) -> None:
    """Write the published artifact at ``path`` whole or not at all (a temporary name, then a rename):
    ``weight`` [L−1, d, d] holds depthlens's layers 1..L−1, saved as blocks 0..L−2 in ``dtype``."""
    check_metadata(metadata, "metadata")
    payload = {
        "J": {
            block: weight[block].detach().to("cpu", dtype).contiguous() for block in range(weight.shape[0])
        },
        "n_prompts": int(n_prompts),
        "source_layers": list(range(weight.shape[0])),
        "d_model": int(weight.shape[-1]),
        "metadata": metadata,
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(payload, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def check_metadata(value: Any, where: str) -> None:
    """What ``torch.load(weights_only=True)`` reloads: None, bool, int, float, str, lists and str-keyed dicts."""
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_metadata(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: key {key!r} is not a string")
            check_metadata(item, f"{where}.{key}")
    elif not isinstance(value, METADATA_TYPES):
        raise ValueError(f"{where}: {type(value).__name__} would not reload with weights_only")


# ---- the estimator on one prompt --------------------------------------------------------------------------------


@contextlib.contextmanager
def frozen(model: torch.nn.Module) -> Iterator[None]:
    """Parameters frozen for the fit and restored after: the graph is rooted at the residual stream, not the
    weights, so the backward computes no parameter gradient."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def cotangent_bytes(lm: LoadedModel, tokens: int) -> int:
    """Memory one batched cotangent costs a backward over a ``tokens``-token prompt: every source layer's
    gradient [tokens, d] held to the end, and the widest block's temporaries (MLP, attention scores). Measured
    on SmolLM2-135M at 128 tokens: 28 MB each (peak RSS at 32 cotangents less that at 8, over 24; this count
    gives 27; docs/performance.md)."""
    config = lm.model.config
    d = hidden_size(lm)
    heads = int(getattr(config, "num_attention_heads", 16) or 16)
    inner = int(getattr(config, "intermediate_size", 4 * d) or 4 * d)
    return 4 * tokens * (2 * (lm.n_layers - 1) * d + 8 * inner + 8 * heads * tokens)


def dim_batch_for(lm: LoadedModel, tokens: int, memory_mb: int) -> int:
    """Cotangents per backward that fit ``memory_mb``: at least 1, at most d."""
    return max(1, min(hidden_size(lm), memory_mb * 2**20 // cotangent_bytes(lm, tokens)))


def _forward_with_sources(lm: LoadedModel, ids: Sequence[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward with gradients from block 0's output on: (h_final [1, T, d], the final norm's input; block
    outputs 0..L−2 [1, T, d] — depthlens's layers 1..L−1), all in one graph."""
    n = lm.n_layers
    outputs: list[torch.Tensor | None] = [None] * (n - 1)
    target: list[torch.Tensor] = []

    def keep(index: int) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            state = output[0] if isinstance(output, tuple) else output
            if index == 0 and not state.requires_grad:
                state.requires_grad_(True)  # the graph's root: every later state depends on it
            outputs[index] = state

        return hook

    handles = [block.register_forward_hook(keep(i)) for i, block in enumerate(lm.parts.blocks[: n - 1])]
    handles.append(lm.parts.final_norm.register_forward_pre_hook(lambda _m, args: target.append(args[0])))
    try:
        lm.model(input_ids=torch.tensor([list(ids)], device=lm.device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    if not target or any(o is None for o in outputs):
        raise RuntimeError("the J-lens fit could not capture every block's output and the final norm's input")
    return target[-1], [o for o in outputs if o is not None]


def prompt_jacobian(
    lm: LoadedModel, ids: Sequence[int], dim_batch: int, skip_first: int = SKIP_FIRST
) -> torch.Tensor:
    """One prompt's term of the estimator, [L−1, d, d] float32 on the model's device: per layer l, row i is
    (1/|V|) Σ_{t∈V} ∂(Σ_{t'∈V} h_{final,t'}[i]) / ∂h_{l,t} — one backward per ``dim_batch`` output coordinates
    (one-hot cotangents at every target position, batched with ``is_grads_batched``), every layer's gradient
    from the same backward. Causality makes the sum over t' run over t' ≥ t with no mask."""
    if len(ids) <= skip_first + 1:
        raise ValueError(f"a J-lens prompt needs more than {skip_first + 1} tokens, got {len(ids)}")
    with torch.inference_mode(False), torch.enable_grad(), frozen(lm.model):
        target, sources = _forward_with_sources(lm, ids)
        d, device = target.shape[-1], target.device
        positions = torch.arange(skip_first, len(ids) - 1, device=device)
        jacobian = torch.zeros(len(sources), d, d, dtype=torch.float32, device=device)
        rows = torch.arange(min(dim_batch, d), device=device)
        for lo in range(0, d, len(rows)):
            k = min(len(rows), d - lo)
            cotangent = torch.zeros(k, *target.shape, dtype=target.dtype, device=device)
            cotangent[rows[:k, None], 0, positions[None, :], lo + rows[:k, None]] = 1.0
            grads = torch.autograd.grad(
                target, sources, grad_outputs=cotangent, retain_graph=lo + k < d, is_grads_batched=True
            )
            for layer, grad in enumerate(grads):
                jacobian[layer, lo : lo + k] = grad[:, 0, positions].float().mean(dim=1)
            del grads, cotangent
    return jacobian
