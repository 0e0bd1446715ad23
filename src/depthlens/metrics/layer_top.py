"""Each layer's own predictions: the logit lens's top-k tokens and their probabilities (docs/definitions.md).

Pure tensor function. The input is what the logit lens reads at a layer — the residual through the final norm and
the unembedding (at layer L, the model's own logits) — so the top-k of layer l answers "what does layer l predict
here?" in the same distribution the divergences compare.
"""

from __future__ import annotations

import torch


def layer_top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most probable tokens of each distribution: logits [..., V] → (ids int64 [..., k], probabilities
    float32 [..., k]), ordered by probability, descending (ties as ``torch.topk`` orders them).

    The softmax runs over the full vocabulary in float32, whatever the input's dtype, so a layer's probabilities
    are those the divergences compare. Log-probabilities are accepted too: softmax is unchanged by a shift.
    """
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= logits.shape[-1]:
        raise ValueError(
            f"layer_top_k: k = {k!r} must be an integer in [1, {logits.shape[-1]}] (the vocabulary's size)"
        )
    probs = torch.softmax(logits.float(), dim=-1)  # [..., V]
    top_probs, top_ids = torch.topk(probs, k, dim=-1, largest=True, sorted=True)
    return top_ids.to(torch.int64), top_probs


def layer_top_k_of_logprobs(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``layer_top_k`` of a distribution already normalised in float32 (log-probabilities [..., V], the divergence
    walk's own ``log_softmax``): the top-k of the log-probabilities and their ``exp`` — the same ids and, within
    float32 rounding, the same probabilities, without a second pass over the vocabulary for the softmax."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= logprobs.shape[-1]:
        raise ValueError(
            f"layer_top_k: k = {k!r} must be an integer in [1, {logprobs.shape[-1]}] (the vocabulary's size)"
        )
    top_logprobs, top_ids = torch.topk(logprobs.float(), k, dim=-1, largest=True, sorted=True)
    return top_ids.to(torch.int64), top_logprobs.exp()
