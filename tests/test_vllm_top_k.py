"""Each layer's predictions inside the vLLM engine (issue 52, item 1): per read-out token the worker keeps every
layer's top-k token ids and probabilities, taken in the pass that reads the divergences; on a tiny random llama
(eager, float32) they equal a plain transformers logit lens of the same token ids and the transformers sampler's
own — ids up to ties, probabilities within float32 reordering (tests/tolerance.py) — for sampled tokens, for
teacher-forced completions and for the server's session with a per-request K.

Named to run after the modules that share the session's SmolLM2 engine (tests/conftest.py ``smollm2_engine``): this
module's own engine, dropped at its end, takes vLLM's process-wide parallel state with it, which an engine started
before it and used after it then lacks ("pipeline model parallel group is not initialized").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.readout.stream import TokenSequence
from depthlens.sampling.choose import vllm_available
from depthlens.sampling.hf import HFGenerator
from tests.tolerance import assert_float32_equal, separated

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not vllm_available(), reason="needs the vllm extra: pip install 'depthlens[vllm]'"),
]

ENGINE = EngineConfig(
    backend="vllm", dtype="float32", enforce_eager=True, max_model_len=256, kv_cache_gib=0.05
)
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=8, readout_tokens=None)
K = 5
PROMPT = [5, 6, 7, 8, 9, 10]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(loaded transformers model, its ModelInfo, a vLLM engine with the readout) of the server tests' tiny llama."""
    from depthlens.models.info import load_info
    from depthlens.models.load import load
    from depthlens.sampling.vllm.engine import JobSize, start_engine
    from tests.serving import save_tiny_chat

    path = save_tiny_chat(tmp_path_factory.mktemp("layer-top") / "model")
    lm = load(str(path), device="cpu", dtype="float32")
    info = load_info(str(path))
    yield lm, info, start_engine(info, ENGINE, JobSize(2, 256))


@pytest.fixture(scope="module")
def model_dir(tiny):
    return tiny[1].source


def plain_lens(lm, ids: list[int]) -> torch.Tensor:
    """A plain transformers logit lens, as a TransformerLens user writes it: softmax(lm_head(norm(h_l))) at every
    position for layers 1..L−1, the model's own softmax(logits) at layer L. [positions, L, V] float64."""
    model = lm.model
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
        states = out.hidden_states[1:-1]  # after blocks 1..L−1 (the last entry is already normed)
        layers = [model.lm_head(model.model.norm(h))[0] for h in states] + [out.logits[0]]
    return torch.softmax(torch.stack(layers, dim=1).double(), dim=-1)


def assert_top_k(ids: object, probs: object, reference: torch.Tensor) -> None:
    """``ids`` / ``probs`` [T, L, K] are ``reference``'s top-k ([T, L, V] probabilities): each listed id has the
    listed probability, the probabilities are the reference's K largest in order — so the ids are equal up to
    ties — and a wrong layer or a dropped token would not pass."""
    ids_t, probs_t = torch.as_tensor(ids), torch.as_tensor(probs, dtype=torch.float64)
    top = torch.topk(reference, K, dim=-1)
    assert ids_t.shape == probs_t.shape == top.indices.shape
    assert_float32_equal(
        probs_t,
        top.values,
        what="top-k probabilities",
        mutants=[
            ("a wrong layer", torch.roll(probs_t, 1, dims=1)),
            ("a dropped token", torch.roll(probs_t, 1, dims=0)),
        ],
    )
    assert_float32_equal(reference.gather(-1, ids_t.long()), probs_t, what="the listed ids' probabilities")
    # where the reference's neighbours are further apart than float32 rounding, the ids are equal outright
    settled = torch.from_numpy(separated(top.values))
    assert settled.float().mean() > 0.9  # the check below is not vacuous
    assert torch.equal(ids_t[settled], top.indices[settled])


def test_sampled_tokens_layer_top_equals_a_plain_logit_lens(tiny):
    from depthlens.sampling.vllm.generator import EngineGenerator

    lm, info, engine = tiny
    readout = ReadoutConfig(layer_top_k=K, also=("kl",))
    trace = EngineGenerator(info, GREEDY, readout, ENGINE, llm_engine=engine).sample(PROMPT, [0])[0]
    tokens = trace.token_ids
    assert len(trace.layer_top_ids) == len(tokens) == len(trace.divergence)
    # token t is sampled from the position before it: the prompt's last position, then each generated token's
    reference = plain_lens(lm, PROMPT + tokens)[len(PROMPT) - 1 : len(PROMPT) - 1 + len(tokens)]
    assert_top_k(trace.layer_top_ids, trace.layer_top_probs, reference)
    # greedy: each token is its final layer's top-1
    assert [row[-1][0] for row in trace.layer_top_ids] == tokens
    hf = HFGenerator(lm, GREEDY, readout).sample(PROMPT, [0])[0]  # the same-pass values of the HF sampler
    assert hf.token_ids == tokens
    assert_top_k(hf.layer_top_ids, hf.layer_top_probs, reference)
    assert_float32_equal(trace.layer_top_probs, hf.layer_top_probs, what="engine vs transformers sampler")
    plain = EngineGenerator(info, GREEDY, ReadoutConfig(also=("kl",)), ENGINE, llm_engine=engine)
    without = plain.sample(PROMPT, [0])[0]
    assert without.token_ids == tokens and without.layer_top_ids == []  # asked for nothing: none kept
    assert np.allclose(without.divergence, trace.divergence, atol=1e-6)  # and the divergences are unchanged


def test_a_window_and_two_phases_keep_the_rows_aligned(tiny):
    from depthlens.sampling.vllm.generator import EngineGenerator

    lm, info, engine = tiny
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8, readout_tokens=3)
    gen = EngineGenerator(info, sampling, ReadoutConfig(layer_top_k=2), ENGINE, llm_engine=engine)
    whole = gen.sample(PROMPT, [3, 4])
    paused = gen.start(PROMPT, [3, 4], stop_after=2)
    kept = gen.resume(paused, [1])[0]
    assert kept.token_ids == whole[1].token_ids
    for trace in (*whole, kept):
        n = min(3, len(trace.token_ids))
        assert len(trace.layer_top_ids) == len(trace.layer_top_probs) == n
        assert np.asarray(trace.layer_top_ids).shape == (n, lm.n_layers, 2)
    assert kept.layer_top_ids == whole[1].layer_top_ids


def test_teacher_forced_layer_top_equals_a_plain_logit_lens(tiny):
    from depthlens.sampling.vllm.prefill import EngineScorer

    lm, info, engine = tiny
    seqs = [TokenSequence(PROMPT, [11, 12, 13, 14, 15, 16, 17]), TokenSequence([5], [])]
    scorer = EngineScorer(info, ReadoutConfig(layer_top_k=K), ENGINE, llm_engine=engine)
    table, empty = scorer.tables(seqs)
    assert empty.n_tokens == 0
    full = PROMPT + list(seqs[0].completion_ids)
    reference = plain_lens(lm, full)[len(PROMPT) - 1 : len(full) - 1]
    assert table.layer_top_ids is not None and table.layer_top_ids.dtype == torch.int64
    assert_top_k(table.layer_top_ids, table.layer_top_probs, reference)


def test_generate_and_score_on_vllm_store_what_the_transformers_readout_scores(tiny, tmp_path):
    """``generate --backend vllm --layer-top-k 3`` stores the fields (JSONL, stamped in the manifest), and scoring
    those responses through the engine (``score --backend vllm``'s path) lists the same tokens with the same
    probabilities as ``score --tokens --layer-top-k 3`` through transformers (as stored: 6 decimals)."""
    import json

    from depthlens.sampling.vllm.prefill import EngineScorer
    from depthlens.stores.inputs import InputRecord
    from depthlens.stores.jsonl import iter_jsonl
    from depthlens.studies.score import score_records_on
    from tests.view_stores import cli

    def fresh(*args: object) -> None:
        """The CLI in a fresh process: an engine stopped in this one takes vLLM's process-wide state with it."""
        done = subprocess.run(
            [sys.executable, "-c", "from depthlens.cli.app import main; main()", *map(str, args)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]

    _, info, engine = tiny
    vllm = ["--backend", "vllm", "--dtype", "float32", "--enforce-eager", "--max-model-len", "256"]
    task = ["--task", "reasoning_gym:chain_sum", "--task-config", "min_terms=2,max_terms=2,max_digits=1"]
    store = tmp_path / "samples"
    fresh(
        *("generate", "--model", info.source, *task, "--questions", "1", "--pool", "2", "--store", "jsonl"),
        *("--max-new-tokens", "6", "--readout-tokens", "all", "--layer-top-k", "3", "--out", store, *vllm),
        *("--kv-cache-gib", "0.05", "--device", "cpu"),
    )
    samples = list(iter_jsonl(store / "samples.jsonl"))
    manifest = json.loads((store / "samples.jsonl.manifest.json").read_text())
    assert manifest["readout"]["layer_top_k"] == 3
    out = tmp_path / "scores-hf.jsonl"
    cli(
        *("score", "--model", info.source, "--in", store / "samples.jsonl", "--out", out, "--tokens"),
        *("--layer-top-k", "3", "--backend", "hf", "--device", "cpu"),
    )
    reference = {r["id"]: r for r in iter_jsonl(out)}
    records = [InputRecord(r["id"], i + 1, r) for i, r in enumerate(samples)]
    reader = EngineScorer(info, ReadoutConfig(layer_top_k=3), ENGINE, llm_engine=engine)
    scored = {r["id"]: r for r in score_records_on(reader, info, records, tcb=None, tokens=True)}
    for sample in samples:
        expected = reference[sample["id"]]
        for a in (sample, scored[sample["id"]]):
            ids = np.asarray(a["layer_top_ids"])
            assert ids.shape == (len(sample["token_ids"]), 3, 3)
            apart = separated(expected["layer_top_probs"])
            assert (ids[apart] == np.asarray(expected["layer_top_ids"])[apart]).all()
            assert_float32_equal(
                a["layer_top_probs"], expected["layer_top_probs"], rounded=True, what=sample["id"]
            )


def test_the_servers_session_takes_a_per_request_k(tiny):
    """The server's path (``EngineSession``, ``SessionBackend``): each request's own K reaches the worker over the
    session's setting — requests with K = 5, 2 and none running at once, read out in shared lens walks (a walk
    takes its rows' largest K, each row keeps its own) — and the rows equal the generator's. The session closes;
    the engine stays for the modules after this one."""
    from concurrent.futures import ThreadPoolExecutor

    from depthlens.sampling.vllm.depth import EngineDepth
    from depthlens.sampling.vllm.generator import EngineGenerator
    from depthlens.sampling.vllm.requests import SessionBackend
    from depthlens.sampling.vllm.session import EngineSession

    lm, info, engine = tiny
    readout = ReadoutConfig(layer_top_k=K)
    expected = EngineGenerator(info, GREEDY, readout, ENGINE, llm_engine=engine).sample(PROMPT, [0])[0]
    session = EngineSession(
        engine, EngineDepth(info, ReadoutConfig(), ENGINE), sorted(info.end_ids), lm.n_layers
    )
    pool = ThreadPoolExecutor(3)
    try:
        runs = [
            pool.submit(SessionBackend(session, GREEDY, layer_top_k=k).sample, PROMPT, [0]) for k in (K, 2, 0)
        ]
        five, two, bare = (run.result(timeout=300)[0] for run in runs)
    finally:  # closed before the callers are joined: a caller left waiting is answered by the close
        session.close(stop_engine=False)  # the module's engine: stopping it ends vLLM's process-wide state
        pool.shutdown(wait=True)
    assert five.token_ids == two.token_ids == bare.token_ids == expected.token_ids
    for served, k in ((five, K), (two, 2)):
        ids, probs = np.asarray(served.layer_top_ids), np.asarray(served.layer_top_probs)
        assert ids.shape == (len(expected.token_ids), lm.n_layers, k)
        reference = np.asarray(expected.layer_top_probs)[..., :k]
        apart = separated(np.asarray(expected.layer_top_probs))[..., :k]
        assert (ids[apart] == np.asarray(expected.layer_top_ids)[..., :k][apart]).all()
        assert_float32_equal(probs, reference, what=f"served probabilities, K = {k}")
    assert bare.layer_top_ids == [] and len(bare.divergence) == len(bare.token_ids)
