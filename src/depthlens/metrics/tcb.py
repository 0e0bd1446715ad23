"""Token Constraint Bound (definitions.md §6). Pure tensor functions of final hidden states and the unembedding.

For a final normalised state h, z = W h (+ b), y = post(z), o = softmax(y), the Jacobian of h ↦ o is
J = (diag(o) − o oᵀ) W̃ with rows w̃_i = s_i w_i, s_i = post'(z_i) (s ≡ 1 without post-processing, so the
paper's J = (diag(o) − o oᵀ) W is the special case; soft-capping and logit scaling stay exact). Row i of J is
o_i (w̃_i − μ), μ = Σ_j o_j w̃_j, hence ‖J‖_F² = Σ_i o_i² ‖w̃_i − μ‖², and δ_TCB = ε / ‖J‖_F.

**Anchored at the top token.** Expanded around the origin, Σ o_i² ‖w̃_i‖² − 2 μ·ν + ‖μ‖² Σ o_i² is three terms of
size ‖w̃_k‖² that cancel to a result of size o_2² when o is peaked on k: float64 lost every digit once o_k
exceeded ~1 − 1e-8 (measured: docs/performance.md, "δ_TCB in float32"). Expanded around a = w̃_k instead, with
r = Σ_{j≠k} o_j and q_j = o_j / r the distribution over the other tokens (q = softmax of the other logits, so
neither r nor q underflows, and r is never the cancelling 1 − o_k):

    m̂ = Σ_{j≠k} q_j w̃_j − a    (μ = a + r m̂),     ν̂ = Σ q_i² w̃_i,   R = Σ q_i²,   F = Σ q_i² ‖w̃_i‖²
    ‖J‖_F² = r² [ o_k² ‖m̂‖² + (F − 2 a·ν̂ + R ‖a‖²) − 2 r m̂·(ν̂ − R a) + r² R ‖m̂‖² ]

Every bracketed term is of the size of the result (the only cancellation left is geometric: rows nearly equal to
a), so float32 suffices: relative error ≤ 1e-4 against a float64 reference on every regime tested, peaked,
flat, soft-capped, scaled and padded (tests/test_tcb.py), where the old float64 closed form failed completely on
peaked outputs. Two [c, V] × [V, d] products per chunk (one, of 2c rows, without post-processing), plus z = W h
where the caller has no float32 log-probs of it, in float32, never a V × d matrix per token and no float64 copy of
W; ``exact=True`` runs the same formula in float64 (``--tcb-exact``, the reference), in any weight dtype on any
device (reduced-precision weights are cast to float64 a block of rows at a time).

Without logit post-processing the elementwise half runs in a few passes from the scores alone
(``metrics.tcb_softmax.anchored_softmax``) and takes the readout's own final log-probs where they are the float32
log-softmax of the same product (``token_constraint_terms(logprobs=...)``): the lens has them anyway.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from collections.abc import Callable

import torch

from depthlens.metrics.tcb_softmax import AnchoredSoftmax, anchored_softmax
from depthlens.models.adapters import LogitPostFn
from depthlens.readout.lens import LogitLens

_CAST_BYTES = 64 * 2**20  # W is cast to another dtype at most this many bytes of rows at a time
_REDUCED = (torch.bfloat16, torch.float16)


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
            lens.parts.unembed_weight[rows].detach(),
            bias[rows].detach() if bias is not None else None,
            lens.parts.logit_post,
        )

    def logits(self, normed: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """z = W h + b in ``dtype``, [c, d] → [c, V] (pre-post-processing)."""
        z = self.w_times(normed, dtype)
        return z + self.bias.to(dtype) if self.bias is not None else z

    def times_w(self, a: torch.Tensor) -> torch.Tensor:
        """a W in a's dtype, [c, V] → [c, d]."""
        if self.weight.dtype == a.dtype:
            return a @ self.weight
        if _reduced_on_cuda(
            self.weight, a.dtype
        ):  # bf16 W: products exact, sums in a's dtype; a kept to ~16 bits
            hi = a.to(self.weight.dtype)
            lo = (a - hi.to(a.dtype)).to(self.weight.dtype)
            both = torch.mm(torch.cat([hi, lo]), self.weight, out_dtype=a.dtype)
            return both[: a.shape[0]] + both[a.shape[0] :]
        out = torch.zeros(a.shape[0], self.weight.shape[1], dtype=a.dtype, device=a.device)
        rows = self._cast_rows(a.dtype)
        for start, block in zip(range(0, a.shape[1], rows), self.weight.split(rows), strict=True):
            out += a[:, start : start + block.shape[0]] @ block.to(a.dtype)
        return out

    def times_w_split(self, parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``times_w`` of rows already split into a high and a low part in W's dtype ([2n, V]: the n high rows,
        then their n low rows; ``anchored_softmax(split=...)``), accumulated in ``dtype`` → [n, d]."""
        both = torch.mm(parts, self.weight, out_dtype=dtype)
        return both[: parts.shape[0] // 2] + both[parts.shape[0] // 2 :]

    def w_times(self, v: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """v Wᵀ in ``dtype``, [c, d] → [c, V]."""
        if self.weight.dtype == dtype:
            return v.to(dtype) @ self.weight.T
        if _reduced_on_cuda(self.weight, dtype):  # states of a bf16 model are bf16 values: the cast is exact
            return torch.mm(v.to(self.weight.dtype), self.weight.T, out_dtype=dtype)
        v = v.to(dtype)
        return torch.cat(
            [v @ block.to(dtype).T for block in self.weight.split(self._cast_rows(dtype))], dim=-1
        )

    def _cast_rows(self, dtype: torch.dtype) -> int:
        """Rows of W cast to ``dtype`` at a time: ``_CAST_BYTES`` of them (e.g. 2,048 rows of d = 4,096 in
        float64), so a product in another dtype than W's never holds a whole cast copy of W."""
        return max(1, _CAST_BYTES // (self.weight.shape[1] * torch.finfo(dtype).bits // 8))

    def row_norms_sq(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """‖w_i‖² for every row, [V] (summed in float64, returned in ``dtype``)."""
        rows = self._cast_rows(torch.float64)
        norms = torch.cat([block.double().pow(2).sum(-1) for block in self.weight.split(rows)])
        return norms.to(dtype)

    def rows(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """w_i for the token ids ``index`` [c], [c, d] in ``dtype``."""
        return self.weight[index].to(dtype)


def _reduced_on_cuda(weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a product with ``weight`` (bf16/fp16 on CUDA) can keep W as it is and accumulate in ``dtype``."""
    return weight.is_cuda and out_dtype_allowed(weight.dtype, dtype) and _mm_out_dtype(weight.device)


def out_dtype_allowed(inputs: torch.dtype, out: torch.dtype) -> bool:
    """CUDA's rule for ``torch.mm(a, b, out_dtype=out)`` on reduced-precision inputs: fp16 / bf16 accumulate into
    float32 (or their own dtype), nothing else — float64 is refused ("out_dtype must be the same as input dtype or
    fp32 for fp16/bf16 inputs"); such a product casts W by blocks instead."""
    return inputs in _REDUCED and out == torch.float32


@functools.cache
def _mm_out_dtype(device: torch.device) -> bool:
    """torch.mm(..., out_dtype=float32) on reduced-precision CUDA inputs (torch ≥ 2.8); else W is cast by blocks."""
    try:
        x = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
        return torch.mm(x, x, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError, NotImplementedError):
        return False


@dataclasses.dataclass(frozen=True)
class FinalOutput:
    """The final mapping evaluated at a chunk of states, computed once and shared by every TCB quantity."""

    logits: torch.Tensor  # [c, V] post-processed logits y, in the working dtype
    slope: torch.Tensor | None  # [c, V] s_i = post'(z_i); None without post-processing (s ≡ 1)
    logprobs: torch.Tensor  # [c, V] log o = log_softmax(y)

    @property
    def o(self) -> torch.Tensor:
        """The output distribution softmax(y), [c, V]."""
        return self.logprobs.exp()

    @property
    def slope_or_ones(self) -> torch.Tensor:
        return self.slope if self.slope is not None else torch.ones_like(self.logits)


def final_output(
    unembed: Unembedding, normed: torch.Tensor, dtype: torch.dtype = torch.float64
) -> FinalOutput:
    """Evaluate z = W h + b, y = post(z), log o = log_softmax(y) and post'(z) in ``dtype`` for states [c, d]."""
    z = unembed.logits(normed, dtype)
    if unembed.post is None:
        return FinalOutput(z, None, torch.log_softmax(z, -1))
    y = unembed.post(z)
    return FinalOutput(y, unembed.post.derivative(z), torch.log_softmax(y, -1))


def log_jacobian_frobenius(
    unembed: Unembedding, out: FinalOutput, row_norms_sq: torch.Tensor
) -> torch.Tensor:
    """log ‖J‖_F per token by the anchored closed form (module docstring), in the dtype of ``out``; → [c]
    float64 (−inf where the output is one-hot: then no finite move changes it to first order)."""
    y, s = out.logits, out.slope
    dtype = y.dtype
    top = y.argmax(-1, keepdim=True)  # [c, 1] the anchor k
    others = y.scatter(-1, top, float("-inf"))
    log_r = torch.logsumexp(others, -1) - torch.logsumexp(y, -1)  # log Σ_{j≠k} o_j, [c]
    o_top = out.logprobs.gather(-1, top).squeeze(-1).exp()  # [c]
    q = torch.softmax(others, -1)  # [c, V], q_k = 0
    q_sq = q * q
    anchor = unembed.rows(top.squeeze(-1), dtype)  # [c, d] w_k
    if s is None:
        mu, nu, first = unembed.times_w(q), unembed.times_w(q_sq), q_sq @ row_norms_sq.to(dtype)
    else:
        anchor = anchor * s.gather(-1, top)  # w̃_k
        mu, nu = unembed.times_w(q * s), unembed.times_w(q_sq * s)
        first = (q_sq * s * s) @ row_norms_sq.to(dtype)
    inner = _anchored(o_top, log_r.exp(), anchor, mu, nu, first, q_sq.sum(-1))
    return log_r.double() + 0.5 * inner.clamp_min(0.0).double().log()


def _anchored(
    o_top: torch.Tensor,
    r: torch.Tensor,
    anchor: torch.Tensor,
    mu: torch.Tensor,
    nu: torch.Tensor,
    first: torch.Tensor,
    spread: torch.Tensor,
) -> torch.Tensor:
    """‖J‖_F² / r² by the anchored closed form (module docstring), from o_k, r, a = w̃_k, Σ q_j w̃_j, ν̂, F and R;
    → [c]. Every term is of the size of the result."""
    m = mu - anchor  # m̂, [c, d]
    around_anchor = first - 2 * (anchor * nu).sum(-1) + spread * (anchor * anchor).sum(-1)
    m_sq = (m * m).sum(-1)
    cross = (m * (nu - spread[:, None] * anchor)).sum(-1)
    return o_top * o_top * m_sq + around_anchor - 2 * r * cross + r * r * spread * m_sq


def jacobian_frobenius(unembed: Unembedding, out: FinalOutput, row_norms_sq: torch.Tensor) -> torch.Tensor:
    """‖J‖_F per token, [c] float64 (0 for a one-hot output; subnormal results flush to 0 in float64 only)."""
    return log_jacobian_frobenius(unembed, out, row_norms_sq).exp()


def jacobian_spectral(
    unembed: Unembedding, out: FinalOutput, iterations: int = 100, tol: float = 1e-10
) -> torch.Tensor:
    """‖J‖_2 per token by power iteration on JᵀJ, never forming J; float64, → [c].

    With C = diag(o) − o oᵀ (symmetric): J v = C W̃v and Jᵀu = W̃ᵀ C u, where W̃v = s∘(Wv) and W̃ᵀx = Wᵀ(s∘x).
    """
    o, s = out.o, out.slope_or_ones

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
    exact: bool = False,
    logprobs: torch.Tensor | None = None,
    softmax: Callable[..., AnchoredSoftmax] = anchored_softmax,
) -> dict[str, torch.Tensor]:
    """Per-token δ_TCB, V_eff (1/Σo² and exp H), top-2 margin, and (with ``spectral_iterations``) the spectral δ.

    States ``normed`` [c, d] → each term [c] float64, computed in float32 (``exact``: float64, the reference);
    the final mapping is evaluated once for all of them. Results stay on ``normed``'s device. ``logprobs`` [c, V]:
    the float32 log-softmax of these states' own logits, post(W h + b), where the caller has it (the readout's
    final layer, from a float32 product of the same W) — taken in place of evaluating z = W h again, where there
    is no logit post-processing (its slope needs z) and not ``exact``. ``softmax``: the elementwise half of the
    closed form (``metrics.fused.compiled_tcb_softmax`` where the lens is compiled).
    """
    if exact or unembed.post is not None or unembed.weight.shape[0] < 2:
        out = final_output(unembed, normed, torch.float64 if exact else torch.float32)
        log_frobenius = log_jacobian_frobenius(unembed, out, row_norms_sq)
        top2 = out.logits.topk(min(2, out.logits.shape[-1]), dim=-1).values
        o = out.o
        entropy = -(o * out.logprobs).sum(-1)
        terms = {
            "v_eff": 1.0 / (o * o).sum(-1).double(),
            "v_eff_exp_entropy": entropy.double().exp(),
            "margin": (top2[:, 0] - top2[:, -1]).double(),
        }
    else:
        scores = logprobs if logprobs is not None else unembed.logits(normed, torch.float32)
        log_frobenius, terms = _anchored_terms(unembed, scores, row_norms_sq, softmax)
    terms = {
        "tcb": (math.log(epsilon) - log_frobenius).exp(),  # ε / ‖J‖_F without under- or overflow
        "jacobian_frobenius": log_frobenius.exp(),
        **terms,
    }
    if spectral_iterations is not None:  # power iteration stays float64: it has no closed form to anchor
        spectral = final_output(unembed, normed, torch.float64)
        terms["tcb_spectral"] = epsilon / jacobian_spectral(unembed, spectral, iterations=spectral_iterations)
    return terms


def _anchored_terms(
    unembed: Unembedding,
    scores: torch.Tensor,
    row_norms_sq: torch.Tensor,
    softmax: Callable[..., AnchoredSoftmax],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """log ‖J‖_F [c] float64 and V_eff, exp H, margin from the scores [c, V] (logits or log-probs) without logit
    post-processing: the anchored softmax's few passes, then one product of its [2c, V] operand with W."""
    split = unembed.weight.dtype if _reduced_on_cuda(unembed.weight, scores.dtype) else None
    both, top, log_r, o_top, margin, first, spread, sum_sq, entropy = softmax(scores, row_norms_sq, split)
    c = scores.shape[0]
    operand = both.reshape(-1, scores.shape[1])
    # [2c, d]: Σ q_j w_j, then ν̂ = Σ q_j² w_j
    products = unembed.times_w_split(operand, scores.dtype) if split else unembed.times_w(operand)
    anchor = unembed.rows(top, scores.dtype)  # [c, d] w_k
    inner = _anchored(o_top, log_r.exp(), anchor, products[:c], products[c:], first, spread)
    log_frobenius = log_r.double() + 0.5 * inner.clamp_min(0.0).double().log()
    return log_frobenius, {
        "v_eff": 1.0 / sum_sq.double(),
        "v_eff_exp_entropy": entropy.double().exp(),
        "margin": margin.double(),
    }


_NORMS: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()


def model_row_norms_sq(lens: LogitLens, unembed: Unembedding, dtype: torch.dtype) -> torch.Tensor:
    """``unembed.row_norms_sq(dtype)`` of ``lens``'s unembedding, computed once per model and dtype: kept beside
    its module until the weights change (their storage, version, shape or device) — not once per ``score`` call."""
    weight = unembed.weight
    version = (weight.data_ptr(), weight._version, tuple(weight.shape), weight.device)
    kept = _NORMS.setdefault(lens.parts.unembed, {})
    if dtype not in kept or kept[dtype][0] != version:
        kept[dtype] = (version, unembed.row_norms_sq(dtype))
    return kept[dtype][1]
