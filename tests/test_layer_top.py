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
