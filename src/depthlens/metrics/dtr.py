"""Settling depth and the deep-thinking ratio (definitions.md §2). Pure functions of a [tokens, layers] table.

Layers are counted 1..L over transformer blocks; column l − 1 of ``divergence_tl`` holds D_{t,l}, and the last
column is D_{t,L} = 0 by definition, so every token settles by layer L.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from depthlens.config import DeepRule, DTRConfig


def settling_depth(divergence_tl: torch.Tensor, g: float) -> torch.Tensor:
    """c_t = min{ l : min_{j ≤ l} D_{t,j} ≤ g }, 1-based; [T, L] → [T] (long).

    The cumulative minimum makes a token that dips below g once count as settled there, even if a later layer
    diverges again (non-monotone trajectories).
    """
    if divergence_tl.ndim != 2:
        raise ValueError(f"divergence_tl must be [tokens, layers], got shape {tuple(divergence_tl.shape)}")
    running_min = torch.cummin(divergence_tl, dim=1).values
    settled = running_min <= g
    settled[:, -1] = True  # D_{t,L} = 0 ≤ g for any g ≥ 0
    return settled.int().argmax(dim=1) + 1


def deep_threshold(n_layers: int, rho: float, rule: DeepRule = "spec") -> int:
    """The first layer of the deep regime: ⌈ρ·L⌉ (``spec``) or ⌈(1 − ρ)·L⌉ (``paper-literal``).

    Rounded to 9 decimals before the ceiling so that 0.8 × 10 is layer 8, not 9 (8.000000000000002).
    """
    fraction = rho if rule == "spec" else 1.0 - rho
    return max(1, math.ceil(round(fraction * n_layers, 9)))


def deep_flags(settling: torch.Tensor, n_layers: int, rho: float, rule: DeepRule = "spec") -> torch.Tensor:
    """Deep-thinking tokens: those that settle at or after the deep threshold; [T] → [T] bool."""
    return settling >= deep_threshold(n_layers, rho, rule)


def deep_thinking_ratio(deep: torch.Tensor, prefix: int | None = None) -> float | None:
    """Share of deep-thinking tokens, over all tokens or the first ``prefix``; None for no tokens."""
    window = deep if prefix is None else deep[:prefix]
    if window.numel() == 0:
        return None
    return float(window.double().mean())


def mean_settling_depth(settling: torch.Tensor) -> float | None:
    """Average c_t (in layers); None for no tokens."""
    return float(settling.double().mean()) if settling.numel() else None


def matched_threshold(reference_tl: torch.Tensor, g: float, other_tl: torch.Tensor, deep_from: int) -> float:
    """A threshold for another divergence kind that flags the same share of tokens as deep-thinking.

    A token is deep iff it has not settled by layer ``deep_from`` − 1, i.e. min_{l < deep_from} D_{t,l} > g. The
    kinds have different units (bits, nats, cosine distance), so no fixed g compares them fairly; at the matched
    threshold the KL or cosine DTR is as strict as the JSD DTR at ``g`` on the same tokens, and only *which*
    tokens (hence responses) are deep differs. Inputs are [T, L] (rows of all responses stacked).
    """
    if deep_from <= 1:
        return g  # every token is deep whatever the threshold
    ref = reference_tl[:, : deep_from - 1].min(dim=1).values.double()
    oth = other_tl[:, : deep_from - 1].min(dim=1).values.double().numpy()
    if ref.numel() == 0 or oth.size == 0:
        raise ValueError("matched_threshold needs at least one token")
    deep_share = float((ref > g).double().mean())
    return float(np.quantile(oth, 1.0 - deep_share))


def settling_and_deep(
    divergence: Sequence[Sequence[float]] | np.ndarray,
    n_layers: int,
    dtr: DTRConfig,
    layer_top_ids: Sequence[Sequence[Sequence[int]]] | np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Settling depths c_t [R] (long) and deep-thinking flags [R] of R read-out tokens from their [R][L] divergence
    rows (R may be 0): what the sample store, the server and voting all derive from the same rows. Under the top-K
    rule (``dtr.settle`` ``topk:K``) from each layer's stored top-k ids instead (``layer_top_ids`` [R][L][K'],
    K' ≥ K: ``topk_agreement_from_ids``)."""
    k = dtr.top_k
    if k is None:
        table = torch.tensor(divergence, dtype=torch.float32).reshape(-1, n_layers)
        settling = settling_depth(table, dtr.g)
    else:
        settling = topk_settling_depth(topk_agreement_from_ids(layer_top_ids, n_layers, k))
    return settling, deep_flags(settling, n_layers, dtr.rho, dtr.deep_rule)


def topk_agreement_from_ids(
    layer_top_ids: Sequence[Sequence[Sequence[int]]] | np.ndarray | None, n_layers: int, k: int
) -> torch.Tensor:
    """Whether each read-out token's top-``k`` set at each layer equals the final layer's, from stored top-k ids
    [R][L][K'] (K' ≥ k, each layer's ids by descending probability): [R, L] bool, as ``topk_agreement`` reads it
    from the logits (sets, not orders). ValueError naming what is missing when the ids cannot answer for ``k``."""
    if layer_top_ids is None:
        raise ValueError(
            f"the top-{k} rule needs each layer's top-k token ids (layer_top_ids), and there are none"
        )
    stored = np.asarray(layer_top_ids, dtype=np.int64)
    if stored.size == 0:  # no read-out tokens
        return torch.zeros((0, n_layers), dtype=torch.bool)
    ids = torch.from_numpy(stored.reshape(-1, n_layers, stored.shape[-1]))
    if ids.shape[-1] < k:
        raise ValueError(f"the top-{k} rule needs each layer's top {k} token ids; {ids.shape[-1]} are stored")
    top = ids[..., :k].sort(dim=-1).values
    return (top == top[:, -1:, :]).all(dim=-1)


def response_depth(
    divergence: Sequence[Sequence[float]],
    n_layers: int,
    dtr: DTRConfig,
    prefix: int | None,
    layer_top_ids: Sequence[Sequence[Sequence[int]]] | np.ndarray | None = None,
) -> dict[str, object]:
    """The depth of one response from its [R][L] divergence rows (R read-out tokens, R may be 0), as the sample
    store, the server and the Python API carry it: per-token ``settling_depth`` (c_t) and ``deep``, the response's
    ``dtr`` over its read-out tokens, ``dtr_prefix`` over the first ``prefix`` of them (None: all) and
    ``mean_settling_depth`` (the ratios and the mean are None for no tokens). ``layer_top_ids``: each layer's
    stored top-k, which the top-K rule settles from."""
    settling, deep = settling_and_deep(divergence, n_layers, dtr, layer_top_ids)
    return {
        "settling_depth": settling.tolist(),
        "deep": deep.tolist(),
        "dtr": deep_thinking_ratio(deep),
        "dtr_prefix": deep_thinking_ratio(deep, prefix),
        "mean_settling_depth": mean_settling_depth(settling),
    }


def deep_from_divergence(
    divergence: Sequence[Sequence[float]],
    n_layers: int,
    dtr: DTRConfig,
    layer_top_ids: Sequence[Sequence[Sequence[int]]] | np.ndarray | None = None,
) -> torch.Tensor:
    """Deep-thinking flags [R] of R read-out tokens from their stored [R][L] divergence rows (R may be 0), or
    under the top-K rule from their stored top-k ids."""
    return settling_and_deep(divergence, n_layers, dtr, layer_top_ids)[1]


def topk_agreement(final_logprobs: torch.Tensor, layer_logits: torch.Tensor, k: int) -> torch.Tensor:
    """Whether each row's top-``k`` token set at one layer equals the final layer's: [c, V] × [c, V] → [c] bool.

    Sets, not orders: the two top-k id lists are compared sorted. Ties at the k-th place are broken as
    ``torch.topk`` breaks them, on both sides alike.
    """
    k = min(k, final_logprobs.shape[-1])
    final = final_logprobs.topk(k, dim=-1).indices.sort(dim=-1).values
    layer = layer_logits.topk(k, dim=-1).indices.sort(dim=-1).values
    return (final == layer).all(dim=-1)


def topk_settling_depth(agree_tl: torch.Tensor) -> torch.Tensor:
    """c_t = min{ l : the top-K set equals the final layer's at every layer j ≥ l }, 1-based; [T, L] bool → [T].

    DTR-explorer's rule: unlike the divergence rule's cumulative minimum, a layer that agrees and a later one that
    does not leave the token unsettled until the agreement holds to the end. Column L agrees by definition.
    """
    if agree_tl.ndim != 2:
        raise ValueError(f"agree_tl must be [tokens, layers], got shape {tuple(agree_tl.shape)}")
    agree = agree_tl.bool().clone()
    agree[:, -1] = True
    trailing = agree.flip(1).int().cumprod(dim=1).sum(dim=1)  # layers agreeing from the last one backwards
    return agree.shape[1] - trailing + 1
