"""Divergences between a layer's distribution and the final layer's (docs/definitions.md §2). Pure tensor functions.

Inputs are float32 log-probabilities [..., V] (log_softmax output), so no probability is renormalised here.
"""

from __future__ import annotations

import math

import torch

from depthlens.config import Divergence


def zero_nan(terms: torch.Tensor) -> torch.Tensor:
    """``terms`` with NaN set to 0, in place: the 0·log 0 = 0 convention for p·(…) products where p = 0 met a
    −inf log (infinities are kept). One pass, where a ``torch.where(p > 0, …)`` takes three."""
    return terms.nan_to_num_(nan=0.0, posinf=math.inf, neginf=-math.inf)


def _kl_terms(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    # p·(log p − log q) with the 0·log 0 = 0 convention, also where p underflows to exactly 0.
    return zero_nan(logp.exp() * (logp - logq)).sum(dim=-1)


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) in nats over the last axis; [..., V] → [...]."""
    return _kl_terms(logp, logq).clamp_min(0.0)


def js_divergence(logp: torch.Tensor, logq: torch.Tensor, base: float = 2.0) -> torch.Tensor:
    """Jensen–Shannon divergence over the last axis; [..., V] → [...]; base 2 → bits, bounded by 1.

    JSD(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m), m = ½ (p + q). log m = log(p + q) − log 2 from the probabilities:
    where it underflows (p and q both 0) both terms are 0 anyway, and where p > 0, m ≥ p/2 is as representable
    as p. (``torch.logaddexp`` gives the same to ~1e-7 at twice the cost: it was a third of the readout's time.)
    """
    p, q = logp.exp(), logq.exp()
    logm = (p + q).log_() - math.log(2.0)
    nats = 0.5 * (zero_nan(p * (logp - logm)) + zero_nan(q * (logq - logm))).sum(dim=-1)
    upper = math.log(2.0)  # rounding can push a few ulps past the bound
    return nats.clamp(0.0, upper) / math.log(base)


def cosine_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """1 − cos(x, y) over the last axis, in float32; [..., d] → [...]."""
    return 1.0 - torch.nn.functional.cosine_similarity(x.float(), y.float(), dim=-1, eps=1e-12)


def layer_divergence(
    kind: Divergence,
    final_logprobs: torch.Tensor,
    layer_logprobs: torch.Tensor,
    final_normed: torch.Tensor | None = None,
    layer_normed: torch.Tensor | None = None,
) -> torch.Tensor:
    """D_{t,l} for a chunk of tokens, [c, V] (and [c, d] for cosine) → [c]."""
    if kind == "jsd":
        return js_divergence(final_logprobs, layer_logprobs, base=2.0)
    if kind == "jsd-nat":
        return js_divergence(final_logprobs, layer_logprobs, base=math.e)
    if kind == "kl":
        return kl_divergence(final_logprobs, layer_logprobs)
    if kind != "cosine":
        raise ValueError(f"unknown divergence {kind!r}; expected jsd, jsd-nat, kl or cosine")
    if final_normed is None or layer_normed is None:
        raise ValueError("the cosine divergence needs the normalised hidden states of both layers")
    return cosine_distance(layer_normed, final_normed)
