"""The elementwise half of δ_TCB's anchored closed form (``metrics.tcb``), from the final mapping's scores in a few
passes over the vocabulary. Pure tensor function; ``metrics.fused`` compiles it where the lens is compiled.

Every term the closed form, V_eff, exp H and the margin need comes from one anchored softmax over the tokens other
than the top one, k. With y the scores (logits, or log-probabilities: a row's shift changes nothing here), m₂ the
largest of the others and e_j = exp(y_j − m₂) (0 at k), s = Σ e_j ≥ 1:

    q = e / s,   log r = a − log(e^{y_k} + e^{a}) with a = m₂ + log s,   o_k = exp(y_k − log(e^{y_k} + e^{a}))
    Σ o² = o_k² + r² Σ q²,   H(o) = −o_k (y_k − lse) − r (Σ q_j (y_j − m₂) − log s + log r),   margin = y_k − m₂

so o itself, 1 − o_k and a log-softmax of the whole row are never formed, and nothing cancels: r comes from the
others' own sum, and each sum is of terms of one sign. Over [c, V]: the block maxima of the top two
(``metrics.layer_top.top_k_by_blocks``), the shift and its exp, their sum, q and q² (written straight into the
operand of the two products μ = Σ q_j w_j and ν̂ = Σ q_j² w_j, which share one), one product with [‖w‖², 1] for
F = Σ q² ‖w‖² and R = Σ q², and one row-wise dot for the entropy — against some thirty passes and a second
log-softmax of the whole row before (docs/performance.md, "TCB beside the lens").
"""

from __future__ import annotations

import torch

from depthlens.metrics.layer_top import top_k_by_blocks

AnchoredSoftmax = tuple[torch.Tensor, ...]
"""(operand [2, c, V]: q and q² (or [4, c, V] split), anchor k [c] int64, log r, o_k, margin, F, R, Σ o², H(o): each
[c]), the working dtype of the scores."""


def anchored_softmax(
    scores: torch.Tensor, row_norms_sq: torch.Tensor, split: torch.dtype | None = None
) -> AnchoredSoftmax:
    """The anchored softmax of ``scores`` [c, V] (float32 or float64 logits or log-probabilities) and the sums over
    it that δ_TCB, V_eff and the margin need (module docstring); ``row_norms_sq`` [V]: ‖w_i‖² (‖w̃_i‖² is not
    supported: the closed form with logit post-processing stays in ``metrics.tcb.log_jacobian_frobenius``).

    ``split`` (bf16 / fp16, for a product with reduced-precision W on CUDA): the operand as [4, c, V] in that dtype,
    q and q² each as a high and a low part (hi = round(x), lo = round(x − hi): x kept to ~16 bits), so the split is
    fused with the rest where this is compiled (``metrics.tcb.Unembedding.times_w_split`` sums the parts)."""
    values, ids = top_k_by_blocks(scores, 2)  # [c, 2]: y_k, m₂ and the anchor k
    top, y_top, second = ids[:, :1], values[:, 0], values[:, 1:]
    shifted = scores - second  # [c, V] y_j − m₂ (≤ 0 but at k)
    both = scores.new_empty(2, *scores.shape)  # the products' operand: q, then q²
    e = torch.exp(shifted, out=both[1]).scatter_(-1, top, 0.0)  # q² is written over it below
    total = e.sum(-1, keepdim=True)  # s ≥ 1: the second's own term is 1
    q = torch.div(e, total, out=both[0])
    q_sq = torch.mul(q, q, out=both[1])
    weights = torch.stack(
        [row_norms_sq.to(scores.dtype), torch.ones_like(row_norms_sq, dtype=scores.dtype)], -1
    )
    first, spread = (q_sq @ weights).unbind(-1)  # F = Σ q² ‖w‖², R = Σ q²
    dot = (q * shifted).sum(-1)  # Σ q_j (y_j − m₂); q_k = 0 drops the anchor
    log_total = total.squeeze(-1).log()
    a = second.squeeze(-1) + log_total  # log Σ_{j≠k} e^{y_j}
    lse = torch.logaddexp(y_top, a)
    log_r, o_top = a - lse, (y_top - lse).exp()
    r = log_r.exp()
    sum_sq = o_top * o_top + r * r * spread
    entropy = -o_top * (y_top - lse) - r * (dot - log_total + log_r)
    if split is not None:
        high = both.to(split)
        both = torch.cat([high, (both - high.to(both.dtype)).to(split)])  # [q_hi, q²_hi, q_lo, q²_lo]
    return both, top.squeeze(-1), log_r, o_top, y_top - second.squeeze(-1), first, spread, sum_sq, entropy
