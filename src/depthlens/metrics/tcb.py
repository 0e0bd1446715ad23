"""Token Constraint Bound (SPEC §6, seed 004). Pure tensor functions of final hidden states and the unembedding.

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
