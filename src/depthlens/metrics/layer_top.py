"""Each layer's own predictions: the logit lens's top-k tokens and their probabilities (docs/definitions.md).

Pure tensor functions. The input is what the logit lens reads at a layer — the residual through the final norm and
the unembedding (at layer L, the model's own logits) — so the top-k of layer l answers "what does layer l predict
here?" in the same distribution the divergences compare.

The selection runs on scores before normalisation (logits, or log-probabilities: a row's shift changes no order), by
vocabulary blocks (``top_k_by_blocks``): one pass over the vocabulary takes each block's maximum, and the exact
top-k is then found among the k blocks with the largest maxima. ``torch.topk`` over the whole vocabulary is a
radix select on a GPU (several passes over every row) and a copy of every row into (value, index) pairs on a CPU;
the block maxima are one reduction, which the compiled readout fuses beside its softmax (``metrics.fused``). Only
the k selected values are normalised (their log-probabilities read or the log-normaliser subtracted).
"""

from __future__ import annotations

import torch

BLOCK = 128  # vocabulary entries per block of the selection (a GPU warp's 32 × 4 floats)


def _check_k(k: int, width: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= width:
        raise ValueError(f"layer_top_k: k = {k!r} must be an integer in [1, {width}] (the vocabulary's size)")


def block_size(width: int, k: int) -> int:
    """The block of ``top_k_by_blocks`` for ``k`` of ``width``: about √(width / k) entries (the blocks' maxima and
    the k blocks' candidates then cost alike), as a power of two: ``BLOCK``, halved where k blocks would be a large
    share of the vocabulary (measured on a CPU: 64 beats 128 at k = 20 of 32k, 128 wins at 152k)."""
    return BLOCK if 16 * k * BLOCK <= width else BLOCK // 2


def top_k_by_blocks(
    scores: torch.Tensor, k: int, block: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of each row of ``scores`` [..., V] → (values [..., k] in its dtype, indices
    [..., k] int64), descending — ``torch.topk(scores, k)``, ties apart (either tied entry may be listed).

    Exact by a bound: the k largest block maxima are k distinct entries, so the k-th largest entry is at least the
    k-th largest block maximum, and every entry of the top-k lies in a block whose maximum reaches it — one of the k
    blocks with the largest maxima (ties apart). One pass over V for the maxima ([rows, V / block]), then a top-k of
    the maxima and of the k · block candidates (and the < block entries past the last whole block). Where the
    blocks would not save a pass (fewer than 4 k blocks), one ``torch.topk``.
    """
    width = scores.shape[-1]
    block = block_size(width, k) if block is None else block
    n_blocks = width // block
    if n_blocks < 4 * k:
        return torch.topk(scores, k, dim=-1, largest=True, sorted=True)
    lead = scores.shape[:-1]
    flat = scores.reshape(-1, width)  # [R, V]
    whole = n_blocks * block
    maxima = flat[:, :whole].unflatten(-1, (n_blocks, block)).amax(-1)  # [R, V / block]
    best = maxima.topk(k, dim=-1, sorted=False).indices  # [R, k] blocks
    offsets = torch.arange(block, device=scores.device)
    index = (best[..., None] * block + offsets).flatten(1)  # [R, k · block] their entries
    if whole < width:  # the tail past the last whole block: always a candidate
        tail = torch.arange(whole, width, device=scores.device).expand(flat.shape[0], -1)
        index = torch.cat([index, tail], dim=1)
    values, at = flat.gather(1, index).topk(k, dim=1, largest=True, sorted=True)
    return values.reshape(*lead, k), index.gather(1, at).reshape(*lead, k)


def layer_top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most probable tokens of each distribution: logits [..., V] → (ids int64 [..., k], probabilities
    float32 [..., k]), ordered by probability, descending (ties in either order).

    The softmax is normalised over the full vocabulary in float32, whatever the input's dtype, so a layer's
    probabilities are those the divergences compare. Log-probabilities are accepted too: softmax is unchanged by a
    shift.
    """
    _check_k(k, logits.shape[-1])
    return layer_top_k_of_logprobs(torch.log_softmax(logits.float(), dim=-1), k)


def layer_top_k_of_logprobs(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``layer_top_k`` of a distribution already normalised in float32 (log-probabilities [..., V], the divergence
    walk's own ``log_softmax``): the top-k of the log-probabilities and their ``exp`` — the same ids and, within
    float32 rounding, the same probabilities, without a second pass over the vocabulary for the softmax."""
    _check_k(k, logprobs.shape[-1])
    top_logprobs, top_ids = top_k_by_blocks(logprobs.float(), k)
    return top_ids, top_logprobs.exp()


def layer_top_k_of_logits(
    logits: torch.Tensor, logprobs: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``layer_top_k`` selected on the ``logits`` [..., V] before their normalisation (the same order as their
    log-softmax), with the probabilities of the k selected read from ``logprobs`` (their ``log_softmax``, which the
    divergences take anyway): (ids int64 [..., k], probabilities float32 [..., k]). The selection needs no
    normalised row; only k values per row are read from one."""
    _check_k(k, logits.shape[-1])
    return top_k_probs(top_k_by_blocks(logits, k)[1], logprobs)


def top_k_probs(ids: torch.Tensor, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The probabilities of the selected ``ids`` [..., k], read from ``logprobs`` [..., V] (k values per row, no
    pass over V), and the ids sorted by them, descending: where normalising rounded two near-tied logits into the
    other order, the probabilities still descend. → (ids int64 [..., k], probabilities float32 [..., k])."""
    probs, order = logprobs.gather(-1, ids).float().exp().sort(dim=-1, descending=True, stable=True)
    return ids.gather(-1, order), probs
