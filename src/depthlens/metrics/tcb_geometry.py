"""The TCB paper's study quantities built on δ_TCB's closed form (``metrics.tcb``): ‖J‖_F with the competing tokens'
rows moved while the output distribution is held (§4.2's geometry ablation), the effective-vocabulary bands the
regime study reports, and the generation trace's sharp drops."""

from __future__ import annotations

import torch

from depthlens.metrics.tcb import Unembedding, _anchored, final_output


def geometry_ablation(
    unembed: Unembedding,
    normed: torch.Tensor,
    row_norms_sq: torch.Tensor,
    top_k: int = 10,
    scales: tuple[float, ...] = (0.5, 1.0, 1.5),
) -> dict[str, torch.Tensor]:
    """‖J‖_F with the output distribution o held fixed while the competing tokens' rows move (the TCB paper, §4.2).

    The competitors are the ``top_k`` most probable tokens; each of their rows w̃_i moves to c + α (w̃_i − c), c
    their probability-weighted centroid, for every α in ``scales`` (α < 1 clusters, α > 1 disperses; α = 1 is the
    model as it is). o is not recomputed from the moved rows — the counterfactual isolates geometry. ‖J‖_F is the
    anchored closed form of ``log_jacobian_frobenius`` (the origin-expanded one loses every digit on a peaked o),
    anchored at the top token's moved row; only k rows change, so its sums over the other tokens are updated by
    their deltas: Σ q_j w̃_j by Σ_C q_i Δw_i, ν̂ by Σ_C q_i² Δw_i, F by Σ_C q_i² (‖w̃_i'‖² − ‖w̃_i‖²) (q_k = 0).
    States [c, d] → {"v_eff", "frobenius_<α>"} each [c].
    """
    out = final_output(unembed, normed)
    y, s = out.logits, out.slope_or_ones
    o = out.o
    k_top = y.argmax(-1, keepdim=True)  # [c, 1] the anchor
    others = y.scatter(-1, k_top, float("-inf"))
    r = (torch.logsumexp(others, -1) - torch.logsumexp(y, -1)).exp()  # Σ_{j≠k} o_j, never 1 − o_k
    o_top = o.gather(-1, k_top).squeeze(-1)
    q = torch.softmax(others, -1)  # [c, V], q_k = 0
    q_sq = q * q
    mu = unembed.times_w(q * s)
    nu = unembed.times_w(q_sq * s)
    first = (q_sq * s * s) @ row_norms_sq.to(y.dtype)
    spread = q_sq.sum(-1)
    k = min(top_k, o.shape[-1])
    top = o.topk(k, dim=-1).indices  # [c, k]; the anchor is among them (the most probable)
    p = o.gather(-1, top)  # [c, k]
    q_top = q.gather(-1, top)  # [c, k], 0 at the anchor
    rows = unembed.weight[top].double() * s.gather(-1, top)[..., None]  # [c, k, d] scaled rows w̃_i
    centroid = (p[..., None] * rows).sum(1) / p.sum(-1, keepdim=True)  # [c, d]
    at_anchor = (top == k_top).double()[..., None]  # [c, k, 1]: which competitor is the anchor
    result = {"v_eff": 1.0 / (o * o).sum(-1)}
    for alpha in scales:
        moved = centroid[:, None] + alpha * (rows - centroid[:, None])
        delta = moved - rows
        anchor = (at_anchor * moved).sum(1)  # the anchor's row, moved with the others
        mu_a = mu + (q_top[..., None] * delta).sum(1)
        nu_a = nu + (q_top[..., None] ** 2 * delta).sum(1)
        first_a = first + (q_top**2 * (moved.pow(2).sum(-1) - rows.pow(2).sum(-1))).sum(-1)
        inner = _anchored(o_top, r, anchor, mu_a, nu_a, first_a, spread)
        result[f"frobenius_{alpha:g}"] = r * inner.clamp_min(0.0).sqrt()
    return result


V_EFF_BANDS = (
    (0.0, 20.0, "<20"),
    (20.0, 100.0, "20–100"),
    (100.0, float("inf"), ">100"),
)  # the TCB paper, Table 2


def v_eff_band(v_eff: float) -> str:
    """The paper's V_eff band of a token: "<20", "20–100" or ">100"."""
    return next(label for lo, hi, label in V_EFF_BANDS if lo <= v_eff < hi)


def sharp_drops(
    tcb: torch.Tensor,
    log_prob: torch.Tensor,
    window: int = 8,
    factor: float = 10.0,
    max_perplexity: float = 2.0,
) -> torch.Tensor:
    """Flags tokens whose δ_TCB falls sharply while the model stays confident; [T], [T] → [T] bool.

    Rule: δ_t ≤ median(δ_{t−window..t−1}) / ``factor`` (a tenfold drop below the recent typical level by
    default) and the token's perplexity exp(−log p_t) ≤ ``max_perplexity``. The first token has no history and
    is never flagged; shorter histories use what there is.
    """
    flags = torch.zeros(tcb.shape[0], dtype=torch.bool)
    for t in range(1, tcb.shape[0]):
        recent = tcb[max(0, t - window) : t]
        flags[t] = bool(tcb[t] <= recent.median() / factor and torch.exp(-log_prob[t]) <= max_perplexity)
    return flags
