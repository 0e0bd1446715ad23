"""A fitted lens inside the vLLM engine (issue 43, items 2 and 6; issue 58 item 3 for the Jacobian lens): the worker
applies the lens's matrices before the final norm and unembedding, and what it reads equals the transformers readout
through the same lens within the float32 tolerance of tests/test_vllm_readout.py — with a random, non-identity
tuned translator and J-lens, so the test would see a lens that did not reach the worker (the logit lens's rows are
far from the fitted ones)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from depthlens.config import SamplingConfig
from depthlens.evals.loading import load_task
from depthlens.sampling.choose import vllm_available
from depthlens.sampling.hf import HFGenerator
from depthlens.studies.resolve import readout as run_readout
from tests.conftest import SMOLLM2_ENGINE
from tests.test_lens_runs import make_lens, tuned_lens

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not vllm_available(), reason="needs the vllm extra: pip install 'depthlens[vllm]'"),
]

BITS = 1e-4  # as tests/test_vllm_readout.py: float32 on both sides, only the kernels' summation orders differ
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=10, readout_tokens=None)


@pytest.fixture(scope="module", params=["tuned", "jacobian"])
def lens(request, real_model, tmp_path_factory):
    """A random lens of each kind (the Jacobian lens: identity plus noise, so it reads far from the logit lens)."""
    folder = tmp_path_factory.mktemp(request.param)
    given, _, _ = make_lens(request.param, real_model, folder, noise=0.02, seed=3)
    return run_readout(lens=given, also=("cosine",))


def test_generated_tuned_readout_equals_the_transformers_one(real_model, smollm2_engine, lens):
    from depthlens.models.info import info_of
    from depthlens.sampling.vllm.generator import EngineGenerator
    from depthlens.studies.generate import prompt_ids

    info = info_of(real_model)
    prompt = prompt_ids(real_model, load_task("reasoning_gym:basic_arithmetic", 1, seed=0)[0])
    ours = EngineGenerator(info, GREEDY, lens, SMOLLM2_ENGINE, llm_engine=smollm2_engine).sample(prompt, [0])[
        0
    ]
    hf = HFGenerator(real_model, GREEDY, lens).sample(prompt, [0])[0]
    logit = dataclasses.replace(lens, lens="logit")
    plain = EngineGenerator(info, GREEDY, logit, SMOLLM2_ENGINE, llm_engine=smollm2_engine).sample(
        prompt, [0]
    )[0]
    assert ours.token_ids == hf.token_ids == plain.token_ids  # the lens changes no sample
    div, hf_div = torch.tensor(ours.divergence), torch.tensor(hf.divergence)
    assert (div - hf_div).abs().max() <= BITS
    assert (
        torch.tensor(plain.divergence) - hf_div
    ).abs().max() > 100 * BITS  # the translators reached the worker
    assert torch.allclose(torch.tensor(ours.also["cosine"]), torch.tensor(hf.also["cosine"]), atol=1e-5)


def test_scored_tuned_readout_equals_score_records(real_model, smollm2_engine, lens):
    from depthlens.models.info import info_of
    from depthlens.sampling.vllm.prefill import EngineScorer
    from depthlens.stores.inputs import InputRecord
    from depthlens.studies.score import score_records, score_records_on

    info = info_of(real_model)
    records = [InputRecord("a", 1, {"prompt": "What is 7 times 6?", "completion": " 7 times 6 is 42."})]
    reader = EngineScorer(info, lens, SMOLLM2_ENGINE, llm_engine=smollm2_engine)
    ours = list(score_records_on(reader, info, records, tcb=None, tokens=True))
    ref = list(score_records(real_model, records, readout=lens, tcb=None, tokens=True))
    for a, b in zip(ours, ref, strict=True):
        assert a["token_ids"] == b["token_ids"]
        assert (torch.tensor(a["divergence"]) - torch.tensor(b["divergence"])).abs().max() <= BITS


def test_serve_on_vllm_reads_every_depth_through_the_lens(tmp_path):
    """``serve --backend vllm --lens tuned:X``: /health and every response name the lens, and a served sample's
    divergence rows equal the transformers readout of the same tokens through the same (random) lens."""
    import importlib.util
    import json
    import urllib.request

    from depthlens.models.load import load
    from depthlens.stores.inputs import InputRecord
    from depthlens.studies.score import score_records
    from tests.serving import save_tiny_chat, serving

    if any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn")):
        pytest.skip("needs the serve extra")
    model_dir = save_tiny_chat(tmp_path / "model")
    lm = load(str(model_dir), device="cpu", dtype="float32")
    stamp = tuned_lens(lm, tmp_path / "lens", noise=0.1, seed=5)
    lens = f"tuned:{tmp_path / 'lens'}"
    args = [
        *("--model", str(model_dir), "--backend", "vllm", "--device", "cpu", "--dtype", "float32"),
        *("--enforce-eager", "--max-model-len", "256", "--kv-cache-gib", "0.05", "--max-tokens", "32"),
        *("--readout-tokens", "all", "--lens", lens),
    ]
    prompt = [5, 6, 7, 8, 9]
    body = {
        "model": str(model_dir),
        "prompt": prompt,
        "max_tokens": 8,
        "seed": 4,
        "depthlens": {"tokens": True},
    }
    with serving(args, tmp_path / "server.log") as server:
        health = server.health()
        request = urllib.request.Request(
            f"{server.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=180) as answer:
            reply = json.loads(answer.read())
    assert health["lens"] == lens and health["lens_digest"] == stamp["digest"]
    depth = reply["choices"][0]["depthlens"]
    assert reply["depthlens"]["lens"] == lens == depth["lens"]
    served = depth["tokens"]
    record = InputRecord("a", 1, {"prompt_ids": prompt, "completion_ids": served["token_ids"]})
    (ref,) = score_records(lm, [record], readout=run_readout(lens=lens), tcb=None, tokens=True)
    rows = torch.tensor(served["divergence"])
    assert (rows - torch.tensor(ref["divergence"])).abs().max() <= BITS
    (plain,) = score_records(lm, [record], tcb=None, tokens=True)
    assert (rows - torch.tensor(plain["divergence"])).abs().max() > 100 * BITS  # the lens reached the worker
