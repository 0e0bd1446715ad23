"""The per-layer quantities inside the vLLM engine (issue 58 item 4): per read-out token the worker keeps the target
trajectory (the read-out token's log-probability and rank at every layer), tracked ids and each layer's entropy,
from the log-probabilities the divergences read. A generated position's target is the token the engine sampled
there — the worker reads it right after sampling — so with temperature 1 (a token that is not the argmax) the values
equal a plain transformers computation of the engine's own tokens; greedy, they equal the transformers sampler's;
teacher forced, the transformers ``score``'s; and the server's session takes them per request.

Named to run after the modules that share the session's SmolLM2 engine and after test_vllm_top_k.py, whose engine
(dropped at its end) takes vLLM's process-wide parallel state with it (see that module's docstring).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.readout.stream import TokenSequence
from depthlens.sampling.choose import vllm_available
from depthlens.sampling.hf import HFGenerator
from tests.tolerance import assert_float32_equal, shifted, wrong_layer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not vllm_available(), reason="needs the vllm extra: pip install 'depthlens[vllm]'"),
]

ENGINE = EngineConfig(
    backend="vllm", dtype="float32", enforce_eager=True, max_model_len=256, kv_cache_gib=0.05
)
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=8, readout_tokens=None)
PROMPT = [5, 6, 7, 8, 9, 10]
TRACK = (3, 7)
READOUT = ReadoutConfig(layer_target=True, track=TRACK, layer_entropy=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(loaded transformers model, its ModelInfo, a vLLM engine with the readout) of the server tests' tiny llama."""
    from depthlens.models.info import load_info
    from depthlens.models.load import load
    from depthlens.sampling.vllm.engine import JobSize, start_engine
    from tests.serving import save_tiny_chat

    path = save_tiny_chat(tmp_path_factory.mktemp("trajectory") / "model")
    lm = load(str(path), device="cpu", dtype="float32")
    info = load_info(str(path))
    yield lm, info, start_engine(info, ENGINE, JobSize(2, 256))


def plain_layers(lm, ids: list[int]) -> torch.Tensor:
    """Every layer's full log-softmax at every position, as a TransformerLens user writes it: lm_head(norm(h_l)) for
    layers 1..L−1, the model's own logits at layer L. [positions, L, V] float32."""
    model = lm.model
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
        layers = [model.lm_head(model.model.norm(h))[0] for h in out.hidden_states[1:-1]] + [out.logits[0]]
    return torch.log_softmax(torch.stack(layers, dim=1).float(), dim=-1)


def assert_quantities(values: dict, reference: torch.Tensor, targets: list[int]) -> None:
    """``values`` (field → [T, L] or [T, L, M]) are ``reference``'s ([T, L, V] log-probabilities) of ``targets``
    and ``TRACK``: log-probabilities within float32 reordering (a wrong layer or a dropped token would not pass),
    ranks equal where no other token ties the ranked one within float32 rounding."""
    T, L = reference.shape[:2]
    target = torch.tensor(targets)
    want = reference.gather(-1, target[:, None, None].expand(T, L, 1))[..., 0]
    got = np.asarray(values["layer_target_logprobs"], dtype=np.float64)
    assert got.shape == (T, L)
    mutants = [("a wrong layer", wrong_layer(got)), ("a dropped token", shifted(got))]
    assert_float32_equal(got, want, what="target log-probabilities", mutants=mutants)
    tracked = reference[..., list(TRACK)]
    assert_float32_equal(values["layer_track_logprobs"], tracked, what="tracked log-probabilities")
    entropy = -(reference.double().exp() * reference.double()).sum(-1)
    assert_float32_equal(values["layer_entropy"], entropy, what="entropies")
    for field, chosen in (("layer_target_ranks", want[..., None]), ("layer_track_ranks", tracked)):
        ranks = np.asarray(values[field]).reshape(T, L, -1)
        plain = (reference[..., None, :] > chosen[..., None]).sum(-1).numpy()
        ties = ((reference[..., None, :] - chosen[..., None]).abs() < 1e-5).sum(-1).numpy()  # itself: 1
        assert (ranks[ties == 1] == plain[ties == 1]).all() and (ties == 1).mean() > 0.9, field
        assert (np.abs(ranks - plain) <= ties - 1).all(), field


def test_a_sampled_tokens_trajectory_is_the_sampled_tokens_own(tiny):
    from depthlens.sampling.vllm.generator import EngineGenerator

    lm, info, engine = tiny
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8, readout_tokens=None)
    traces = EngineGenerator(info, sampling, READOUT, ENGINE, llm_engine=engine).sample(PROMPT, [3, 4])
    not_argmax = 0
    for trace in traces:
        tokens = trace.token_ids
        assert set(trace.layer_values) == {
            "layer_target_logprobs",
            "layer_target_ranks",
            "layer_track_logprobs",
            "layer_track_ranks",
            "layer_entropy",
        }
        reference = plain_layers(lm, PROMPT + tokens)[len(PROMPT) - 1 : len(PROMPT) - 1 + len(tokens)]
        assert_quantities(trace.layer_values, reference, tokens)
        not_argmax += sum(row[-1] > 0 for row in trace.layer_values["layer_target_ranks"])
    assert not_argmax > 0  # some sampled token was not its final layer's most probable: not the argmax read


def test_greedy_equals_the_transformers_sampler_and_asks_nothing_extra(tiny):
    from depthlens.sampling.vllm.generator import EngineGenerator

    lm, info, engine = tiny
    trace = EngineGenerator(info, GREEDY, READOUT, ENGINE, llm_engine=engine).sample(PROMPT, [0])[0]
    hf = HFGenerator(lm, GREEDY, READOUT).sample(PROMPT, [0])[0]
    assert hf.token_ids == trace.token_ids
    assert [row[-1] for row in trace.layer_values["layer_target_ranks"]] == [0] * len(trace.token_ids)
    for field, values in trace.layer_values.items():
        if field.endswith("_ranks"):
            assert values == hf.layer_values[field], field
        else:
            assert_float32_equal(values, hf.layer_values[field], what=f"engine vs transformers: {field}")
    plain = EngineGenerator(info, GREEDY, ReadoutConfig(), ENGINE, llm_engine=engine).sample(PROMPT, [0])[0]
    assert plain.layer_values == {} and np.allclose(plain.divergence, trace.divergence, atol=1e-6)


def test_a_window_and_two_phases_keep_the_values_aligned(tiny):
    from depthlens.sampling.vllm.generator import EngineGenerator

    lm, info, engine = tiny
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8, readout_tokens=3)
    gen = EngineGenerator(info, sampling, ReadoutConfig(layer_target=True), ENGINE, llm_engine=engine)
    whole = gen.sample(PROMPT, [3, 4])
    paused = gen.start(PROMPT, [3, 4], stop_after=2)
    kept = gen.resume(paused, [1])[0]
    assert kept.token_ids == whole[1].token_ids
    assert kept.layer_values == whole[1].layer_values
    for trace in (*whole, kept):
        n = min(3, len(trace.token_ids))
        assert np.asarray(trace.layer_values["layer_target_ranks"]).shape == (n, lm.n_layers)


def test_teacher_forced_values_equal_the_transformers_score(tiny):
    from depthlens.sampling.vllm.prefill import EngineScorer
    from depthlens.studies.score import score

    lm, info, engine = tiny
    completion = [11, 12, 13, 4, 15, 16, 17]
    scorer = EngineScorer(info, READOUT, ENGINE, llm_engine=engine)
    table, empty = scorer.tables([TokenSequence(PROMPT, completion), TokenSequence([5], [])])
    assert empty.n_tokens == 0 and empty.layer_values == {}
    full = PROMPT + completion
    reference = plain_layers(lm, full)[len(PROMPT) - 1 : len(full) - 1]
    assert_quantities(table.layer_values, reference, completion)
    [hf] = score(
        lm, [{"id": "x", "prompt_ids": PROMPT, "completion_ids": completion}], readout=READOUT, tokens=True
    )
    for field, values in table.layer_values.items():
        assert_float32_equal(values, hf[field], rounded=True, what=f"engine vs transformers score: {field}")


def test_the_servers_session_takes_per_request_settings(tiny):
    """``SessionBackend(per_layer=...)``: one request with the target trajectory and tracked ids, one with none,
    running at once through a session whose readout asks for neither; the first equals the generator's values,
    the second holds none. The session closes; the engine stays for the module's end."""
    from concurrent.futures import ThreadPoolExecutor

    from depthlens.sampling.vllm.depth import EngineDepth
    from depthlens.sampling.vllm.generator import EngineGenerator
    from depthlens.sampling.vllm.groups import PerLayer
    from depthlens.sampling.vllm.requests import SessionBackend
    from depthlens.sampling.vllm.session import EngineSession

    lm, info, engine = tiny
    readout = ReadoutConfig(layer_target=True, track=TRACK)
    expected = EngineGenerator(info, GREEDY, readout, ENGINE, llm_engine=engine).sample(PROMPT, [0])[0]
    session = EngineSession(
        engine, EngineDepth(info, ReadoutConfig(), ENGINE), sorted(info.end_ids), lm.n_layers
    )
    asked = PerLayer(layer_target=True, track=TRACK)
    pool = ThreadPoolExecutor(2)
    try:
        runs = [
            pool.submit(SessionBackend(session, GREEDY, per_layer=per_layer).sample, PROMPT, [0])
            for per_layer in (asked, None)
        ]
        served, bare = (run.result(timeout=300)[0] for run in runs)
    finally:  # closed before the callers are joined: a caller left waiting is answered by the close
        session.close(stop_engine=False)
        pool.shutdown(wait=True)
    assert served.token_ids == bare.token_ids == expected.token_ids
    assert set(served.layer_values) == set(expected.layer_values) and bare.layer_values == {}
    for field, values in served.layer_values.items():
        assert_float32_equal(values, expected.layer_values[field], what=f"served {field}")


def test_a_tracked_id_past_the_vocabulary_is_refused_before_the_engine_is_asked(tiny):
    from depthlens.errors import ConfigError
    from depthlens.sampling.vllm.generator import EngineGenerator

    _, info, engine = tiny
    past = len(info.tokenizer)
    with pytest.raises(ConfigError, match=rf"track=\[3, {past}\]: token id {past} is past"):
        EngineGenerator(info, GREEDY, ReadoutConfig(track=(3, past)), ENGINE, llm_engine=engine)
