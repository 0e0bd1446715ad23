"""`depthlens serve` on the real default model (SmolLM2-135M-Instruct) with the openai SDK: a chat answer with its
depth, a stream, and Think@n — on vLLM where the extra is installed (the default backend there), else on hf."""

from __future__ import annotations

import importlib.util

import pytest

from depthlens.models import catalogue
from depthlens.sampling.choose import vllm_available
from tests.serving import serving

pytestmark = [
    pytest.mark.integration,
    pytest.mark.serve_model,  # ~1 min (a real engine's start): deselected by default, `pytest -m serve_model`
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "openai")),
        reason="needs the serve extra and the openai client",
    ),
]
MODEL = catalogue.DEFAULT_MODEL
QUESTION = [{"role": "user", "content": "What is 12 + 30? Put your final answer within \\boxed{}."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not catalogue.is_installed(MODEL):
        pytest.skip(f"{MODEL} not installed; run `make model`")
    engine = ["--backend", "vllm", "--enforce-eager", "--max-model-len", "1024"] if vllm_available() else []
    args = ["--model", MODEL, "--device", "cpu", *(engine or ["--backend", "hf"])]
    with serving(args, tmp_path_factory.mktemp("serve-real") / "server.log") as process:
        yield process


@pytest.fixture
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0, timeout=600)


def test_a_chat_answer_carries_its_depth(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=40,
        temperature=0.6,
        seed=0,
        extra_body={"depthlens": {"tokens": True, "prefix": 20}},
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    d = choice.model_extra["depthlens"]
    assert r.model_extra["depthlens"]["n_layers"] == 30
    assert 0 <= d["dtr"] <= 1 and 0 <= d["dtr_prefix"] <= 1 and 1 <= d["mean_settling_depth"] <= 30
    assert d["readout_tokens"] == min(50, d["token_count"]) == len(d["tokens"]["settling_depth"])
    assert all(1 <= c <= 30 for c in d["tokens"]["settling_depth"])
    assert len(d["tokens"]["divergence"][0]) == 30 and d["tokens"]["divergence"][0][-1] == 0.0  # D_{t,L} = 0
    assert d["log_prob"] < 0 and d["neg_entropy"] <= 0 and d["confidence"] > 0
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=40,
        temperature=0.6,
        seed=0,
        stream=True,
        extra_body={"depthlens": {"prefix": 20}},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == choice.message.content


def test_think_at_n_on_the_real_model(client):
    think = {"n": 4, "eta": 0.5, "prefix": 16}
    r = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=48,
        temperature=0.6,
        seed=1,
        extra_body={"depthlens": {"think": think}},
    )
    think = r.choices[0].model_extra["depthlens"]["think"]
    assert len(think["samples"]) == 4 and len(think["kept"]) == 2
    # stopped: the rejected samples still running at ℓ (one that ended by itself before ℓ saved nothing)
    assert think["stopped"] == sum(s["stopped"] for s in think["samples"])
    assert all(s["stopped"] == (not s["kept"] and s["finish_reason"] is None) for s in think["samples"])
    for s in think["samples"]:
        assert s["generated"] == s["tokens"] and (s["kept"] or s["tokens"] <= 16)
    assert r.usage.completion_tokens == sum(s["generated"] for s in think["samples"])
    if think["answer"] is not None:  # the voted answer is a kept sample's, stated in its text
        voted = think["samples"][think["voted"]]
        assert voted["kept"] and voted["vote_key"] == think["answer"]
