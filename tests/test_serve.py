"""`depthlens serve` on the transformers backend, with real clients on loopback: the openai SDK (sync, async,
streaming), curl and raw HTTP for the malformed requests. One server per module (a tiny random chat model);
every client call has a timeout."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import threading
import time

import pytest
import torch

from tests.serving import save_tiny_chat, serving, wait_for
from tests.tolerance import assert_float32_equal, shifted

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "openai", "httpx")),
    reason="needs the serve extra and the openai client",
)
TIMEOUT = 120  # s per client call: generous for a loaded 2-core machine, bounded
G = 0.1  # a settling threshold at which the tiny model's tokens settle at different layers (DTRs vary)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_chat(tmp_path_factory.mktemp("serve-model"))


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    args = [
        "--model",
        str(model_dir),
        "--backend",
        "hf",
        "--device",
        "cpu",
        "--max-tokens",
        "64",
        "--max-body-bytes",
        "4096",
        "--readout-tokens",
        "all",
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


OPENAI_SAMPLING = {"temperature": 1.0, "top_p": 1.0}  # what a request meant before the server's own defaults


def _depth(choice) -> dict:
    """The choice's ``depthlens`` object as the typed SDK object carries it (an extra field)."""
    return choice.model_extra["depthlens"]


def test_models_and_a_plain_completion(client, model):
    from openai.types import Completion

    assert [m.id for m in client.models.list().data] == [model]
    r = client.completions.create(model=model, prompt="12+3=", max_tokens=8, n=3, seed=7, logprobs=0)
    assert isinstance(r, Completion) and r.object == "text_completion" and len(r.choices) == 3
    counts = [_depth(c)["token_count"] for c in r.choices]
    assert (
        r.usage.completion_tokens == sum(counts) and r.usage.prompt_tokens == 5
    )  # a character tokenizer without BOS
    for c in r.choices:
        assert c.finish_reason in ("stop", "length") and isinstance(c.text, str)
        assert len(c.logprobs.token_logprobs) == _depth(c)["token_count"]
        d = _depth(c)
        assert (
            0 <= d["dtr"] <= 1
            and 1 <= d["mean_settling_depth"] <= 3
            and d["readout_tokens"] == d["token_count"]
        )
    again = client.completions.create(model=model, prompt="12+3=", max_tokens=8, n=3, seed=7)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]  # seeded: reproducible
    assert r.model_extra["depthlens"]["backend"] == "hf"
    # the numbers say what read them: the dtype of the forward pass (the tiny model is float32) and the lens
    read = {"dtype": "float32", "lens": "logit", "lens_dtype": "float32"}
    assert read.items() <= r.model_extra["depthlens"].items()
    assert all(read.items() <= _depth(c).items() for c in r.choices)


def test_depth_is_the_readout_of_the_returned_tokens(client, model, model_dir):
    """Per-token values: settling depths and DTR follow from the returned divergence rows (definitions §2), and
    those rows equal a teacher-forced readout of the same prompt and tokens."""
    from depthlens.metrics.dtr import deep_flags, settling_depth
    from depthlens.metrics.token_table import chunk_divergence_kinds
    from depthlens.models.load import load
    from depthlens.readout.stream import TokenSequence, iter_readout

    r = client.completions.create(
        model=model,
        prompt="7*8=",
        max_tokens=12,
        seed=1,
        extra_body={"depthlens": {"tokens": True, "g": G, "prefix": 5}},
    )
    d = _depth(r.choices[0])
    tokens = d["tokens"]
    rows = torch.tensor(tokens["divergence"])
    settle = settling_depth(rows, G)
    deep = deep_flags(settle, 3, 0.85)
    assert tokens["settling_depth"] == settle.tolist() and tokens["deep"] == deep.tolist()
    assert d["dtr"] == pytest.approx(deep.double().mean().item())
    assert d["dtr_prefix"] == pytest.approx(deep[:5].double().mean().item())
    assert d["mean_settling_depth"] == pytest.approx(settle.double().mean().item())
    assert d["log_prob"] == pytest.approx(sum(tokens["log_prob"]) / len(tokens["log_prob"]))
    lm = load(str(model_dir), device="cpu")
    prompt = lm.tokenizer("7*8=", add_special_tokens=True)["input_ids"]
    chunks = list(iter_readout(lm, [TokenSequence(prompt, tokens["token_ids"])]))
    reference = torch.cat([chunk_divergence_kinds(c, ("jsd",))["jsd"] for c in chunks])
    # the same pass vs a teacher-forced one: float32 reordering only; a token off by one must fail
    assert_float32_equal(rows, reference, what="divergences", mutants=[("a dropped token", shifted(rows))])


def test_each_layers_top_k_equals_scores_for_the_same_ids(client, model, model_dir):
    """``depthlens.layer_top_k``: each read-out token's top-k per layer, taken in the pass that sampled it, equals
    ``score --tokens --layer-top-k`` of the same prompt and token ids (issue 52)."""
    from depthlens.config import ReadoutConfig
    from depthlens.models.load import load
    from depthlens.models.tokens import layer_top_texts
    from depthlens.studies.score import score

    r = client.completions.create(
        model=model,
        prompt="7*8=",
        max_tokens=10,
        seed=3,
        extra_body={"depthlens": {"tokens": True, "layer_top_k": 4}},
    )
    tokens = _depth(r.choices[0])["tokens"]
    lm = load(str(model_dir), device="cpu")
    prompt = lm.tokenizer("7*8=", add_special_tokens=True)["input_ids"]
    record = {"id": "x", "prompt_ids": prompt, "completion_ids": tokens["token_ids"]}
    [scored] = score(lm, [record], tokens=True, readout=ReadoutConfig(layer_top_k=4), tcb=None)
    assert len(tokens["layer_top_ids"]) == len(tokens["token_ids"]) and len(tokens["layer_top_ids"][0]) == 3
    assert tokens["layer_top_ids"] == scored["layer_top_ids"]
    assert_float32_equal(tokens["layer_top_probs"], scored["layer_top_probs"], what="layer_top_probs")
    assert tokens["layer_top_tokens"] == layer_top_texts(lm.tokenizer, scored["layer_top_ids"])
    plain = client.completions.create(
        model=model, prompt="7*8=", max_tokens=10, seed=3, extra_body={"depthlens": {"tokens": True}}
    )
    assert "layer_top_ids" not in _depth(plain.choices[0])["tokens"]  # none unless asked
    stream = client.completions.create(
        model=model,
        prompt="7*8=",
        max_tokens=10,
        seed=3,
        stream=True,
        extra_body={"depthlens": {"tokens": True, "layer_top_k": 4}},
    )
    streamed = []
    for chunk in stream:
        readout = (
            (chunk.choices[0].model_extra.get("depthlens") or {}).get("readout") if chunk.choices else None
        )
        if readout:
            assert readout["offset"] == len(streamed)
            streamed.extend(readout["layer_top_ids"])
    assert streamed == tokens["layer_top_ids"]  # a stream's read-out rows carry them too


def test_streaming_chat_carries_per_token_values_and_usage(client, model):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=10, seed=5, extra_body={"depthlens": {"tokens": True}}
    )
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=10,
        seed=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"depthlens": {"tokens": True}},
    )
    text, offsets, rows, usage, finish, summary = "", [], [], None, None, None
    contents = []
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        contents.append(choice.delta.content)
        extra = choice.model_extra.get("depthlens") or {}
        if "tokens" in extra and isinstance(extra["tokens"], dict) and "offset" in extra["tokens"]:
            offsets.append((extra["tokens"]["offset"], len(extra["tokens"]["token_ids"])))
        if "readout" in extra:
            rows.extend(extra["readout"]["settling_depth"])
        if choice.finish_reason:
            finish, summary = choice.finish_reason, extra
    expected = whole.choices[0]
    assert text == expected.message.content and finish == expected.finish_reason
    assert [o for o, _ in offsets] == [
        sum(n for _, n in offsets[:i]) for i in range(len(offsets))
    ]  # contiguous
    assert rows == _depth(expected)["tokens"]["settling_depth"]
    assert summary["dtr"] == _depth(expected)["dtr"]
    assert (summary["dtype"], summary["lens"]) == ("float32", "logit")  # a stream's last chunk says it too
    assert "" not in contents[1:]  # no chunk of empty content (the end-of-turn token decodes to none)
    per_token = _depth(expected)["tokens"]
    assert len(per_token["token_strings"]) == len(per_token["token_ids"])
    assert "".join(per_token["token_strings"]) == expected.message.content  # special tokens are ""
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_vllm_sampling_fields_and_response_format(client, model):
    """top_k / min_p as vLLM takes them, applied (top_k 1 is greedy: every sample the same); response_format
    text accepted (issue 42)."""
    r = client.completions.create(
        model=model, prompt="7*6=", max_tokens=6, n=3, seed=1, extra_body={"top_k": 1, "min_p": 0.05}
    )
    assert len({c.text for c in r.choices}) == 1
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        response_format={"type": "text"},
        extra_body={"top_k": -1},
    )
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_async_clients_at_once_get_what_they_get_alone(server, model):
    import openai

    async def main() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0, timeout=TIMEOUT)
        calls = [
            aclient.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=6, seed=i
            )
            for i in range(4)
        ]
        replies = await asyncio.gather(*calls)
        await aclient.close()
        return [r.choices[0].message.content for r in replies]

    together = asyncio.run(main())
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0, timeout=TIMEOUT)
    alone = []
    for i in range(4):
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=6, seed=i
        )
        alone.append(reply.choices[0].message.content)
    assert together == alone


def test_stop_strings_end_the_sample(client, model):
    first = client.completions.create(model=model, prompt="abc", max_tokens=30, seed=11, logprobs=0)
    text, pieces = first.choices[0].text, first.choices[0].logprobs.tokens
    stop = text[10:12]
    assert len(stop) == 2
    cut = client.completions.create(
        model=model, prompt="abc", max_tokens=30, seed=11, stop=[stop, "\x00never"]
    )
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    # generation ended at the token that completed the stop string (special tokens decode to nothing)
    needed = next(k for k in range(len(pieces) + 1) if stop in "".join(pieces[:k]))
    assert cut.usage.completion_tokens == needed < first.usage.completion_tokens


def test_think_at_n_keeps_the_deepest_prefixes_and_stops_the_rest_at_l(client, model):
    r = client.completions.create(
        model=model,
        prompt="3+4=",
        max_tokens=16,
        seed=2,
        extra_body={
            "depthlens": {"g": G, "answer_type": "string", "think": {"n": 6, "eta": 0.5, "prefix": 4}}
        },
    )
    think = _depth(r.choices[0])["think"]
    samples = think["samples"]
    stopped = [s["index"] for s in samples if s["stopped"]]
    assert len(samples) == 6 and think["stopped"] == len(stopped)
    assert stopped == [s["index"] for s in samples if not s["kept"] and s["finish_reason"] is None]
    assert all(s["finish_reason"] in ("stop", "length") for s in samples if not s["stopped"])  # OpenAI's only
    ranked = sorted(range(6), key=lambda i: (-samples[i]["prefix_dtr"], i))[
        :3
    ]  # ties keep the earlier response
    assert think["kept"] == sorted(ranked) == [s["index"] for s in samples if s["kept"]]
    for s in samples:
        assert s["generated"] == s["tokens"]  # nothing generated past what the trace holds
        if not s["kept"]:
            assert s["tokens"] <= 4 and s["answer"] is None and s["finish_reason"] in (None, "stop")
    assert r.usage.completion_tokens == think["tokens"] == sum(s["generated"] for s in samples)
    assert think["voted"] in think["kept"]
    assert _depth(r.choices[0])["seed"] == samples[think["voted"]]["seed"]
    assert think["tokens_saved"] >= 0


def test_think_at_n_counts_only_the_samples_it_stopped(server, client, model):
    """Samples that end by themselves before ℓ (EOS, or max_tokens ≤ ℓ) were not stopped and saved nothing:
    ``stopped``, ``tokens_saved`` and /health's ``aborted`` agree (seed 5: samples 5 and 7 end by EOS at 1 and 5
    tokens, the others run to 16, at OpenAI's temperature 1 / top-p 1 — given: the server's own defaults are
    lower)."""
    prefix, n = 8, 8
    plain = client.completions.create(
        model=model, prompt="5+5=", max_tokens=16, n=n, seed=5, **OPENAI_SAMPLING
    )
    whole = [_depth(c)["token_count"] for c in plain.choices]
    assert any(k < prefix for k in whole) and any(k > prefix for k in whole)
    before = server.health()["aborted"]
    think_body = {"g": G, "answer_type": "string", "think": {"n": n, "eta": 0.25, "prefix": prefix}}
    r = client.completions.create(
        model=model,
        prompt="5+5=",
        max_tokens=16,
        seed=5,
        **OPENAI_SAMPLING,
        extra_body={"depthlens": think_body},
    )
    think = _depth(r.choices[0])["think"]
    samples = think["samples"]
    early = [s for s in samples if not s["kept"] and whole[s["index"]] < prefix]
    assert early and all(s["finish_reason"] == "stop" and not s["stopped"] for s in early)  # ended by itself
    for s in samples:
        assert s["tokens"] == (whole[s["index"]] if s["kept"] else min(prefix, whole[s["index"]]))
        assert s["stopped"] == (not s["kept"] and whole[s["index"]] > prefix)
    stopped = [s for s in samples if s["stopped"]]
    assert think["stopped"] == len(stopped) == server.health()["aborted"] - before
    ended = [s["tokens"] for s in samples if not s["stopped"]]  # ran to their own end, kept or not
    mean = sum(ended) / len(ended)
    assert think["tokens_saved"] == round(sum(max(0.0, mean - s["generated"]) for s in stopped)) > 0
    # max_tokens ≤ ℓ: every sample ends by itself at its length before any decision; nothing stopped or saved
    before = server.health()["aborted"]
    r = client.completions.create(
        model=model,
        prompt="5+5=",
        max_tokens=prefix,
        seed=5,
        **OPENAI_SAMPLING,
        extra_body={"depthlens": think_body},
    )
    think = _depth(r.choices[0])["think"]
    assert think["stopped"] == think["tokens_saved"] == server.health()["aborted"] - before == 0
    assert not any(s["stopped"] for s in think["samples"])


def test_online_think_at_n_and_online_deepconf(server, client, model):
    before = server.health()["aborted"]
    r = client.completions.create(
        model=model,
        prompt="9-2=",
        max_tokens=12,
        seed=3,
        extra_body={"depthlens": {"g": G, "online": {"warmup": 2, "max_n": 6, "prefix": 4, "batch_size": 2}}},
    )
    online = _depth(r.choices[0])["online"]
    assert online["signal"] == "dtr" and 2 <= online["started"] <= 6
    for s in online["samples"]:
        assert s["generated"] == s["tokens"]
        if s["stopped_at"] is not None:
            assert s["phase"] == "online" and s["tokens"] == s["stopped_at"] <= 4 and not s["votes"]
    assert r.usage.completion_tokens == online["tokens"] == sum(s["generated"] for s in online["samples"])
    assert (
        online["stopped"]
        == sum(s["aborted"] for s in online["samples"])
        == server.health()["aborted"] - before
    )
    # DeepConf's names: variant low (keep 10 %), warmup_samples, window_size, max_traces; a fixed threshold so
    # high that every online sample stops as soon as it has a full window.
    r = client.completions.create(
        model=model,
        prompt="9-2=",
        max_tokens=12,
        seed=3,
        extra_body={
            "depthlens": {
                "online": {"variant": "low", "warmup_samples": 2, "window_size": 3, "max_traces": 4}
            }
        },
    )
    online = _depth(r.choices[0])["online"]
    assert online["signal"] == "confidence" and online["keep"] == 0.1 and online["window"] == 3
    r = client.completions.create(
        model=model,
        prompt="9-2=",
        max_tokens=12,
        seed=3,
        extra_body={
            "depthlens": {
                "online": {"threshold": 1e6, "warmup_samples": 2, "window_size": 3, "max_traces": 4}
            }
        },
    )
    online = _depth(r.choices[0])["online"]
    later = [s for s in online["samples"] if s["phase"] == "online"]
    assert online["threshold"] == 1e6 and later
    assert all(s["stopped_at"] == 3 == s["generated"] for s in later if s["tokens"] >= 3)


def test_curl_completion_and_stream(server, model):
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 5, "seed": 1})
    out = subprocess.run(
        [
            "curl",
            "-s",
            "--max-time",
            str(TIMEOUT),
            f"{server.url}/v1/completions",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT + 10,
        check=True,
    )
    reply = json.loads(out.stdout)
    assert reply["choices"][0]["depthlens"]["token_count"] == reply["usage"]["completion_tokens"]
    streamed = json.dumps({"model": model, "prompt": "hi", "max_tokens": 5, "seed": 1, "stream": True})
    out = subprocess.run(
        [
            "curl",
            "-s",
            "-N",
            "--max-time",
            str(TIMEOUT),
            f"{server.url}/v1/completions",
            "-H",
            "Content-Type: application/json",
            "-d",
            streamed,
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT + 10,
        check=True,
    )
    lines = [line[6:] for line in out.stdout.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == reply["choices"][0]["text"]


BAD = {
    "unknown model": ({"model": "gpt-4", "prompt": "x"}, 404, "model", "model_not_found"),
    "n over --max-n": ({"prompt": "x", "n": 1000}, 400, "n", "invalid_value"),
    "max_tokens over --max-tokens": ({"prompt": "x", "max_tokens": 65}, 400, "max_tokens", "invalid_value"),
    "prompt over the context": (
        {"prompt": "x" * 250, "max_tokens": 10},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    "unknown depthlens option": (
        {"prompt": "x", "depthlens": {"bogus": 1}},
        422,
        "depthlens.bogus",
        "unknown_field",
    ),
    "unknown think option": (
        {"prompt": "x", "depthlens": {"think": {"k": 1}}},
        422,
        "depthlens.think.k",
        "unknown_field",
    ),
    "prompt of the wrong type": ({"prompt": {"text": "x"}}, 422, "prompt", "invalid_type"),
    "n of the wrong type": ({"prompt": "x", "n": "2"}, 422, "n", "invalid_type"),
    "top logprobs on hf": ({"prompt": "x", "logprobs": 3}, 400, "logprobs", "unsupported"),
    "a penalty it cannot honour": (
        {"prompt": "x", "presence_penalty": 0.5},
        400,
        "presence_penalty",
        "unsupported",
    ),
    "think with n": ({"prompt": "x", "n": 2, "depthlens": {"think": {"n": 4}}}, 400, "n", "invalid_value"),
    "eta out of range": (
        {"prompt": "x", "depthlens": {"think": {"eta": 1.5}}},
        400,
        "depthlens.think.eta",
        "invalid_value",
    ),
    "layer_top_k without tokens": (
        {"prompt": "x", "depthlens": {"layer_top_k": 3}},
        400,
        "depthlens.layer_top_k",
        "invalid_value",
    ),
    "layer_top_k out of range": (
        {"prompt": "x", "depthlens": {"tokens": True, "layer_top_k": 101}},
        400,
        "depthlens.layer_top_k",
        "invalid_value",
    ),
    "an unknown answer type": (
        {"prompt": "x", "depthlens": {"answer_type": "poem"}},
        400,
        "depthlens.answer_type",
        "invalid_value",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_requests_get_openai_errors(server, model, case):
    import httpx

    body, status, param, code = BAD[case]
    response = httpx.post(f"{server.url}/v1/completions", json={"model": model, **body}, timeout=TIMEOUT)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code)
    assert "Traceback" not in response.text


def test_malformed_json_oversized_body_and_unknown_route(server):
    import httpx

    cases = [
        (httpx.post(f"{server.url}/v1/completions", content=b'{"model": "x", "prompt": ', timeout=TIMEOUT), 400,
         "invalid_json"),
        (httpx.post(f"{server.url}/v1/completions", content=b"[1, 2]", timeout=TIMEOUT), 400, "invalid_json"),
        (httpx.post(f"{server.url}/v1/chat/completions", content=b"x" * 5000, timeout=TIMEOUT), 413,
         "body_too_large"),
        (httpx.post(f"{server.url}/v1/embeddings", json={}, timeout=TIMEOUT), 404, "not_found"),
    ]  # fmt: skip
    for response, status, code in cases:
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code and "Traceback" not in response.text


def test_chat_schema_gaps_and_every_error_code(server, model):
    """A chat message without content is refused by name; a method a route lacks gets a code too (issue 41)."""
    import httpx

    url = f"{server.url}/v1/chat/completions"
    cases = [
        (
            httpx.post(url, json={"model": model, "messages": [{"role": "user"}]}, timeout=TIMEOUT),
            400,
            "messages[0].content",
            "missing_content",
        ),
        (
            httpx.post(
                url, json={"model": model, "messages": [{"role": "user", "content": None}]}, timeout=TIMEOUT
            ),
            400,
            "messages[0].content",
            "missing_content",
        ),
        (httpx.get(url, timeout=TIMEOUT), 405, None, "method_not_allowed"),
        (httpx.get(f"{server.url}/v1/models/nope", timeout=TIMEOUT), 404, "model", "model_not_found"),
    ]
    for response, status, param, code in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"]) == (param, code) and "Traceback" not in response.text
    echoed = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "tool_calls": []}]
    echoed.append({"role": "user", "content": "again"})
    body = {"model": model, "messages": echoed, "max_tokens": 3}
    assert httpx.post(url, json=body, timeout=TIMEOUT).status_code == 200


def _metrics(server) -> dict[str, float]:
    import httpx

    response = httpx.get(f"{server.url}/metrics", timeout=TIMEOUT)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_prometheus_metrics(server, model):
    """/metrics in Prometheus's text format: requests by route and status, latency, tokens (prompt, generated,
    read out), aborted samples, running and waiting requests (issue 42)."""
    import httpx

    before = _metrics(server)
    body = {"model": model, "prompt": "abc", "max_tokens": 5, "n": 2, "seed": 3}
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT).json()
    assert (
        httpx.post(f"{server.url}/v1/completions", json={"model": model}, timeout=TIMEOUT).status_code == 422
    )
    after = _metrics(server)

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew('depthlens_requests_total{route="/v1/completions",status="200"}') == 1
    assert grew('depthlens_requests_total{route="/v1/completions",status="422"}') == 1
    assert grew('depthlens_request_duration_seconds_count{route="/v1/completions"}') == 2
    assert grew("depthlens_prompt_tokens_total") == reply["usage"]["prompt_tokens"] == 3
    assert grew("depthlens_generation_tokens_total") == reply["usage"]["completion_tokens"]
    assert grew("depthlens_readout_tokens_total") == sum(
        c["depthlens"]["readout_tokens"] for c in reply["choices"]
    )
    assert after["depthlens_aborted_samples_total"] == server.health()["aborted"]
    assert after["depthlens_requests_running"] == after["depthlens_requests_waiting"] == 0


def test_a_client_that_disconnects_has_its_request_aborted(server, model):
    import httpx

    before = server.health().get("cancelled", 0)
    body = {"model": model, "prompt": "go", "max_tokens": 64, "n": 8, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=TIMEOUT) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # one chunk, then hang up
    assert wait_for(
        lambda: server.health()["active"] == 0 and server.health().get("cancelled", 0) > before, 60
    )


# ---- a second server: API key, the bounded queue, SIGTERM ---------------------------------------------------------


def test_api_key_queue_limit_and_sigterm_finishes_in_flight(model_dir, tmp_path):
    import httpx

    args = [
        "--model",
        str(model_dir),
        "--backend",
        "hf",
        "--device",
        "cpu",
        "--api-key",
        "sesame",
        "--max-queue",
        "0",
        "--shutdown-grace",
        "60",
        "--max-n",
        "256",
        "--readout-tokens",
        "all",
    ]
    with serving(args, tmp_path / "server.log") as server:
        body = {"model": str(model_dir), "prompt": "x", "max_tokens": 4}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT).status_code == 401
        auth = {"Authorization": "Bearer sesame"}
        assert (
            httpx.post(f"{server.url}/v1/completions", json=body, headers=auth, timeout=TIMEOUT).status_code
            == 200
        )
        long = {**body, "max_tokens": 250, "n": 256}  # seconds of work, so SIGTERM finds it running
        results: list[httpx.Response] = []
        worker = threading.Thread(
            target=lambda: results.append(
                httpx.post(f"{server.url}/v1/completions", json=long, headers=auth, timeout=TIMEOUT)
            )
        )
        worker.start()
        assert wait_for(lambda: server.health()["active"] == 1, 30)
        refused = httpx.post(f"{server.url}/v1/completions", json=body, headers=auth, timeout=TIMEOUT)
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full"
        code = server.stop(timeout=120)  # SIGTERM with the long request in flight: it finishes, then exit 0
        worker.join(TIMEOUT)
    assert code == 0
    assert results and results[0].status_code == 200, results
    assert len(results[0].json()["choices"]) == 256


def test_sigterm_aborts_what_the_grace_period_does_not_cover(model_dir, tmp_path):
    """Past --shutdown-grace every running request is aborted and answered: a started stream gets an error event
    then ``[DONE]``, a request that does not stream (here queued behind it) an OpenAI-shaped 503; no traceback."""
    import httpx

    args = ["--model", str(model_dir), "--backend", "hf", "--device", "cpu", "--shutdown-grace", "0"]
    log = tmp_path / "server.log"
    with serving(args, log) as server:
        long = {
            "model": str(model_dir),
            "prompt": "x",
            "max_tokens": 200,
            "n": 64,
            "depthlens": {"readout_tokens": "all"},
        }
        seen: list[str] = []
        answers: list[httpx.Response] = []

        def read() -> None:
            try:
                with httpx.stream(
                    "POST", f"{server.url}/v1/completions", json={**long, "stream": True}, timeout=TIMEOUT
                ) as response:
                    for line in response.iter_lines():
                        seen.append(line)
            except httpx.HTTPError as exc:  # the server closed the connection mid-stream
                seen.append(f"closed: {type(exc).__name__}")

        def post() -> None:
            answers.append(httpx.post(f"{server.url}/v1/completions", json=long, timeout=TIMEOUT))

        streaming, waiting = threading.Thread(target=read), threading.Thread(target=post)
        streaming.start()
        assert wait_for(lambda: any(line.startswith("data: ") for line in seen), 60)
        waiting.start()
        assert wait_for(lambda: server.health()["active"] == 2, 30)
        began = time.monotonic()
        code = server.stop(timeout=60)
        took = time.monotonic() - began
        streaming.join(TIMEOUT)
        waiting.join(TIMEOUT)
    assert code == 0 and took < 30, (code, took)
    data = [line[6:] for line in seen if line.startswith("data: ")]
    assert data[-1] == "[DONE]", seen[-3:]
    error = json.loads(data[-2])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("server_error", "aborted") and "shutting down" in error[
        "message"
    ]
    assert all("error" not in json.loads(d) for d in data[:-2])  # the chunks before it are the stream's own
    assert answers and answers[0].status_code == 503, answers
    assert answers[0].json()["error"]["code"] == "aborted"
    assert answers[0].headers["content-type"] == "application/json"
    text = log.read_text()
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text[-3000:]


def test_bodies_no_field_check_sees_are_refused_in_json(server, model):
    """Issue 51: deep JSON (a RecursionError under the body limit), a lone surrogate, an empty content list and
    both token limits at once are each a 400 naming the fault, never a 500; no traceback in the log."""
    import httpx

    deep = '{"model": "m", "prompt": ' + "[" * 1900 + "]" * 1900 + "}"
    answer = httpx.post(
        f"{server.url}/v1/completions",
        content=deep,
        headers={"content-type": "application/json"},
        timeout=TIMEOUT,
    )
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json", answer.text
    surrogate = json.dumps({"model": model, "max_tokens": 2}).replace("}", ', "prompt": "a\\ud800b"}')
    answer = httpx.post(
        f"{server.url}/v1/completions",
        content=surrogate,
        headers={"content-type": "application/json"},
        timeout=TIMEOUT,
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "prompt", answer.text
    assert "lone surrogate" in answer.json()["error"]["message"]
    chat = {"model": model, "messages": [{"role": "user", "content": []}], "max_tokens": 2}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=TIMEOUT)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages[0].content", answer.text
    both = {"model": model, "prompt": "x", "max_tokens": 2, "max_completion_tokens": 3}
    answer = httpx.post(f"{server.url}/v1/completions", json=both, timeout=TIMEOUT)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "max_tokens", answer.text
    assert "Traceback" not in server.log.read_text()


def test_a_client_gone_mid_body_is_answered_499_without_a_traceback(server, model):
    import socket

    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    )
    name = 'depthlens_requests_total{route="/v1/completions",status="499"}'
    before = _metrics(server).get(name, 0.0)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head.encode() + b'{"model": "m", "prompt": "half')
        time.sleep(0.5)
    assert wait_for(lambda: _metrics(server).get(name, 0.0) == before + 1, 10)  # counted as 499, not 500
    text = server.log.read_text()
    assert "Traceback" not in text, text[-3000:]
