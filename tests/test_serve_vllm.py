"""`depthlens serve --backend vllm`: one engine for every request (continuous batching), Think@n's rejected samples
and online DeepConf's stopped ones aborted in the engine at their stop, a client that leaves aborted, SIGTERM
with a request in flight. One server per module (a tiny random chat model, float32, eager); client calls bounded."""

from __future__ import annotations

import asyncio
import importlib.util
import threading

import pytest
import torch

from depthlens.sampling.choose import vllm_available
from tests.serving import save_tiny_chat, serving, wait_for
from tests.tolerance import assert_float32_equal, separated, shifted

pytestmark = pytest.mark.skipif(
    not vllm_available()
    or any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "openai")),
    reason="needs the vllm and serve extras and the openai client",
)
TIMEOUT = 180
G = 0.1  # the tiny model's tokens settle at different layers at this threshold


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_chat(tmp_path_factory.mktemp("serve-vllm-model"))


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-vllm-log") / "server.log"
    args = [
        "--model",
        str(model_dir),
        "--backend",
        "vllm",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "256",
        "--kv-cache-gib",
        "0.05",
        "--max-tokens",
        "64",
        "--readout-tokens",
        "all",
        "--shutdown-grace",
        "60",
    ]
    with serving(args, log) as process:
        yield process


@pytest.fixture(scope="module")
def model(model_dir):
    return str(model_dir)


@pytest.fixture
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0, timeout=TIMEOUT)


def _depth(choice) -> dict:
    return choice.model_extra["depthlens"]


def test_concurrent_requests_share_engine_steps(server, model, client):
    import openai

    prompts = [f"question {i}:" for i in range(8)]
    alone = [
        client.completions.create(model=model, prompt=p, max_tokens=16, seed=i).choices[0].text
        for i, p in enumerate(prompts)
    ]
    before = server.health()

    async def together() -> list:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0, timeout=TIMEOUT)
        replies = await asyncio.gather(
            *(
                aclient.completions.create(model=model, prompt=p, max_tokens=16, seed=i)
                for i, p in enumerate(prompts)
            )
        )
        await aclient.close()
        return list(replies)

    replies = asyncio.run(together())
    after = server.health()
    assert [r.choices[0].text for r in replies] == alone  # a seeded sample does not depend on its batch
    tokens = sum(r.usage.completion_tokens for r in replies)
    steps = after["steps"] - before["steps"]
    assert steps < tokens / 2, (steps, tokens)  # batched: one step serves many requests' samples
    assert after["engine_requests"] == 0
    assert after["capture"] == "aux"  # rows from the engine's own forward pass (llama: EAGLE-3's states)
    read = {"dtype": "float32", "lens": "logit", "lens_dtype": "float32"}  # --dtype float32 (issue 41)
    assert all(read.items() <= r.model_extra["depthlens"].items() for r in replies)


def test_think_keeps_one_phase_samples_and_aborts_the_rest_at_l(server, model, client):
    plain = client.completions.create(model=model, prompt="5+5=", max_tokens=20, n=6, seed=4)
    aborted = server.health()["aborted"]
    r = client.completions.create(
        model=model,
        prompt="5+5=",
        max_tokens=20,
        seed=4,
        extra_body={
            "depthlens": {"g": G, "answer_type": "string", "think": {"n": 6, "eta": 0.5, "prefix": 4}}
        },
    )
    think = _depth(r.choices[0])["think"]
    assert think["kept"] == sorted(
        sorted(range(6), key=lambda i: (-think["samples"][i]["prefix_dtr"], i))[:3]
    )
    stopped = 0
    for sample, whole in zip(think["samples"], plain.choices, strict=True):
        assert sample["seed"] == _depth(whole)["seed"]
        if sample["kept"]:  # never interrupted: the very sample a one-phase request draws
            assert sample["text"] == whole.text and sample["tokens"] == _depth(whole)["token_count"]
        else:  # aborted in the engine at ℓ: not one token more was generated
            assert sample["generated"] == sample["tokens"] == min(4, _depth(whole)["token_count"])
            assert whole.text.startswith(sample["text"])
            stopped += _depth(whole)["token_count"] > 4
            # one that ended by itself (EOS) by ℓ was not stopped: it saved nothing (issue 41)
            assert sample["stopped"] == (_depth(whole)["token_count"] > 4)
    assert server.health()["aborted"] - aborted == stopped == think["stopped"]
    ended = [s["tokens"] for s in think["samples"] if not s["stopped"]]
    mean = sum(ended) / len(ended)
    saved = sum(max(0.0, mean - s["generated"]) for s in think["samples"] if s["stopped"])
    assert think["tokens_saved"] == round(saved)
    assert r.usage.completion_tokens == sum(s["generated"] for s in think["samples"])


def test_online_deepconf_stops_samples_in_the_engine(server, model, client):
    deepconf = {"threshold": 1e6, "warmup_samples": 2, "window_size": 3, "max_traces": 6, "batch_size": 2}
    r = client.completions.create(
        model=model, prompt="5+5=", max_tokens=20, seed=4, extra_body={"depthlens": {"online": deepconf}}
    )
    online = _depth(r.choices[0])["online"]
    later = [s for s in online["samples"] if s["phase"] == "online"]
    assert later and all(s["generated"] == s["stopped_at"] == 3 for s in later if s["stopped_at"] is not None)
    assert r.usage.completion_tokens == sum(s["generated"] for s in online["samples"])
    r = client.completions.create(
        model=model,
        prompt="5+5=",
        max_tokens=20,
        seed=4,
        extra_body={"depthlens": {"g": G, "online": {"warmup": 2, "max_n": 6, "prefix": 4, "batch_size": 2}}},
    )
    online = _depth(r.choices[0])["online"]
    for s in online["samples"]:
        if s["stopped_at"] is not None:
            assert s["generated"] == s["tokens"] == s["stopped_at"] <= 4


def test_stream_rows_and_text_match_the_whole_response(model, client, model_dir):
    from depthlens.metrics.token_table import chunk_divergence_kinds
    from depthlens.models.load import load
    from depthlens.readout.stream import TokenSequence, iter_readout

    options = {"depthlens": {"tokens": True, "g": G}}
    whole = client.completions.create(model=model, prompt="hello", max_tokens=24, seed=9, extra_body=options)
    stream = client.completions.create(
        model=model, prompt="hello", max_tokens=24, seed=9, stream=True, extra_body=options
    )
    text, rows = "", []
    for chunk in stream:
        text += chunk.choices[0].text
        extra = chunk.choices[0].model_extra.get("depthlens") or {}
        if "readout" in extra:
            assert extra["readout"]["offset"] == len(rows)
            rows.extend(extra["readout"]["divergence"])
    d = _depth(whole.choices[0])
    assert text == whole.choices[0].text and len(rows) == d["readout_tokens"] == d["token_count"]
    assert_float32_equal(rows, d["tokens"]["divergence"], what="streamed rows")
    lm = load(str(model_dir), device="cpu")  # the rows are the lens over the same prompt and tokens
    prompt = lm.tokenizer("hello", add_special_tokens=True)["input_ids"]
    chunks = iter_readout(lm, [TokenSequence(prompt, d["tokens"]["token_ids"])])
    reference = torch.cat([chunk_divergence_kinds(c, ("jsd",))["jsd"] for c in chunks])
    assert_float32_equal(rows, reference, what="rows", mutants=[("a dropped token", shifted(rows))])


def test_each_layers_top_k_equals_scores_for_the_same_ids(client, model):
    """``depthlens.layer_top_k`` on vLLM: each read-out token's top-k per layer, taken inside the engine in the
    pass that sampled it, equals ``score --tokens --layer-top-k`` (the transformers readout) of the same prompt and
    token ids — ids where no near-tie lets them swap, probabilities within float32 reordering (issue 52)."""
    import numpy as np

    from depthlens.config import ReadoutConfig
    from depthlens.models.load import load
    from depthlens.models.tokens import layer_top_texts
    from depthlens.studies.score import score

    asked = {"tokens": True, "layer_top_k": 4}
    r = client.completions.create(
        model=model, prompt="7*8=", max_tokens=10, seed=3, extra_body={"depthlens": asked}
    )
    tokens = _depth(r.choices[0])["tokens"]
    lm = load(model, device="cpu", dtype="float32")
    prompt = lm.tokenizer("7*8=", add_special_tokens=True)["input_ids"]
    record = {"id": "x", "prompt_ids": prompt, "completion_ids": tokens["token_ids"]}
    [scored] = score(lm, [record], tokens=True, readout=ReadoutConfig(layer_top_k=4), tcb=None)
    ids, expected = np.asarray(tokens["layer_top_ids"]), np.asarray(scored["layer_top_ids"])
    assert ids.shape == expected.shape == (len(tokens["token_ids"]), 3, 4)
    apart = separated(scored["layer_top_probs"])
    assert apart.mean() > 0.9 and (ids[apart] == expected[apart]).all()
    assert_float32_equal(
        tokens["layer_top_probs"],
        scored["layer_top_probs"],
        rounded=True,
        what="layer_top_probs",
        mutants=[("a dropped token", shifted(tokens["layer_top_probs"]))],
    )
    assert tokens["layer_top_tokens"] == layer_top_texts(lm.tokenizer, tokens["layer_top_ids"])
    plain = client.completions.create(
        model=model, prompt="7*8=", max_tokens=10, seed=3, extra_body={"depthlens": {"tokens": True}}
    )
    assert "layer_top_ids" not in _depth(plain.choices[0])["tokens"]  # none unless asked
    stream = client.completions.create(
        model=model, prompt="7*8=", max_tokens=10, seed=3, stream=True, extra_body={"depthlens": asked}
    )
    streamed = []
    for chunk in stream:
        extra = (chunk.choices[0].model_extra.get("depthlens") or {}) if chunk.choices else {}
        if extra.get("readout"):
            assert extra["readout"]["offset"] == len(streamed)
            streamed.extend(extra["readout"]["layer_top_ids"])
    assert streamed == tokens["layer_top_ids"]  # a stream's read-out rows carry them, row for row


def test_the_per_layer_quantities_equal_scores_for_the_same_ids(server, client, model):
    """``depthlens.layer_target`` / ``track`` / ``layer_entropy`` on vLLM (``SessionBackend(per_layer=…)``): each
    read-out token's values, taken inside the engine in the pass that sampled it, equal ``score``'s (the
    transformers readout) of the same prompt and token ids, whole and streamed; an id past the vocabulary is a 400
    naming ``depthlens.track`` before the engine is asked (issue 58)."""
    import httpx

    from depthlens.config import ReadoutConfig
    from depthlens.models.load import load
    from depthlens.studies.score import score

    asked = {"tokens": True, "layer_target": True, "track": [3, 9], "layer_entropy": True}
    r = client.completions.create(
        model=model, prompt="7*8=", max_tokens=10, seed=3, extra_body={"depthlens": asked}
    )
    tokens = _depth(r.choices[0])["tokens"]
    lm = load(model, device="cpu", dtype="float32")
    prompt = lm.tokenizer("7*8=", add_special_tokens=True)["input_ids"]
    record = {"id": "x", "prompt_ids": prompt, "completion_ids": tokens["token_ids"]}
    readout = ReadoutConfig(layer_target=True, track=(3, 9), layer_entropy=True)
    [scored] = score(lm, [record], tokens=True, readout=readout, tcb=None)
    fields = ("layer_target_logprobs", "layer_target_ranks", "layer_track_logprobs", "layer_track_ranks")
    for field in (*fields, "layer_entropy"):
        assert_float32_equal(tokens[field], scored[field], rounded=True, what=f"served {field}")
    stream = client.completions.create(
        model=model, prompt="7*8=", max_tokens=10, seed=3, stream=True, extra_body={"depthlens": asked}
    )
    streamed: list = []
    for chunk in stream:
        extra = (chunk.choices[0].model_extra.get("depthlens") or {}) if chunk.choices else {}
        if extra.get("readout"):
            assert extra["readout"]["offset"] == len(streamed)
            streamed.extend(extra["readout"]["layer_target_ranks"])
    assert streamed == tokens["layer_target_ranks"]
    bad = {"model": model, "prompt": "7*8=", "depthlens": {"tokens": True, "track": [3, len(lm.tokenizer)]}}
    response = httpx.post(f"{server.url}/v1/completions", json=bad, timeout=TIMEOUT)
    assert response.status_code == 400 and response.json()["error"]["param"] == "depthlens.track"


def test_top_logprobs(model, client):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        seed=2,
        logprobs=True,
        top_logprobs=3,
        extra_body={"depthlens": {"tokens": True}},
    )
    content = r.choices[0].logprobs.content
    values = _depth(r.choices[0])["tokens"]["log_prob"]
    assert len(content) == len(values) and all(len(c.top_logprobs) == 3 for c in content)
    for entry, value in zip(content, values, strict=True):
        assert entry.logprob == pytest.approx(value)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob


def test_top_k_and_min_p_reach_the_engine(model, client):
    """vLLM's own sampling fields, applied in the engine (issue 42): top_k 1 is greedy, so every sample is the
    same; the token strings join to the text."""
    r = client.completions.create(
        model=model,
        prompt="5+5=",
        max_tokens=8,
        n=3,
        seed=6,
        extra_body={"top_k": 1, "min_p": 0.05, "depthlens": {"tokens": True}},
    )
    assert len({c.text for c in r.choices}) == 1
    tokens = _depth(r.choices[0])["tokens"]
    assert "".join(tokens["token_strings"]) == r.choices[0].text
    assert all(c.finish_reason in ("stop", "length") for c in r.choices)


def test_a_client_that_leaves_has_its_engine_requests_aborted(server, model):
    import httpx

    aborted = server.health()["aborted"]
    body = {"model": model, "prompt": "go", "max_tokens": 64, "n": 8, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=TIMEOUT) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break
    assert wait_for(
        lambda: server.health()["engine_requests"] == 0 and server.health()["aborted"] > aborted, 60
    )
    assert server.health()["active"] == 0


def test_sigterm_finishes_the_request_in_flight_then_exits_0(server, model):
    import httpx

    results: list = []
    body = {"model": model, "prompt": "last", "max_tokens": 64, "n": 16}
    worker = threading.Thread(
        target=lambda: results.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT))
    )
    worker.start()
    # polled often: on a quiet machine the request can finish within one 0.2 s poll
    assert wait_for(lambda: server.health()["engine_requests"] > 0, 60, every=0.02)
    assert server.stop(timeout=120) == 0
    worker.join(TIMEOUT)
    assert results and results[0].status_code == 200 and len(results[0].json()["choices"]) == 16


def test_sigterm_past_the_grace_period_answers_every_request(model_dir, tmp_path):
    """--shutdown-grace 0 on vLLM: the running stream gets an error event then [DONE], the request that does not
    stream a 503 with code aborted; no traceback in the log, exit 0 (issue 41)."""
    import json

    import httpx

    args = ["--model", str(model_dir), "--backend", "vllm", "--device", "cpu", "--dtype", "float32"]
    args += ["--enforce-eager", "--max-model-len", "256", "--kv-cache-gib", "0.05", "--shutdown-grace", "0"]
    log = tmp_path / "server.log"
    with serving(args, log) as server:
        long = {"model": str(model_dir), "prompt": "x", "max_tokens": 240, "n": 32}
        long["depthlens"] = {"readout_tokens": "all"}
        seen: list[str] = []
        answers: list[httpx.Response] = []

        def read() -> None:
            with httpx.stream(
                "POST", f"{server.url}/v1/completions", json={**long, "stream": True}, timeout=TIMEOUT
            ) as response:
                seen.extend(response.iter_lines())

        def post() -> None:
            answers.append(httpx.post(f"{server.url}/v1/completions", json=long, timeout=TIMEOUT))

        workers = [threading.Thread(target=read), threading.Thread(target=post)]
        for worker in workers:
            worker.start()
        assert wait_for(lambda: server.health()["active"] == 2 and server.health()["engine_requests"] > 0, 60)
        code = server.stop(timeout=60)
        for worker in workers:
            worker.join(TIMEOUT)
    assert code == 0
    data = [line[6:] for line in seen if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "aborted", data[-2:]
    assert answers and answers[0].status_code == 503 and answers[0].json()["error"]["code"] == "aborted"
    text = log.read_text()
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text[-3000:]
