"""Issue 51, the server under SIGTERM: it keeps its socket open and answers 503 ``shutting_down`` while the running
requests drain; past ``--shutdown-grace`` each request still running is answered at once in JSON (503
``aborted``), each stream with an error event then ``[DONE]`` — within a bound that does not depend on how long a
step takes (the sampler is slowed on purpose here) — the process is gone within a bound too, while the step still
sleeps, and the log holds no traceback."""

from __future__ import annotations

import importlib.util
import json
import threading
import time

import pytest

from depthlens.serve.engines import STEP_DELAY, STEP_TORCH
from tests.serving import save_tiny_chat, serving, wait_for

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "httpx")),
    reason="needs the serve extra",
)
TIMEOUT = 120
SLOW_STEP = 30.0  # s per generation step: far longer than the whole bound the answers and the exit must meet
BOUND = 4.0  # s from SIGTERM + grace to every answer
EXIT_BOUND = 12.0  # s from SIGTERM + grace to the process gone (the answers, then the interpreter's own exit)
TORCH_STEP = 2.0  # s of work inside torch per generation step: SIGTERM finds the running request in torch


def test_sigterm_answers_in_json_without_waiting_for_a_slow_step(tmp_path_factory, tmp_path, monkeypatch):
    import httpx

    model_dir = save_tiny_chat(tmp_path_factory.mktemp("serve-model"))
    monkeypatch.setenv(STEP_DELAY, str(SLOW_STEP))
    grace = 1.0
    args = ["--model", str(model_dir), "--backend", "hf", "--device", "cpu", "--shutdown-grace", str(grace)]
    log = tmp_path / "server.log"
    with serving(args, log) as server:
        body = {"model": str(model_dir), "prompt": "x", "max_tokens": 50}
        seen: list[str] = []
        answers: list[tuple[float, httpx.Response]] = []

        def read() -> None:
            try:
                with httpx.stream(
                    "POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=TIMEOUT
                ) as response:
                    for line in response.iter_lines():
                        seen.append(line)
            except httpx.HTTPError as exc:
                seen.append(f"closed: {type(exc).__name__}")
            seen.append(f"ended at {time.monotonic()}")

        def post() -> None:
            answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT)
            answers.append((time.monotonic(), answer))

        streaming, waiting = threading.Thread(target=read), threading.Thread(target=post)
        streaming.start()
        waiting.start()
        assert wait_for(lambda: server.health()["active"] == 2, 60)
        began = time.monotonic()
        server.proc.send_signal(15)
        time.sleep(0.3)
        late = httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT)  # while it drains
        streaming.join(TIMEOUT)
        waiting.join(TIMEOUT)
        code = server.proc.wait(60)
        exited = time.monotonic() - began
    assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down", late.text
    (answered, answer), ended = answers[0], float(seen[-1].split()[-1])
    assert answer.status_code == 503 and answer.headers["content-type"] == "application/json"
    assert answer.json()["error"]["code"] == "aborted"
    assert answered - began < grace + BOUND and ended - began < grace + BOUND, (
        answered - began,
        ended - began,
    )
    data = [line[6:] for line in seen if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "aborted", seen[-4:]
    # gone while the step in flight still sleeps: its thread is abandoned, not waited for
    assert code == 0 and exited < grace + EXIT_BOUND < SLOW_STEP, exited
    text = log.read_text()
    assert "Traceback" not in text and "CancelledError" not in text, text[-3000:]


def test_sigterm_with_three_generations_in_flight_exits_0(tmp_path_factory, tmp_path, monkeypatch):
    """Issue 59, item 5: three generations in flight — one running, inside a torch step, two queued; one of them
    streams — and SIGTERM: each answered (503 ``aborted``, the stream's error event then ``[DONE]``), then exit 0,
    not 134 ("terminate called without an active exception": the interpreter's exit killing the request thread
    inside torch, after every answer had gone out). The thread ends its step first (``serve.server.finish``)."""
    import httpx

    model_dir = save_tiny_chat(tmp_path_factory.mktemp("serve-model-3"))
    monkeypatch.setenv(STEP_TORCH, str(TORCH_STEP))
    grace = 0.5
    args = ["--model", str(model_dir), "--backend", "hf", "--device", "cpu", "--shutdown-grace", str(grace)]
    log = tmp_path / "server.log"
    with serving(args, log) as server:
        body = {"model": str(model_dir), "prompt": "x", "max_tokens": 50}
        answers: list[httpx.Response] = []
        seen: list[str] = []

        def post() -> None:
            answers.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT))

        def read() -> None:
            with httpx.stream(
                "POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=TIMEOUT
            ) as response:
                seen.extend(response.iter_lines())

        clients = [
            threading.Thread(target=post),
            threading.Thread(target=read),
            threading.Thread(target=post),
        ]
        for client in clients:
            client.start()
        assert wait_for(lambda: server.health()["active"] == 3, 60)
        began = time.monotonic()
        server.proc.send_signal(15)
        for client in clients:
            client.join(TIMEOUT)
        code = server.proc.wait(60)
        exited = time.monotonic() - began
    text = log.read_text()
    assert code == 0, (code, text[-2000:])
    assert [a.status_code for a in answers] == [503, 503] and all(
        a.json()["error"]["code"] == "aborted" for a in answers
    )
    data = [line[6:] for line in seen if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "aborted", seen[-4:]
    assert exited < grace + TORCH_STEP + EXIT_BOUND, exited
    assert "terminate called" not in text and "Traceback" not in text, text[-3000:]
