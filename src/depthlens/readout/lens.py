"""The lenses: a residual-stream state → the distribution the model would output from it (docs/definitions.md §1).

Logit lens: z_l = post(W_U · norm(h_l)); tuned lens: z_l = post(W_U · norm(A_l h_l + b_l)), a per-layer affine
translator fitted to the model (``studies.lens_fit``). The matmul runs in the model's dtype, everything after it in
float32. Every lens reads layer L (the model's own output) as the model does: no translator there.
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


class TunedLens(LogitLens):
    """The logit lens after a per-layer affine translator: layer l is read from A_l h + b_l (Belrose et al. 2023).

    ``weight`` [L−1, d, d] and ``bias`` [L−1, d] (float32) hold A_l and b_l for layers 1..L−1; the product runs in
    float32 and is cast back to the state's dtype before the norm, so identity translators read exactly what the
    logit lens reads (tested). ``stamp`` is the fit's JSON stamp (``readout.tuned``).
    """

    name = "tuned"

    def __init__(
        self,
        parts: ModelParts,
        weight: torch.Tensor,
        bias: torch.Tensor,
        vocab_size: int | None = None,
        final_norm: bool = True,
        stamp: dict | None = None,
    ) -> None:
        super().__init__(parts, vocab_size, final_norm)
        if weight.ndim != 3 or weight.shape[1] != weight.shape[2] or bias.shape != weight.shape[:2]:
            raise ValueError(
                f"tuned lens: weight {tuple(weight.shape)} and bias {tuple(bias.shape)} must be [L−1, d, d], [L−1, d]"
            )
        self.weight = weight.float()
        self.bias = bias.float()
        self.stamp = stamp or {}

    def to(self, device: torch.device) -> TunedLens:
        """The translators on ``device`` (where the model's states are)."""
        self.weight, self.bias = self.weight.to(device), self.bias.to(device)
        return self

    def translate(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        out = hidden.float() @ self.weight[layer - 1].T + self.bias[layer - 1]
        return out.to(hidden.dtype)

    def translate_block(self, hidden: torch.Tensor, first: int) -> torch.Tensor:
        k = hidden.shape[0]
        weight, bias = self.weight[first - 1 : first - 1 + k], self.bias[first - 1 : first - 1 + k]
        flat = hidden.float().reshape(k, -1, hidden.shape[-1])
        out = torch.bmm(flat, weight.transpose(1, 2)) + bias[:, None, :]
        return out.reshape(hidden.shape).to(hidden.dtype)
