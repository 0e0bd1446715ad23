"""Issue 52's server edges, on a real `depthlens serve` (transformers backend, tiny chat model): a client that leaves
mid-Think@n has its samples aborted with nothing in the server's log but the request line — no "Future exception
was never retrieved … GenerationCancelled" — and a request's ``readout_tokens: "all"`` is echoed as "all"."""

from __future__ import annotations

import importlib.util

import pytest

from depthlens.serve.engines import STEP_DELAY
from tests.serving import save_tiny_chat, serving, wait_for

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "httpx")),
    reason="needs the serve extra and httpx",
)
TIMEOUT = 120  # s per client call: generous for a loaded 2-core machine, bounded
WINDOW = 8  # the server's --readout-tokens: a request's own window differs from it


STEP_S = (
    0.02  # each step slowed (the server's fault hook): a Think@n of 200 tokens outlasts the client's 0.5 s
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """On a quiet machine the tiny model's Think@n ends in 0.3 s, before the client would hang up: every step is
    slowed by ``STEP_S``, so the hang-up lands mid-run however fast the machine is."""
    model = save_tiny_chat(tmp_path_factory.mktemp("serve-model"))
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    args = ["--model", str(model), "--backend", "hf", "--device", "cpu", "--max-tokens", "200"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STEP_DELAY, str(STEP_S))
        with serving([*args, "--readout-tokens", str(WINDOW)], log) as process:
            process.model = str(model)
            yield process


@pytest.mark.parametrize(("asked", "echoed"), [("all", "all"), (5, 5), (None, WINDOW)])
def test_the_readout_window_is_echoed_as_asked(server, asked, echoed):
    import httpx

    depthlens = (
        {"prefix": 2} if asked is None else {"prefix": 2, "readout_tokens": asked}
    )  # a window ≥ prefix
    body = {"model": server.model, "prompt": "1+2=", "max_tokens": 12, "seed": 1, "depthlens": depthlens}
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT).json()
    assert reply["depthlens"]["readout_tokens"] == echoed, reply["depthlens"]
    read = reply["choices"][0]["depthlens"]["readout_tokens"]  # how many this sample's were
    assert read == (reply["usage"]["completion_tokens"] if asked == "all" else min(echoed, 12))


THINK = {"think": {"n": 16, "eta": 0.5, "prefix": 150}, "answer_type": "string"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_client_gone_mid_think_at_n_leaves_no_traceback(server, stream):
    """The client hangs up while 16 samples of up to 200 tokens run (seconds on the tiny model): the request is
    cancelled (/health's ``cancelled``), its thread ends, and the log holds no traceback of the cancellation."""
    import httpx

    before, logged = server.health().get("cancelled", 0), len(server.log.read_text())
    body = {"model": server.model, "prompt": "go", "max_tokens": 200, "seed": 3, "depthlens": THINK}
    if stream:
        body["stream"] = True
    timeout = httpx.Timeout(30, read=0.5)  # the client gives up half a second in, closing its connection
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=timeout) as response,
    ):
        for _ in response.iter_lines():
            pass
    assert wait_for(
        lambda: server.health()["active"] == 0 and server.health().get("cancelled", 0) == before + 1, 60
    ), server.health()
    text = server.log.read_text()[logged:]  # this request's lines
    assert "never retrieved" not in text and "Traceback" not in text, text[-3000:]
