"""``metrics.layer_top.layer_top_k``: the logit lens's top-k per layer against a direct float64 computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.metrics.layer_top import (
    layer_top_k,
    layer_top_k_of_logits,
    layer_top_k_of_logprobs,
    top_k_by_blocks,
    top_k_probs,
)


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


def test_the_walks_log_probabilities_give_the_same_top_k():
    torch.manual_seed(1)
    logits = torch.randn(6, 3, 200) * 5
    ids, probs = layer_top_k(logits, 7)
    ids_lp, probs_lp = layer_top_k_of_logprobs(torch.log_softmax(logits, dim=-1), 7)
    assert torch.equal(ids, ids_lp)
    torch.testing.assert_close(probs_lp, probs, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("k", [0, -1, 5, 2.0, True])
def test_layer_top_k_refuses_a_k_outside_the_vocabulary(k):
    for top in (layer_top_k, layer_top_k_of_logprobs):
        with pytest.raises(ValueError, match=r"k = .* must be an integer in \[1, 4\]"):
            top(torch.zeros(2, 4), k)


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


def test_the_top_k_counts_against_the_readout_budget_and_changes_no_result():
    """A chunk's top-k ([c, L, K]) is part of the readout's working set (``readout.stream.chunk_sizes``): a larger
    K gets shorter chunks under the same budget, and chunking changes no id or probability."""
    from depthlens.config import ReadoutConfig
    from depthlens.metrics.token_table import reduce_readout
    from depthlens.models.load import wrap
    from depthlens.readout.stream import LAYER_TOP_BYTES, TokenSequence, chunk_sizes, iter_readout
    from tests.conftest import tiny_model

    budget = 16 * 2**20
    for k in (0, 10, 100):
        _, chunk = chunk_sizes(ReadoutConfig(memory_mb=16, layer_top_k=k), 2_000, 32, 80, 1)
        assert chunk * (12 * 4 * 2_000 + LAYER_TOP_BYTES * 80 * k) <= budget
        assert (chunk + 1) * (12 * 4 * 2_000 + LAYER_TOP_BYTES * 80 * k) > budget
    lm = wrap(tiny_model("llama", vocab_size=50_000))
    seq = TokenSequence([5, 9, 14], [(37 * i) % 49_000 + 3 for i in range(120)])
    tables = []
    for memory_mb in (16, None):  # 16 MB: chunks of ~7 tokens at V = 50,000; default: one chunk
        config = ReadoutConfig(memory_mb=memory_mb, layer_top_k=4)
        tables.append(reduce_readout(iter_readout(lm, [seq], config), 1, lm.n_layers, "jsd", layer_top=4)[0])
    assert torch.equal(tables[0].layer_top_ids, tables[1].layer_top_ids)
    torch.testing.assert_close(tables[0].layer_top_probs, tables[1].layer_top_probs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("shape", "k", "block"),
    [((5, 1000), 3, 16), ((2, 3, 4096), 5, 128), ((7, 4099), 20, 32), ((4, 600), 7, None), ((3, 50), 4, 4)],
)
def test_top_k_by_blocks_equals_torch_topk(shape, k, block):
    """The block-maxima selection against ``torch.topk`` over the whole row: whole blocks and a tail past the last
    one, leading axes, the plain fallback where blocks would not pay; the same values exactly, and on integer
    scores (ties everywhere) ids that hold those values."""
    torch.manual_seed(0)
    for scores in (torch.randn(shape) * 3, torch.randint(0, 9, shape).float()):
        values, ids = top_k_by_blocks(scores, k, block)
        expected = torch.topk(scores, k, dim=-1).values
        assert ids.shape == values.shape == (*shape[:-1], k) and ids.dtype == torch.int64
        assert torch.equal(values, expected)
        assert torch.equal(scores.gather(-1, ids), values)
        assert (ids.sort(-1).values.diff(dim=-1) > 0).all()  # k distinct tokens


def test_the_top_k_selects_on_logits_and_reads_k_probabilities():
    """Selected on the logits before normalisation, read from the log-softmax: the top-k of the probabilities
    (``layer_top_k``), descending also where normalising rounds two near-tied logits into the other order."""
    torch.manual_seed(2)
    logits = torch.randn(4, 9000) * 6
    ids, probs = layer_top_k_of_logits(logits, torch.log_softmax(logits, -1), 6)
    ref_ids, ref_probs = layer_top_k(logits, 6)
    assert torch.equal(ids, ref_ids) and torch.equal(probs, ref_probs)
    tied = torch.tensor([[1.0, 1.0 + 2**-20, -3.0, 0.5]])
    logprobs = torch.tensor([[-0.9, -0.9 - 2**-20, -5.0, -1.4]])  # the other order after rounding
    ids, probs = top_k_probs(torch.tensor([[1, 0]]), logprobs)
    assert ids.tolist() == [[0, 1]] and bool(probs[0, 0] >= probs[0, 1])
    assert layer_top_k_of_logits(tied, logprobs, 2)[0].tolist() == [[0, 1]]


def _chunk(vocab: int = 50_000, tokens: int = 20):
    from depthlens.config import ReadoutConfig
    from depthlens.models.load import wrap
    from depthlens.readout.stream import TokenSequence, iter_readout
    from tests.conftest import tiny_model

    lm = wrap(tiny_model("llama", vocab_size=vocab))
    seq = TokenSequence([5, 9, 14], [(37 * i) % (vocab - 1000) + 3 for i in range(tokens)])
    (chunk,) = list(iter_readout(lm, [seq], ReadoutConfig()))
    return chunk


def test_each_layers_top_k_adds_one_reduction_over_the_vocabulary_and_nothing_else():
    """Counted by the dispatcher (tests/passes.py): with K = 5 the walk makes the same passes over [c, V] as
    without, plus one block-maxima reduction per layer (the model's own included) — no ``topk`` over the vocabulary,
    no softmax, exp, sub or nan_to_num of its own (issue 60: each of those was a pass per layer on a GPU)."""
    from depthlens.metrics.token_table import chunk_divergence_kinds
    from tests.passes import WidePasses

    chunk = _chunk()
    counts = {}
    for k in (0, 5):
        with WidePasses(len(chunk) * 50_000 // 2) as passes:
            chunk_divergence_kinds(chunk, ("jsd",), 0, layer_top=k)
        counts[k] = passes.counts
    assert counts[5] - counts[0] == {"amax": chunk.n_layers}
    assert counts[0]["log_softmax"] == chunk.n_layers - 1


def test_the_compiled_block_takes_each_layers_top_k(monkeypatch):
    """With the lens compiled, the top-k comes out of the same compiled block as the divergences (the eager walk,
    which the top-k used to force, never runs): equal to the eager walk's, ids up to ties. Traced by ``aot_eager``
    here (the graph Inductor compiles, without its minute of C++ compilation)."""
    import functools

    from depthlens.metrics import fused
    from depthlens.metrics.token_table import chunk_divergence_kinds
    from depthlens.readout.stream import ReadoutChunk
    from tests.tolerance import assert_float32_equal, separated

    chunk = _chunk(vocab=6000, tokens=24)
    eager = chunk_divergence_kinds(chunk, ("jsd", "cosine"), 64, layer_top=5)
    monkeypatch.setattr(fused.torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    monkeypatch.setattr(ReadoutChunk, "logit_blocks", lambda *a, **k: pytest.fail("the eager walk ran"))
    compiled = chunk_divergence_kinds(chunk, ("jsd", "cosine"), 64, compiled=True, layer_top=5)
    for kind in ("jsd", "cosine"):
        assert_float32_equal(compiled[kind], eager[kind], what=kind)
    probs = eager["layer_top_probs"].numpy()
    assert_float32_equal(compiled["layer_top_probs"], probs, what="probabilities")
    apart = separated(probs)
    assert (compiled["layer_top_ids"].numpy()[apart] == eager["layer_top_ids"].numpy()[apart]).all()
    assert (compiled["layer_top_ids"] == eager["layer_top_ids"]).float().mean() > 0.9  # near-ties apart
    only_top = chunk_divergence_kinds(chunk, ("cosine",), 64, compiled=True, layer_top=5)  # no logit kind
    assert torch.equal(only_top["layer_top_ids"][apart.all(-1)], compiled["layer_top_ids"][apart.all(-1)])
