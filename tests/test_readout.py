"""The streaming readout equals the naive materialising one, in bounded memory, for every family."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from depthlens.config import ReadoutConfig
from depthlens.errors import InputError, NonFiniteError
from depthlens.metrics.reference import reference_divergences
from depthlens.metrics.token_table import reduce_readout
from depthlens.models.adapters import ADAPTERS
from depthlens.models.load import wrap
from depthlens.readout.stream import TokenSequence, chunk_sizes, iter_readout
from tests.conftest import tiny_model


def _seq(prompt_len: int, completion_len: int, seed: int = 0, high: int = 90) -> TokenSequence:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, high, (prompt_len + completion_len,), generator=g).tolist()
    return TokenSequence(ids[:prompt_len], ids[prompt_len:])


def _stream(lm, seqs, config=ReadoutConfig()):
    return reduce_readout(iter_readout(lm, seqs, config), len(seqs), lm.n_layers, config.divergence)


@pytest.mark.parametrize("model_type", sorted(ADAPTERS))
def test_streaming_equals_reference_for_every_family(model_type):
    lm = wrap(tiny_model(model_type))
    seq = _seq(5, 11)
    (table,) = _stream(lm, [seq])
    expected, final = reference_divergences(lm, seq)
    torch.testing.assert_close(table.divergence, expected, atol=1e-5, rtol=1e-4)
    assert table.target_ids.tolist() == list(seq.completion_ids)
    torch.testing.assert_close(table.log_prob, final.gather(1, table.target_ids[:, None]).squeeze(1))
    assert (table.divergence >= 0).all() and (table.divergence <= 1).all()
    assert (table.divergence[:, -1] == 0).all()


@pytest.mark.parametrize("kind", ["jsd", "jsd-nat", "kl", "cosine"])
def test_every_divergence_matches_reference(kind):
    lm = wrap(tiny_model("qwen3"))
    seq = _seq(4, 9, seed=3)
    (table,) = _stream(lm, [seq], ReadoutConfig(divergence=kind))
    expected, _ = reference_divergences(lm, seq, kind=kind)
    torch.testing.assert_close(table.divergence, expected, atol=1e-5, rtol=1e-4)


def test_no_final_norm_ablation_matches_reference():
    lm = wrap(tiny_model("llama"))
    seq = _seq(4, 9, seed=4)
    (table,) = _stream(lm, [seq], ReadoutConfig(final_norm=False))
    expected, _ = reference_divergences(lm, seq, final_norm=False)
    torch.testing.assert_close(table.divergence, expected, atol=1e-5, rtol=1e-4)
    (normed,) = _stream(lm, [seq])
    assert not torch.allclose(table.divergence, normed.divergence)


def _big_vocab_lm():
    # V large enough that the 16 MB minimum budget forces many segments and chunks on a short text.
    return wrap(tiny_model("llama", vocab_size=50_000))


def test_segments_and_chunks_and_batches_change_nothing():
    lm = _big_vocab_lm()
    config = ReadoutConfig(memory_mb=16)
    segment, chunk = chunk_sizes(config, 50_000, 32, lm.n_layers, 3)
    seqs = [
        _seq(7, 150, seed=5, high=49_000),
        _seq(30, 40, seed=6, high=49_000),
        _seq(2, 1, seed=7, high=49_000),
    ]
    assert segment < 150 and chunk < 40  # the text really is split
    batched = _stream(lm, seqs, config)
    for seq, table in zip(seqs, batched, strict=True):
        expected, _ = reference_divergences(lm, seq)
        torch.testing.assert_close(table.divergence, expected, atol=2e-5, rtol=1e-4)
        (alone,) = _stream(lm, [seq], config)
        torch.testing.assert_close(table.divergence, alone.divergence, atol=2e-5, rtol=1e-4)


class _LargestVocabTensor(TorchDispatchMode):
    """Records the largest tensor with a vocabulary-sized last axis created while active."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.largest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.ndim and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("completion_len", [60, 240])
def test_no_layer_by_vocab_tensor_and_memory_flat_in_length(completion_len):
    lm = _big_vocab_lm()
    config = ReadoutConfig(memory_mb=16)
    segment, chunk = chunk_sizes(config, 50_000, 32, lm.n_layers, 1)
    seq = _seq(4, completion_len, seed=8, high=49_000)
    with _LargestVocabTensor(50_000) as probe:
        _stream(lm, [seq], config)
    # The biggest vocab-sized tensor is one forward segment's logits or one readout chunk — never
    # layers × tokens × vocab, and the same bound for 60 and 240 tokens.
    assert probe.largest <= max(segment, chunk) * 50_000
    assert probe.largest < lm.n_layers * completion_len * 50_000


def test_non_finite_hidden_state_names_layer_and_token():
    lm = wrap(tiny_model("llama", seed=1))

    def poison(_module, _args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden[0, 6] = float("nan")  # position 6 = completion token 2 when the prompt has 5 tokens

    handle = lm.parts.blocks[1].register_forward_hook(poison)
    try:
        with pytest.raises(NonFiniteError, match="layer 2, completion token 2"):
            _stream(lm, [_seq(5, 6)])
    finally:
        handle.remove()


def test_too_long_and_empty_prompt_are_clear_errors():
    lm = wrap(tiny_model("llama"))
    with pytest.raises(InputError, match=r"300 tokens .* exceed .* context of 256"):
        _stream(lm, [_seq(200, 100)])
    with pytest.raises(InputError, match="the prompt is empty"):
        _stream(lm, [TokenSequence([], [5, 6])])


def test_dtype_bfloat16_keeps_float32_probabilities():
    lm = wrap(tiny_model("llama", seed=2).to(torch.bfloat16))
    chunk = next(iter_readout(lm, [_seq(3, 4)]))
    assert chunk.final.logprobs.dtype == torch.float32
    assert next(chunk.layers()).logprobs.dtype == torch.float32
    lm.model.to(torch.float32)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "gpt2", "qwen3_moe"])
@pytest.mark.parametrize("kind", ["jsd", "kl", "cosine"])
def test_early_exit_settles_exactly_like_the_full_walk(model_type, kind):
    """``chunk_settling`` (exact early exit) gives the settling depths of the full divergence table, at any g,
    and with ``last`` = ⌈ρL⌉ − 1 the same deep flags."""
    from depthlens.metrics.dtr import deep_flags, deep_threshold, settling_depth
    from depthlens.metrics.token_table import chunk_divergences, chunk_settling

    lm = wrap(tiny_model(model_type, num_hidden_layers=8) if model_type != "gpt2" else tiny_model(model_type))
    config = ReadoutConfig(divergence=kind)
    chunks = list(iter_readout(lm, [_seq(4, 30, seed=3)], config))
    full = torch.cat([chunk_divergences(c, kind) for c in chunks])
    for g in (0.0, 0.05, float(full[:, :-1].median()), 0.5, 10.0):
        early = torch.cat([chunk_settling(c, kind, g) for c in chunks])
        assert torch.equal(early, settling_depth(full, g)), g
        k = deep_threshold(lm.n_layers, 0.7)
        capped = torch.cat([chunk_settling(c, kind, g, last=k - 1) for c in chunks])
        assert torch.equal(
            deep_flags(capped, lm.n_layers, 0.7), deep_flags(settling_depth(full, g), lm.n_layers, 0.7)
        )


def test_scores_without_tokens_use_early_exit_and_agree(tiny_llama):
    """Scores without per-token output take the early exit (and, asked, the compiled kernel): same numbers."""
    import warnings

    from depthlens.config import DTRConfig
    from depthlens.studies.score import score

    records = [
        {"id": str(i), "prompt_ids": [3 + i, 4, 5], "completion_ids": list(range(6 + i, 26 + i))}
        for i in range(3)
    ]
    for g in (0.02, 0.5):
        dtr = DTRConfig(g=g, rho=0.6)
        fast = score(tiny_llama, records, dtr=dtr, tcb=None)
        slow = score(tiny_llama, records, dtr=dtr, tcb=None, tokens=True)
        off = score(tiny_llama, records, dtr=dtr, tcb=None, readout=ReadoutConfig(early_exit=False))
        keys = ("dtr", "mean_settling_depth", "token_count", "log_prob", "self_certainty")
        assert [{k: r[k] for k in keys} for r in fast] == [{k: r[k] for k in keys} for r in slow]
        assert fast == off
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # without a C++ compiler the eager fallback answers
            fused = score(tiny_llama, records, dtr=dtr, tcb=None, readout=ReadoutConfig(compile="on"))
        assert [{k: r[k] for k in keys} for r in fused] == [{k: r[k] for k in keys} for r in fast]


def test_compiled_kernel_equals_eager_and_falls_back(tiny_llama, monkeypatch):
    """The fused compiled step gives the eager divergences and settling; where compiling fails it warns once
    and runs eager (the CPU fallback of the GPU path)."""
    import warnings

    from depthlens.metrics import fused
    from depthlens.metrics.token_table import chunk_divergences, chunk_settling

    assert fused.use_compiled("auto", torch.device("cpu")) is False
    assert fused.use_compiled("auto", torch.device("cuda")) and fused.use_compiled("on", torch.device("cpu"))
    chunks = list(iter_readout(tiny_llama, [_seq(4, 24, seed=5)], ReadoutConfig()))
    for kind in ("jsd", "kl"):
        eager = torch.cat([chunk_divergences(c, kind) for c in chunks])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no C++ compiler on some machines: then the fallback answers
            compiled = torch.cat([chunk_divergences(c, kind, compiled=True) for c in chunks])
            settle = torch.cat([chunk_settling(c, kind, 0.3, compiled=True) for c in chunks])
        torch.testing.assert_close(compiled, eager, atol=2e-5, rtol=1e-4)
        from depthlens.metrics.dtr import settling_depth

        assert torch.equal(settle, settling_depth(eager, 0.3))

    def broken(fn, **_):
        def fail(*a, **k):
            raise RuntimeError("no compiler here")

        return fail

    monkeypatch.setattr(fused.torch, "compile", broken)
    lm = wrap(tiny_model("qwen2"))
    chunks = list(iter_readout(lm, [_seq(4, 12)], ReadoutConfig()))
    with pytest.warns(RuntimeWarning, match="compiled readout unavailable .*no compiler here"):
        out = torch.cat([chunk_divergences(c, "jsd", compiled=True) for c in chunks])
    torch.testing.assert_close(out, torch.cat([chunk_divergences(c, "jsd") for c in chunks]))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "True False"),
        ({"DEPTHLENS_MALLOC": "default"}, "False False"),
        ({"MALLOC_TRIM_THRESHOLD_": "1"}, "False False"),
    ],
)
def test_allocator_keeps_freed_buffers_once_unless_the_user_tuned_malloc(env, expected):
    """glibc's thresholds are raised once per process (readout chunks reuse their buffers), never over a user's."""
    import os
    import subprocess
    import sys

    code = "from depthlens.models.allocator import keep_freed_memory as k; print(k(), k())"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "DEPTHLENS_MALLOC"}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True)
    assert out.stdout.strip() == (expected if sys.platform.startswith("linux") else "False False"), out.stderr
