"""``metrics.layer_top.layer_top_k``: the logit lens's top-k per layer against a direct float64 computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.metrics.layer_top import layer_top_k


def test_layer_top_k_against_float64_softmax_and_sort():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 50, dtype=torch.float32) * 4  # [tokens, layers, V]
    ids, probs = layer_top_k(logits, 5)
    assert ids.shape == probs.shape == (3, 4, 5)
    assert ids.dtype == torch.int64 and probs.dtype == torch.float32
    expected = torch.softmax(logits.double(), dim=-1).numpy()
    order = np.argsort(-expected, axis=-1, kind="stable")[..., :5]
    np.testing.assert_array_equal(ids.numpy(), order)
    np.testing.assert_allclose(probs.numpy(), np.take_along_axis(expected, order, -1), rtol=1e-6, atol=1e-7)
    assert bool((probs[..., :-1] >= probs[..., 1:]).all())


def test_layer_top_k_reads_log_probabilities_and_low_precision_alike():
    logits = torch.tensor([[2.0, 0.5, 3.0, -1.0]])
    ids, probs = layer_top_k(logits, 4)
    assert ids.tolist() == [[2, 0, 1, 3]]
    ids_lp, probs_lp = layer_top_k(torch.log_softmax(logits, -1), 4)
    assert ids_lp.tolist() == ids.tolist() and torch.allclose(probs_lp, probs)
    ids_bf, probs_bf = layer_top_k(logits.bfloat16(), 2)
    assert ids_bf.tolist() == [[2, 0]] and probs_bf.dtype == torch.float32
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-6)  # k = V: the whole distribution


@pytest.mark.parametrize("k", [0, -1, 5, 2.0, True])
def test_layer_top_k_refuses_a_k_outside_the_vocabulary(k):
    with pytest.raises(ValueError, match=r"k = .* must be an integer in \[1, 4\]"):
        layer_top_k(torch.zeros(2, 4), k)


def test_score_equals_a_plain_transformers_logit_lens_on_the_default_model(real_model):
    """``score``'s ``layer_top_ids`` / ``layer_top_probs`` against a logit lens written from transformers alone:
    every hidden state through the model's final norm and ``lm_head``, softmax, ``torch.topk`` (issue 52's test).
    Ids equal up to ties (where they differ, the plain lens gives both ids the same probability), probabilities
    within 1e-4."""
    from depthlens.config import ReadoutConfig
    from depthlens.studies.score import score

    k = 5
    record = {"id": "x", "prompt": "The capital of France is", "completion": " Paris, and of Italy, Rome."}
    [result] = score(real_model, [record], tokens=True, readout=ReadoutConfig(layer_top_k=k), tcb=None)
    ids, probs = np.asarray(result["layer_top_ids"]), np.asarray(result["layer_top_probs"])

    model, tokenizer = real_model.model, real_model.tokenizer
    prompt = tokenizer(record["prompt"])["input_ids"]
    completion = tokenizer(record["completion"], add_special_tokens=False)["input_ids"]
    assert completion == result["token_ids"]
    inputs = torch.tensor([prompt + completion])
    with torch.no_grad():
        hidden = model(input_ids=inputs, output_hidden_states=True).hidden_states  # embeddings, then L layers
        at = slice(len(prompt) - 1, inputs.shape[1] - 1)  # position i predicts token i + 1
        # hidden_states[-1] is already normed by transformers; earlier layers get the final norm here
        states = [model.model.norm(h[0, at]) for h in hidden[1:-1]] + [hidden[-1][0, at]]
        plain = torch.softmax(torch.stack([model.lm_head(s) for s in states], dim=1).double(), dim=-1)
    plain_probs, plain_ids = plain.topk(k, dim=-1)  # [T, L, K]

    assert ids.shape == (len(completion), real_model.n_layers, k)
    np.testing.assert_allclose(probs, plain_probs.numpy(), atol=1e-4)
    differ = ids != plain_ids.numpy()
    mine_in_plain = plain.gather(-1, torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(mine_in_plain[differ], plain_probs.numpy()[differ], atol=1e-6)  # ties only
    assert differ.mean() < 0.01
    assert (ids[:, 0, 0] != ids[:, -1, 0]).any()  # the early layers predict other tokens than the model does
