"""The TCB closed form against autograd Jacobians and a term-by-term float64 reference on every regime (peaked,
flat, soft-capped, scaled, biased, padded vocabulary), and the spectral variant against torch.linalg."""

from __future__ import annotations

import pytest
import torch

from depthlens.config import TCBConfig
from depthlens.metrics.tcb import (
    Unembedding,
    final_output,
    jacobian_frobenius,
    jacobian_spectral,
    token_constraint_terms,
)
from depthlens.models.load import wrap
from depthlens.readout.lens import LogitLens
from tests.conftest import tiny_model

FAMILIES = ["llama", "gemma2", "granite", "cohere", "phi"]  # plain, soft-capped, divided, multiplied, biased
# Logit scales: 1 flat (the tiny models' own outputs), 30 and 100 peaked (top probability up to 1 − 1e-20 and
# beyond: the old float64 closed form lost every digit there), 1000 saturating (logits in the thousands;
# Gemma's soft-cap saturates).
SCALES = [1.0, 30.0, 100.0, 1000.0]
TCB_RTOL = 1e-4
"""The stated bound of the default float32 δ_TCB against the float64 reference: measured worst 2.0e-4 with logits in
the thousands (float32 logits carry ~1e-4 absolute error there), ≤ 8e-5 with logits ≤ 100 (every real model);
1e-4 with logits ≤ 100, 3e-4 beyond (docs/performance.md, "δ_TCB in float32")."""


def _unembedding(model_type):
    # frozen as the readout reads it (under no grad): wrap leaves a caller's grad flags as they are
    lm = wrap(tiny_model(model_type).requires_grad_(False))
    return lm, Unembedding.from_lens(LogitLens(lm.parts))


def _autograd_jacobian(unembed, h):
    weight = unembed.weight.double()
    bias = unembed.bias.double() if unembed.bias is not None else None

    def output(x):
        z = weight @ x + (bias if bias is not None else 0.0)
        return torch.softmax(unembed.post(z) if unembed.post is not None else z, -1)

    return torch.autograd.functional.jacobian(output, h.double(), vectorize=True, strategy="forward-mode")


def reference_frobenius(unembed, states):
    """‖J‖_F = sqrt(Σ_i o_i² ‖w̃_i − μ‖²) formed term by term in float64, μ = a + Σ_{j≠k} o_j (w̃_j − a) about the
    top row a (so μ − a never cancels), o from log_softmax. Independent of the closed form: no expansion of the
    norm. (Autograd through softmax loses the top row's term once o_k rounds to 1 in float64.)"""
    weight = unembed.weight.double()
    z = states.double() @ weight.T + (unembed.bias.double() if unembed.bias is not None else 0.0)
    y = unembed.post(z) if unembed.post is not None else z
    s = unembed.post.derivative(z) if unembed.post is not None else torch.ones_like(z)
    o = torch.log_softmax(y, -1).exp()
    out = []
    for t in range(states.shape[0]):
        rows = weight * s[t][:, None]
        k = int(o[t].argmax())
        d = rows - rows[k]
        others = o[t].clone()
        others[k] = 0.0
        centre = others @ d  # μ − a
        out.append(((o[t] ** 2) * ((d - centre) ** 2).sum(-1)).sum().sqrt())
    return torch.stack(out)


def _states(lm, scale, n=8, seed=0):
    """Final normalised states times ``scale`` (the norm would undo a scale applied before it)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, lm.parts.unembed.weight.shape[1], generator=g)
    return lm.parts.final_norm(h) * scale


def _relative(a, b):
    return ((a.double() - b.double()).abs() / b.double().abs()).max().item()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_closed_form_equals_autograd_frobenius(model_type):
    """Where autograd's float64 is itself exact (top probability well below 1), the float64 path agrees to 1e-9."""
    lm, unembed = _unembedding(model_type)
    states = _states(lm, 3.0, n=4)
    closed = jacobian_frobenius(unembed, final_output(unembed, states), unembed.row_norms_sq())
    for i, h in enumerate(states):
        expected = torch.linalg.matrix_norm(_autograd_jacobian(unembed, h), "fro")
        assert closed[i].item() == pytest.approx(expected.item(), rel=1e-9), (model_type, i)


@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("scale", SCALES)
def test_tcb_float32_and_exact_against_the_reference(model_type, scale):
    """Default float32 within ``TCB_RTOL`` (3× it with logits in the thousands), ``exact`` (float64) within 1e-9, on
    flat, peaked and saturated outputs of every post-processing kind."""
    lm, unembed = _unembedding(model_type)
    states = _states(lm, scale)
    expected = 1.0 / reference_frobenius(unembed, states)
    norms = unembed.row_norms_sq()
    fast = token_constraint_terms(unembed, states, norms)["tcb"]
    exact = token_constraint_terms(unembed, states, norms, exact=True)["tcb"]
    finite = torch.isfinite(expected)
    assert finite.any()
    assert _relative(fast[finite], expected[finite]) <= TCB_RTOL * (3 if scale >= 1000 else 1), (
        model_type,
        scale,
    )
    assert _relative(exact[finite], expected[finite]) <= 1e-9, (model_type, scale)
    # Where the reference's o_i² underflows (‖J‖ < 1e-154), the anchored form still has δ, in log space: huge, the
    # two paths equal to float32's resolution of logits in the thousands, or both past float64's range (inf).
    huge_fast, huge_exact = fast[~finite], exact[~finite]
    assert (huge_fast > 1e150).all() and (huge_exact > 1e150).all()
    assert torch.allclose(huge_fast.log(), huge_exact.log(), rtol=1e-3, equal_nan=True)


def test_tcb_on_a_padded_vocabulary():
    """A lens cut to the tokenizer's vocabulary (padded unembedding rows dropped) against the reference of the cut
    rows: the padding never enters δ."""
    lm = wrap(tiny_model("llama").requires_grad_(False))  # as the readout reads it
    unembed = Unembedding.from_lens(LogitLens(lm.parts, vocab_size=64))
    assert unembed.weight.shape[0] == 64
    for scale in (1.0, 30.0):
        states = _states(lm, scale)
        got = token_constraint_terms(unembed, states, unembed.row_norms_sq())["tcb"]
        assert _relative(got, 1.0 / reference_frobenius(unembed, states)) <= TCB_RTOL


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_spectral_norm_equals_linalg(model_type):
    lm, unembed = _unembedding(model_type)
    states = _states(lm, 3.0, n=4)
    out = final_output(unembed, states)
    spectral = jacobian_spectral(unembed, out, iterations=500)
    for i, h in enumerate(states):
        expected = torch.linalg.matrix_norm(_autograd_jacobian(unembed, h), 2)
        assert spectral[i].item() == pytest.approx(expected.item(), rel=1e-6)
    assert (
        spectral <= jacobian_frobenius(unembed, out, unembed.row_norms_sq()) * (1 + 1e-9)
    ).all()  # ‖J‖_2 ≤ ‖J‖_F


def test_terms_against_direct_formulas():
    lm, unembed = _unembedding("llama")
    states = _states(lm, 2.0, n=4)
    for exact, rtol in ((True, 1e-12), (False, 1e-5)):
        terms = token_constraint_terms(unembed, states, unembed.row_norms_sq(), epsilon=0.5, exact=exact)
        logits = states.double() @ unembed.weight.double().T
        o = torch.softmax(logits, -1)
        close = dict(rtol=rtol, atol=rtol)
        torch.testing.assert_close(terms["v_eff"], 1 / (o**2).sum(-1), **close)
        torch.testing.assert_close(terms["v_eff_exp_entropy"], torch.exp(-(o * o.log()).sum(-1)), **close)
        top = logits.sort(-1, descending=True).values
        torch.testing.assert_close(terms["margin"], top[:, 0] - top[:, 1], **close)
        torch.testing.assert_close(terms["tcb"], 0.5 / terms["jacobian_frobenius"])


def test_one_hot_output_has_unbounded_tcb():
    # o = e_k exactly ⇒ J = 0: no finite move changes the prediction to first order.
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    unembed = Unembedding(weight, None, None)
    norm = jacobian_frobenius(
        unembed, final_output(unembed, torch.tensor([[2000.0, 0.0]])), unembed.row_norms_sq()
    )
    assert norm.item() == 0.0


def test_scoring_reports_tcb_per_record_and_token(tiny_llama):
    from depthlens.config import TCBConfig
    from depthlens.studies.score import score

    record = {"id": "a", "prompt_ids": [4, 5, 6], "completion_ids": [7, 8, 9, 10, 11]}
    (r,) = score(tiny_llama, [record], tokens=True, tcb=TCBConfig(epsilon=2.0, spectral=True))
    assert len(r["tcb"]) == len(r["v_eff"]) == len(r["margin"]) == len(r["tcb_spectral"]) == 5
    assert r["tcb_mean"] == pytest.approx(sum(r["tcb"]) / 5) and r["tcb_min"] == min(r["tcb"])
    assert r["v_eff_mean"] == pytest.approx(sum(r["v_eff"]) / 5)
    # ‖J‖_2 ≤ ‖J‖_F; δ_TCB in float32, the spectral δ in float64
    assert all(s >= f * (1 - TCB_RTOL) for s, f in zip(r["tcb_spectral"], r["tcb"], strict=True))
    # Against autograd at the model's own final states.
    ids = torch.tensor([[4, 5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        final = tiny_llama.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, 2:7]
    unembed = Unembedding.from_lens(LogitLens(tiny_llama.parts))
    for t in range(5):
        jac = _autograd_jacobian(unembed, final[t])
        assert r["tcb"][t] == pytest.approx(2.0 / torch.linalg.matrix_norm(jac, "fro").item(), rel=TCB_RTOL)
    (plain,) = score(tiny_llama, [record], tcb=None)
    assert "tcb_mean" not in plain
    (empty,) = score(tiny_llama, [{"id": "e", "prompt_ids": [4], "completion_ids": []}])
    assert empty["tcb_mean"] is None and empty["v_eff_mean"] is None


@pytest.mark.integration
def test_real_model_tcb_against_the_reference(real_model):
    """The default model's own final states (peaked on some tokens, flat on others): float32 δ_TCB within the bound,
    the float64 path within 1e-9, and the closed form in float64 equal to autograd's Jacobian."""
    unembed = Unembedding.from_lens(LogitLens(real_model.parts, vocab_size=len(real_model.tokenizer)))
    ids = real_model.tokenizer("The capital of France is Paris, and 2 + 2 = 4", return_tensors="pt").input_ids
    with torch.no_grad():
        final = real_model.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
    norms = unembed.row_norms_sq()
    expected = 1.0 / reference_frobenius(unembed, final)
    assert _relative(token_constraint_terms(unembed, final, norms)["tcb"], expected) <= TCB_RTOL
    assert _relative(token_constraint_terms(unembed, final, norms, exact=True)["tcb"], expected) <= 1e-9
    closed = jacobian_frobenius(unembed, final_output(unembed, final[[1, 5, -1]]), norms)
    for i, h in enumerate(final[[1, 5, -1]]):
        jac = torch.linalg.matrix_norm(_autograd_jacobian(unembed, h), "fro").item()
        assert closed[i].item() == pytest.approx(jac, rel=1e-9)


@pytest.mark.parametrize("model_type", ["llama", "phi"])  # plain and biased: the shared path's families
@pytest.mark.parametrize("scale", SCALES)
def test_tcb_from_the_readouts_own_log_probs(model_type, scale):
    """Given the final layer's float32 log-probs (the readout has them), δ_TCB, V_eff and exp H take them instead
    of evaluating z = W h again: within the bound of the reference, and of the path that evaluates z."""
    lm, unembed = _unembedding(model_type)
    states = _states(lm, scale)
    norms = unembed.row_norms_sq(torch.float32)
    logprobs = torch.log_softmax(unembed.logits(states, torch.float32), -1)
    shared = token_constraint_terms(unembed, states, norms, logprobs=logprobs)
    own = token_constraint_terms(unembed, states, norms)
    expected = 1.0 / reference_frobenius(unembed, states)
    finite = torch.isfinite(expected)
    assert _relative(shared["tcb"][finite], expected[finite]) <= TCB_RTOL * (3 if scale >= 1000 else 1)
    for key in ("v_eff", "v_eff_exp_entropy"):
        assert _relative(shared[key], own[key]) <= 1e-5, key
    torch.testing.assert_close(shared["margin"], own["margin"], rtol=1e-4, atol=1e-4 * scale)


def test_the_compiled_anchored_softmax_equals_the_eager_one(monkeypatch, tiny_llama):
    """``metrics.fused.compiled_tcb_softmax`` (traced by ``aot_eager`` here: Inductor's graph without its C++
    compilation) gives the eager anchored softmax's every term, its operand as it is and split for bf16 weights
    (high + low = q to ~16 bits), and ``score``'s path takes it when the lens is compiled."""
    import functools

    from depthlens.metrics import fused
    from depthlens.metrics.tcb_softmax import anchored_softmax
    from depthlens.metrics.token_table import reduce_readout
    from depthlens.readout.stream import TokenSequence, iter_readout

    monkeypatch.setattr(fused.torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    monkeypatch.setattr(fused, "_TCB", [])
    torch.manual_seed(0)
    scores, norms = torch.randn(6, 3000) * 8, torch.rand(3000) + 0.5
    for split in (None, torch.bfloat16):
        got = fused.compiled_tcb_softmax()(scores, norms, split)
        for mine, want in zip(got, anchored_softmax(scores, norms, split), strict=True):
            torch.testing.assert_close(mine, want, rtol=1e-5, atol=1e-7)
    high, low = got[0][:2].float(), got[0][2:].float()
    torch.testing.assert_close(high + low, anchored_softmax(scores, norms)[0], rtol=2**-15, atol=1e-30)

    calls = []
    compiled = fused.compiled_tcb_softmax()
    monkeypatch.setattr(
        "depthlens.metrics.token_table.compiled_tcb_softmax",
        lambda: lambda *a: calls.append(1) or compiled(*a),
    )
    seq = TokenSequence([4, 5, 6], [7, 8, 9, 10, 11])
    tables = [
        reduce_readout(
            iter_readout(tiny_llama, [seq]), 1, tiny_llama.n_layers, "jsd", TCBConfig(), compiled=flag
        )
        for flag in (False, True)
    ]
    assert calls
    torch.testing.assert_close(tables[1][0].tcb["tcb"], tables[0][0].tcb["tcb"], rtol=1e-5, atol=0.0)


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: ``metrics.tcb`` then takes the code path a GPU takes."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def _cuda_mm(original):
    """``torch.mm`` as CUDA runs it with ``out_dtype``: fp16 / bf16 inputs accumulated in float32 (their products are
    exact in float32, so a float32 product of the upcast inputs is the same sum), anything else refused with the
    H200's RuntimeError (issue 60). A CPU has no ``out_dtype`` kernel at all."""

    def mm(a, b, *, out_dtype=None):
        if out_dtype is None or out_dtype == a.dtype:
            return original(a, b)
        if a.dtype in (torch.bfloat16, torch.float16) and out_dtype == torch.float32:
            return original(a.float(), b.float())
        raise RuntimeError("out_dtype must be the same as input dtype or fp32 for fp16/bf16 inputs")

    return mm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_exact_tcb_in_reduced_precision_on_cudas_code_path(dtype, monkeypatch):
    """``TCBConfig(exact=True)`` with bf16 / fp16 weights on CUDA's code path and under CUDA's rule for
    ``out_dtype`` (it failed there: float64 products asked of bf16 inputs): float64 products from W cast by blocks,
    equal to the float64 reference of the same (rounded) weights; the default float32 path keeps W as it is."""
    import depthlens.metrics.tcb as tcb

    monkeypatch.setattr(torch, "mm", _cuda_mm(torch.mm))
    monkeypatch.setattr(tcb, "_mm_out_dtype", lambda device: True)  # the device rule forced: CUDA's
    monkeypatch.setattr(
        tcb, "_CAST_BYTES", 8 * 32 * 40
    )  # 40 rows a block: several blocks on the tiny vocabulary
    lm, unembed = _unembedding("llama")
    weight = unembed.weight.to(dtype)
    states = _states(lm, 3.0).to(dtype).float()  # a reduced-precision model's states: exact in float32
    on_cuda = Unembedding(weight.as_subclass(_OnCuda), None, None)
    assert tcb._reduced_on_cuda(on_cuda.weight, torch.float32)  # the GPU path, float32 accumulation kept
    assert not tcb._reduced_on_cuda(on_cuda.weight, torch.float64)
    exact = token_constraint_terms(on_cuda, states, on_cuda.row_norms_sq(), exact=True)["tcb"]
    upcast = Unembedding(weight.double(), None, None)
    expected = 1.0 / reference_frobenius(upcast, states.double())
    assert _relative(exact.as_subclass(torch.Tensor), expected) <= 1e-9
    fast = token_constraint_terms(on_cuda, states, on_cuda.row_norms_sq(torch.float32))["tcb"]
    assert _relative(fast.as_subclass(torch.Tensor), expected) <= TCB_RTOL


def test_row_norms_are_computed_once_per_model():
    from depthlens.metrics.tcb import model_row_norms_sq

    lm = wrap(tiny_model("llama", vocab_size=77))  # its own copy: its weights change below
    lens = LogitLens(lm.parts)
    unembed = Unembedding.from_lens(lens)
    first = model_row_norms_sq(lens, unembed, torch.float32)
    assert model_row_norms_sq(lens, Unembedding.from_lens(lens), torch.float32) is first
    assert model_row_norms_sq(lens, unembed, torch.float64).dtype == torch.float64
    with torch.no_grad():
        lm.parts.unembed.weight.mul_(2.0)
    again = model_row_norms_sq(lens, Unembedding.from_lens(lens), torch.float32)
    torch.testing.assert_close(again, 4 * first)
