"""The TCB closed form against autograd Jacobians, and the spectral variant against torch.linalg."""

from __future__ import annotations

import pytest
import torch

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


def _unembedding(model_type):
    lm = wrap(tiny_model(model_type))
    return lm, Unembedding.from_lens(LogitLens(lm.parts))


def _autograd_jacobian(unembed, h):
    weight = unembed.weight.double()
    bias = unembed.bias.double() if unembed.bias is not None else None

    def output(x):
        z = weight @ x + (bias if bias is not None else 0.0)
        return torch.softmax(unembed.post(z) if unembed.post is not None else z, -1)

    return torch.autograd.functional.jacobian(output, h.double(), vectorize=True, strategy="forward-mode")


def _states(lm, scale):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(4, lm.parts.unembed.weight.shape[1], generator=g) * scale
    return lm.parts.final_norm(h)


@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize(
    "scale", [1.0, 30.0]
)  # 30: peaked distributions, where the closed form's terms cancel
def test_closed_form_equals_autograd_frobenius(model_type, scale):
    lm, unembed = _unembedding(model_type)
    states = _states(lm, scale)
    closed = jacobian_frobenius(unembed, final_output(unembed, states), unembed.row_norms_sq())
    for i, h in enumerate(states):
        jac = _autograd_jacobian(unembed, h)
        expected = torch.linalg.matrix_norm(jac, "fro")
        assert closed[i].item() == pytest.approx(expected.item(), rel=1e-5), (model_type, i)


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_spectral_norm_equals_linalg(model_type):
    lm, unembed = _unembedding(model_type)
    states = _states(lm, 3.0)
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
    states = _states(lm, 2.0)
    terms = token_constraint_terms(unembed, states, unembed.row_norms_sq(), epsilon=0.5)
    logits = states.double() @ unembed.weight.double().T
    o = torch.softmax(logits, -1)
    torch.testing.assert_close(terms["v_eff"], 1 / (o**2).sum(-1))
    torch.testing.assert_close(terms["v_eff_exp_entropy"], torch.exp(-(o * o.log()).sum(-1)))
    top = logits.sort(-1, descending=True).values
    torch.testing.assert_close(terms["margin"], top[:, 0] - top[:, 1])
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
    assert all(s >= f * (1 - 1e-9) for s, f in zip(r["tcb_spectral"], r["tcb"], strict=True))  # ‖J‖_2 ≤ ‖J‖_F
    # Against autograd at the model's own final states.
    ids = torch.tensor([[4, 5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        final = tiny_llama.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, 2:7]
    unembed = Unembedding.from_lens(LogitLens(tiny_llama.parts))
    for t in range(5):
        jac = _autograd_jacobian(unembed, final[t])
        assert r["tcb"][t] == pytest.approx(2.0 / torch.linalg.matrix_norm(jac, "fro").item(), rel=1e-5)
    (plain,) = score(tiny_llama, [record], tcb=None)
    assert "tcb_mean" not in plain
    (empty,) = score(tiny_llama, [{"id": "e", "prompt_ids": [4], "completion_ids": []}])
    assert empty["tcb_mean"] is None and empty["v_eff_mean"] is None


@pytest.mark.integration
def test_real_model_closed_form_equals_autograd(real_model):
    unembed = Unembedding.from_lens(LogitLens(real_model.parts, vocab_size=len(real_model.tokenizer)))
    ids = real_model.tokenizer("The capital of France is Paris, and 2 + 2 = 4", return_tensors="pt").input_ids
    with torch.no_grad():
        final = real_model.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, [1, 5, -1]]
    closed = jacobian_frobenius(unembed, final_output(unembed, final), unembed.row_norms_sq())
    for i, h in enumerate(final):
        expected = torch.linalg.matrix_norm(_autograd_jacobian(unembed, h), "fro").item()
        assert closed[i].item() == pytest.approx(expected, rel=1e-5)
