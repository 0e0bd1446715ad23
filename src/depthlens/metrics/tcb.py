"""Token Constraint Bound (definitions.md §6). Pure tensor functions of final hidden states and the unembedding.

For a final normalised state h, z = W h (+ b), y = post(z), o = softmax(y), the Jacobian of h ↦ o is
J = (diag(o) − o oᵀ) W̃ with rows w̃_i = s_i w_i, s_i = post'(z_i) (s ≡ 1 without post-processing, so the
paper's J = (diag(o) − o oᵀ) W is the special case; soft-capping and logit scaling stay exact). Row i of J is
o_i (w̃_i − μ), μ = Σ_j o_j w̃_j, hence

    ‖J‖_F² = Σ_i o_i² ‖w̃_i − μ‖² = Σ_i o_i² s_i² ‖w_i‖² − 2 μ·(Σ_i o_i² s_i w_i) + ‖μ‖² Σ_i o_i²

— two [c, V] × [V, d] products per chunk of c tokens, never a V × d matrix per token. δ_TCB = ε / ‖J‖_F.
Everything is accumulated in float64: the three terms nearly cancel when o is peaked, and float32 would lose the
difference. W is upcast one vocabulary block at a time, so no float64 copy of W is ever held whole.
"""

from __future__ import annotations

import dataclasses

import torch

from depthlens.models.adapters import LogitPostFn
from depthlens.readout.lens import LogitLens

_VOCAB_BLOCK = 8192  # rows of W upcast to float64 at a time


@dataclasses.dataclass(frozen=True)
class Unembedding:
    """The final mapping h ↦ post(W h + b), cut to the real vocabulary."""

    weight: torch.Tensor  # [V, d]
    bias: torch.Tensor | None  # [V]
    post: LogitPostFn | None

    @staticmethod
    def from_lens(lens: LogitLens) -> Unembedding:
        """The lens's unembedding weight and bias, cut to its vocabulary, with its logit post-processing."""
        module = lens.parts.unembed
        rows = slice(0, lens.vocab_size)
        bias = getattr(module, "bias", None)
        return Unembedding(
            module.weight[rows].detach(),
            bias[rows].detach() if bias is not None else None,
            lens.parts.logit_post,
        )

    def logits64(self, normed: torch.Tensor) -> torch.Tensor:
        """z = W h + b in float64, [c, d] → [c, V] (pre-post-processing)."""
        z = self.w_times(normed)
        return z + self.bias.double() if self.bias is not None else z

    def times_w(self, a: torch.Tensor) -> torch.Tensor:
        """a W in float64, [c, V] → [c, d], one vocabulary block at a time."""
        out = torch.zeros(a.shape[0], self.weight.shape[1], dtype=torch.float64, device=a.device)
        for start, block in zip(
            range(0, a.shape[1], _VOCAB_BLOCK), self.weight.split(_VOCAB_BLOCK), strict=True
        ):
            out += a[:, start : start + block.shape[0]] @ block.double()
        return out

    def w_times(self, v: torch.Tensor) -> torch.Tensor:
        """v Wᵀ in float64, [c, d] → [c, V]."""
        v = v.double()
        return torch.cat([v @ block.double().T for block in self.weight.split(_VOCAB_BLOCK)], dim=-1)

    def row_norms_sq(self) -> torch.Tensor:
        """‖w_i‖² for every row, float64 [V]."""
        return torch.cat([block.double().pow(2).sum(-1) for block in self.weight.split(_VOCAB_BLOCK)])


@dataclasses.dataclass(frozen=True)
class FinalOutput:
    """The final mapping evaluated at a chunk of states, computed once and shared by every TCB quantity."""

    o: torch.Tensor  # [c, V] float64 output distribution softmax(post(z))
    slope: torch.Tensor  # [c, V] float64 s_i = post'(z_i) (ones without post-processing)
    logits: torch.Tensor  # [c, V] float64 post-processed logits y


def final_output(unembed: Unembedding, normed: torch.Tensor) -> FinalOutput:
    """Evaluate z = W h + b, y = post(z), o = softmax(y) and post'(z) in float64 for states [c, d]."""
    z = unembed.logits64(normed)
    if unembed.post is None:
        return FinalOutput(torch.softmax(z, -1), torch.ones_like(z), z)
    y = unembed.post(z)
    return FinalOutput(torch.softmax(y, -1), unembed.post.derivative(z), y)


def jacobian_frobenius(unembed: Unembedding, out: FinalOutput, row_norms_sq: torch.Tensor) -> torch.Tensor:
    """‖J‖_F per token by the closed form, float64; → [c]."""
    o, s = out.o, out.slope
    o_sq = o * o
    mu = unembed.times_w(o * s)  # [c, d]  Σ_j o_j s_j w_j
    nu = unembed.times_w(o_sq * s)  # [c, d]  Σ_i o_i² s_i w_i
    first = (o_sq * s * s) @ row_norms_sq  # [c]
    norm_sq = first - 2 * (mu * nu).sum(-1) + (mu * mu).sum(-1) * o_sq.sum(-1)
    return norm_sq.clamp_min(0.0).sqrt()


def jacobian_spectral(
    unembed: Unembedding, out: FinalOutput, iterations: int = 100, tol: float = 1e-10
) -> torch.Tensor:
    """‖J‖_2 per token by power iteration on JᵀJ, never forming J; float64, → [c].

    With C = diag(o) − o oᵀ (symmetric): J v = C W̃v and Jᵀu = W̃ᵀ C u, where W̃v = s∘(Wv) and W̃ᵀx = Wᵀ(s∘x).
    """
    o, s = out.o, out.slope

    def centre(x: torch.Tensor) -> torch.Tensor:  # (diag(o) − o oᵀ) x, batched over tokens
        return o * x - o * (o * x).sum(-1, keepdim=True)

    shape = (o.shape[0], unembed.weight.shape[1])
    generator = torch.Generator(device="cpu").manual_seed(0)
    v = torch.randn(shape, generator=generator, dtype=torch.float64).to(o.device)
    v = v / v.norm(dim=-1, keepdim=True)
    sigma_sq = torch.zeros(shape[0], dtype=torch.float64, device=o.device)
    for _ in range(iterations):
        w = unembed.times_w(s * centre(centre(s * unembed.w_times(v))))  # JᵀJ v = W̃ᵀ C² W̃ v, [c, d]
        new_sigma_sq = (v * w).sum(-1)  # Rayleigh quotient vᵀJᵀJv with ‖v‖ = 1
        v = w / w.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        converged = (new_sigma_sq - sigma_sq).abs() <= tol * new_sigma_sq.abs().clamp_min(1e-300)
        sigma_sq = new_sigma_sq
        if bool(converged.all()):
            break
    return sigma_sq.clamp_min(0.0).sqrt()


def token_constraint_terms(
    unembed: Unembedding,
    normed: torch.Tensor,
    row_norms_sq: torch.Tensor,
    epsilon: float = 1.0,
    spectral_iterations: int | None = None,
) -> dict[str, torch.Tensor]:
    """Per-token δ_TCB, V_eff (1/Σo² and exp H), top-2 margin, and (with ``spectral_iterations``) the spectral δ.

    States ``normed`` [c, d] → each term [c] float64; the final mapping is evaluated once for all of them.
    """
    out = final_output(unembed, normed)
    frobenius = jacobian_frobenius(unembed, out, row_norms_sq)
    top2 = out.logits.topk(2, dim=-1).values
    entropy = -(out.o * torch.log(out.o.clamp_min(1e-300))).sum(-1)
    terms = {
        "tcb": epsilon / frobenius,
        "jacobian_frobenius": frobenius,
        "v_eff": 1.0 / (out.o * out.o).sum(-1),
        "v_eff_exp_entropy": entropy.exp(),
        "margin": top2[:, 0] - top2[:, 1],
    }
    if spectral_iterations is not None:
        terms["tcb_spectral"] = epsilon / jacobian_spectral(unembed, out, iterations=spectral_iterations)
    return terms


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
    model as it is). o is not recomputed from the moved rows — the counterfactual isolates geometry. Only k rows
    change, so the closed form is updated by their deltas: μ' = μ + Σ_C o_i Δw_i, ν' = ν + Σ_C o_i² Δw_i and
    Σ o_i² ‖w̃_i‖² gains Σ_C o_i² (‖w̃_i'‖² − ‖w̃_i‖²). States [c, d] → {"v_eff", "frobenius_<α>"} each [c].
    """
    out = final_output(unembed, normed)
    o, s = out.o, out.slope
    o_sq = o * o
    mu = unembed.times_w(o * s)
    nu = unembed.times_w(o_sq * s)
    first = (o_sq * s * s) @ row_norms_sq
    total_o_sq = o_sq.sum(-1)
    k = min(top_k, o.shape[-1])
    top = o.topk(k, dim=-1).indices  # [c, k]
    p = o.gather(-1, top)  # [c, k]
    rows = unembed.weight[top].double() * s.gather(-1, top)[..., None]  # [c, k, d] scaled rows w̃_i
    centroid = (p[..., None] * rows).sum(1) / p.sum(-1, keepdim=True)  # [c, d]
    result = {"v_eff": 1.0 / total_o_sq}
    for alpha in scales:
        moved = centroid[:, None] + alpha * (rows - centroid[:, None])
        delta = moved - rows
        mu_a = mu + (p[..., None] * delta).sum(1)
        nu_a = nu + (p[..., None] ** 2 * delta).sum(1)
        first_a = first + (p**2 * (moved.pow(2).sum(-1) - rows.pow(2).sum(-1))).sum(-1)
        norm_sq = first_a - 2 * (mu_a * nu_a).sum(-1) + (mu_a * mu_a).sum(-1) * total_o_sq
        result[f"frobenius_{alpha:g}"] = norm_sq.clamp_min(0.0).sqrt()
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
