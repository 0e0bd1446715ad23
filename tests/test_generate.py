"""Sampling with the same-pass readout: reproducibility, two phases, and agreement with the scoring path."""

from __future__ import annotations

import pytest
import torch

from depthlens.config import ReadoutConfig, SamplingConfig
from depthlens.errors import ConfigError, InputError
from depthlens.metrics.token_table import reduce_readout
from depthlens.readout.stream import TokenSequence, iter_readout
from depthlens.sampling.backend import next_token, sampling_uniforms
from depthlens.sampling.hf import HFGenerator

PROMPT = [1, 5, 9, 14, 20, 7]


def _uniforms(seeds, step=0):
    return sampling_uniforms(torch.tensor(seeds), step)


def test_next_token_greedy_and_nucleus():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
    assert next_token(logits, _uniforms([0, 1]), 0.0).tolist() == [1, 0]
    # top_p below the top token's mass keeps only it, whatever the draw
    for seed in range(20):
        assert next_token(logits, _uniforms([seed, seed]), 1.0, top_p=0.3).tolist() == [1, 0]
    # with top_p = 0.9 only the two leading tokens of row 0 (≈ 0.47 + 0.43) may be drawn
    drawn = {int(next_token(logits[:1], _uniforms([s]), 1.0, top_p=0.9)[0]) for s in range(200)}
    assert drawn == {1, 3}


def test_next_token_top_k_and_min_p():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9, 2.0]]).repeat(400, 1)
    u = _uniforms(list(range(400)))
    assert set(next_token(logits, u, 1.0, top_k=2).tolist()) == {1, 3}
    assert set(next_token(logits, u, 1.0, top_k=1).tolist()) == {1}
    # min_p = 0.3: tokens with p ≥ 0.3 × p_max stay — logits within ln(1/0.3) ≈ 1.2 of the top: 1, 3, 4
    assert set(next_token(logits, u, 1.0, min_p=0.3).tolist()) == {1, 3, 4}
    # temperature applies first: at T = 0.25 token 4 falls below 0.3 × p_max
    assert set(next_token(logits, u, 0.25, min_p=0.3).tolist()) == {1, 3}


def test_next_token_draws_the_distribution():
    """Inverse-CDF draws at the counter-based uniforms follow softmax(logits / T): a chi-square test over 20,000
    draws (p > 1e-4 unless the sampler is biased)."""
    from scipy.stats import chisquare

    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, -1.0]])
    n = 20_000
    for temperature in (1.0, 0.6):
        drawn = next_token(logits.repeat(n, 1), _uniforms(list(range(n)), step=3), temperature)
        observed = torch.bincount(drawn, minlength=5).double()
        expected = torch.softmax(logits[0].double() / temperature, -1) * n
        assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-4


def test_sampling_uniforms_depend_on_seed_and_step_only():
    alone = sampling_uniforms(torch.tensor([7]), 5)
    batched = sampling_uniforms(torch.tensor([3, 7, 9]), 5)
    assert alone[0] == batched[1]  # a row's draw does not depend on its batch
    assert sampling_uniforms(torch.tensor([7]), 6)[0] != alone[0]  # nor repeat across steps
    u = sampling_uniforms(torch.arange(50_000), 0)
    assert float(u.min()) >= 0 and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01


def test_next_token_rows_use_their_own_seed():
    logits = torch.zeros(3, 50)
    a = next_token(logits, _uniforms([7, 8, 9]), 1.0)
    b = next_token(logits[:1], _uniforms([7]), 1.0)
    assert a[0] == b[0]


def test_sampling_config_errors():
    with pytest.raises(ConfigError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        SamplingConfig(max_new_tokens=0)


def _generator(lm, **kw):
    sampling = SamplingConfig(**{"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 12, **kw})
    return HFGenerator(lm, sampling)


def test_generation_is_reproducible_and_counts_tokens(tiny_chat):
    gen = _generator(tiny_chat, readout_tokens=None)
    first = gen.sample(PROMPT, [11, 12, 13])
    again = gen.sample(PROMPT, [11, 12, 13])
    assert [t.token_ids for t in first] == [t.token_ids for t in again]
    assert len({tuple(t.token_ids) for t in first}) > 1  # different seeds, different samples
    for t in first:
        assert 1 <= len(t) <= 12
        assert t.finish == ("eos" if t.token_ids[-1] == 2 else "length")
        assert len(t.log_prob) == len(t.confidence) == len(t.divergence) == len(t)
        assert all(len(row) == tiny_chat.n_layers and row[-1] == 0.0 for row in t.divergence)


def test_a_sample_does_not_depend_on_its_batch(tiny_chat):
    gen = _generator(tiny_chat)
    alone = gen.sample(PROMPT, [12])[0]
    together = gen.sample(PROMPT, [11, 12, 13])[1]
    assert alone.token_ids == together.token_ids


def test_readout_window_limits_the_divergence_rows(tiny_chat):
    full = _generator(tiny_chat, readout_tokens=None).sample(PROMPT, [3])[0]
    part = _generator(tiny_chat, readout_tokens=4).sample(PROMPT, [3])[0]
    assert part.token_ids == full.token_ids  # the readout never changes what is sampled
    assert len(part.divergence) == min(4, len(part))
    assert torch.allclose(torch.tensor(part.divergence), torch.tensor(full.divergence[:4]))


def test_same_pass_readout_equals_the_scoring_path(tiny_chat):
    """The divergences and log-probs taken while generating equal a separate scoring pass over the same text."""
    trace = _generator(tiny_chat, readout_tokens=None).sample(PROMPT, [5])[0]
    seq = TokenSequence(PROMPT, trace.token_ids)
    table = reduce_readout(iter_readout(tiny_chat, [seq], ReadoutConfig()), 1, tiny_chat.n_layers, "jsd")[0]
    assert torch.allclose(torch.tensor(trace.divergence), table.divergence, atol=2e-5)
    assert torch.allclose(torch.tensor(trace.log_prob, dtype=torch.float32), table.log_prob, atol=2e-5)
    assert torch.allclose(
        torch.tensor(trace.self_certainty, dtype=torch.float32), table.self_certainty, atol=2e-5
    )


def test_two_phases_continue_the_exact_prefixes(tiny_chat):
    gen = _generator(tiny_chat, readout_tokens=None)
    seeds = [21, 22, 23, 24]
    whole = gen.sample(PROMPT, seeds)
    paused = gen.start(PROMPT, seeds, stop_after=3)
    assert all(len(t) <= 3 for t in paused.traces)
    kept = gen.resume(paused, [1, 3])
    for i, trace in zip([1, 3], kept, strict=True):
        assert trace.token_ids == whole[i].token_ids
        assert torch.allclose(torch.tensor(trace.divergence), torch.tensor(whole[i].divergence), atol=1e-5)
    for i in (0, 2):  # rejected: stopped at the prefix (or finished before it)
        assert paused.traces[i].token_ids == whole[i].token_ids[: len(paused.traces[i])]
        assert paused.traces[i].finish in ("paused", "eos")


def test_prompt_too_long_for_the_context(tiny_chat):
    gen = _generator(tiny_chat, max_new_tokens=200)
    with pytest.raises(InputError, match="exceed"):
        gen.sample(list(range(3, 80)), [1])
    with pytest.raises(InputError, match="seed"):
        gen.sample(PROMPT, [])


def test_further_divergence_kinds_come_from_the_same_walk(tiny_chat):
    """``ReadoutConfig.also``: KL and cosine stored beside JSD equal separate scoring passes of each kind, and
    asking for them changes neither the tokens nor the JSD rows."""
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=12, readout_tokens=None)
    plain = HFGenerator(tiny_chat, sampling).sample(PROMPT, [5])[0]
    trace = HFGenerator(tiny_chat, sampling, ReadoutConfig(also=("kl", "cosine", "jsd"))).sample(PROMPT, [5])[
        0
    ]
    assert trace.token_ids == plain.token_ids and trace.divergence == plain.divergence
    assert sorted(trace.also) == ["cosine", "kl"]  # the primary kind is not repeated
    seq = TokenSequence(PROMPT, trace.token_ids)
    for kind in ("kl", "cosine"):
        chunks = iter_readout(tiny_chat, [seq], ReadoutConfig(divergence=kind))
        table = reduce_readout(chunks, 1, tiny_chat.n_layers, kind)[0]
        assert torch.allclose(torch.tensor(trace.also[kind]), table.divergence, atol=2e-5)
