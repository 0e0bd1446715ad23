"""The logit lens: a residual-stream state → the distribution the model would output from it (docs/definitions.md §1).

z_l = post(W_U · norm(h_l)); the matmul runs in the model's dtype, everything after it in float32.
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
