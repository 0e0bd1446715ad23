"""The lenses: a residual-stream state → the distribution the model would output from it (docs/definitions.md §1).

Logit lens: z_l = post(W_U · norm(h_l)); tuned lens: z_l = post(W_U · norm(A_l h_l + b_l)), a per-layer affine
translator fitted to the model (``studies.lens_fit``; the ``tuned-lens`` package's h + W_l h + b_l is the same with
A_l = I + W_l); Jacobian lens: z_l = post(W_U · norm(J_l h_l)) (``studies.jacobian_fit``). The matmul runs in the
model's dtype, everything after it in float32. Every lens reads layer L (the model's own output) as the model does:
no transform there.
"""

from __future__ import annotations

import torch

from depthlens.models.adapters import ModelParts


class LogitLens:
    """Projects hidden states of any layer through the final norm, the unembedding and logit post-processing."""

    def __init__(self, parts: ModelParts, vocab_size: int | None = None, final_norm: bool = True) -> None:
        self.parts = parts
        self.vocab_size = vocab_size  # cut padded rows beyond the real vocabulary
        self.apply_norm = final_norm

    name = "logit"

    def translate(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        """The state layer ``layer`` (1..L−1) is read from: ``hidden`` itself under the logit lens."""
        return hidden

    def translate_block(self, hidden: torch.Tensor, first: int) -> torch.Tensor:
        """``translate`` for a block [k, ..., d] of consecutive layers ``first``..``first`` + k − 1."""
        return hidden

    def normed_at(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        """norm(translate(h)) of layer ``layer`` (1..L−1): what the unembedding reads."""
        return self.normed(self.translate(hidden, layer))

    def normed_block(self, hidden: torch.Tensor, first: int) -> torch.Tensor:
        """``normed_at`` for a block [k, ..., d] of consecutive layers from ``first``."""
        return self.normed(self.translate_block(hidden, first))

    def normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """norm(h) for raw residual states ``hidden`` [..., d] (identity under ``--no-final-norm``)."""
        return self.parts.final_norm(hidden) if self.apply_norm else hidden

    def logits_from_normed(self, normed: torch.Tensor) -> torch.Tensor:
        """post(W_U · x) as float32 [..., V] for already-normalised states ``normed`` [..., d]."""
        logits = self.parts.unembed(normed)
        if self.vocab_size is not None:
            logits = logits[..., : self.vocab_size]
        logits = logits.float()
        if self.parts.logit_post is not None:
            logits = self.parts.logit_post(logits)
        return logits

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logit-lens logits, float32 [..., V], for raw residual states ``hidden`` [..., d]."""
        return self.logits_from_normed(self.normed(hidden))

    def final_logits(self, model_logits: torch.Tensor) -> torch.Tensor:
        """The model's own output logits, cut to the vocabulary and in float32 (layer L: never re-normalised)."""
        if self.vocab_size is not None:
            model_logits = model_logits[..., : self.vocab_size]
        return model_logits.float()


class TranslatedLens(LogitLens):
    """The logit lens after a per-layer linear pre-norm transform: layer l is read from W_l h (+ b_l) — the tuned
    lens's affine translator (Belrose et al. 2023, either form: ``readout.tuned``, ``readout.tuned_package``) or the
    Jacobian lens's J_l (``readout.jacobian``). One d × d product per layer, before the norm; the fused readout
    (``metrics.fused``) reads what ``normed_block`` returns, so it takes any lens alike.

    ``weight`` [L−1, d, d] and ``bias`` [L−1, d] or None (float32) hold W_l and b_l for layers 1..L−1; the
    product runs in float32 and is cast back to the state's dtype before the norm, so identity matrices read
    exactly what the logit lens reads (tested). ``kind`` names the lens (``config.LensKind``), ``stamp`` its fit.
    """

    def __init__(
        self,
        parts: ModelParts,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        vocab_size: int | None = None,
        final_norm: bool = True,
        stamp: dict | None = None,
        kind: str = "tuned",
    ) -> None:
        super().__init__(parts, vocab_size, final_norm)
        check_translators(weight, bias)
        self.weight = weight.float()
        self.bias = None if bias is None else bias.float()
        self.stamp = stamp or {}
        self.name = kind

    def to(self, device: torch.device) -> TranslatedLens:
        """The matrices on ``device`` (where the model's states are)."""
        self.weight = self.weight.to(device)
        self.bias = None if self.bias is None else self.bias.to(device)
        return self

    def translate(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        out = hidden.float() @ self.weight[layer - 1].T
        if self.bias is not None:
            out = out + self.bias[layer - 1]
        return out.to(hidden.dtype)

    def translate_block(self, hidden: torch.Tensor, first: int) -> torch.Tensor:
        k = hidden.shape[0]
        weight = self.weight[first - 1 : first - 1 + k]
        flat = hidden.float().reshape(k, -1, hidden.shape[-1])
        out = torch.bmm(flat, weight.transpose(1, 2))
        if self.bias is not None:
            out = out + self.bias[first - 1 : first - 1 + k, None, :]
        return out.reshape(hidden.shape).to(hidden.dtype)


TunedLens = TranslatedLens  # the tuned lens's readout (its name before the Jacobian lens shared the class)


def check_translators(weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """ValueError unless ``weight`` is [L−1, d, d] and ``bias`` [L−1, d] (or None)."""
    square = weight.ndim == 3 and weight.shape[1] == weight.shape[2]
    if not square or (bias is not None and tuple(bias.shape) != tuple(weight.shape[:2])):
        got = f"weight {tuple(weight.shape)}" + ("" if bias is None else f" and bias {tuple(bias.shape)}")
        raise ValueError(f"lens matrices: {got} must be [L−1, d, d] and [L−1, d]")
