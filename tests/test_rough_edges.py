"""The first hour's rough edges (issue 52, item 6) outside the figures and the lens fit (tests/test_lens.py,
tests/test_python_ergonomics.py): /metrics without ``_created`` series, and a vLLM start that says what it takes."""

from __future__ import annotations

import threading
import time
import types

import pytest


def test_metrics_have_no_created_series():
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    from depthlens.serve.metrics import Metrics

    engine = types.SimpleNamespace(health=lambda: {"aborted": 0})
    metrics = Metrics(types.SimpleNamespace(active=0, running=0, engine=engine))
    metrics.served(3, 5, 5)
    metrics.requests.labels("/v1/completions", "200").inc()
    metrics.latency.labels("/v1/completions").observe(0.2)
    page = generate_latest(metrics.registry).decode()
    assert "depthlens_prompt_tokens_total 3.0" in page
    assert 'depthlens_requests_total{route="/v1/completions",status="200"} 1.0' in page
    assert "_created" not in page


def test_the_vllm_start_line_says_it_grows_with_load():
    from depthlens.sampling.vllm.engine import start_line

    line = start_line("m", on_gpu=False)
    assert "about 30 s on an idle CPU, many times that on a busy one" in line and "load now " in line
    assert "~30 s on a CPU" not in start_line("m", on_gpu=True)


def test_a_slow_start_reports_its_elapsed_time():
    from depthlens.sampling.vllm.engine import elapsed_lines

    lines: list[str] = []
    said = threading.Event()

    def progress(line: str) -> None:
        lines.append(line)
        said.set()

    with elapsed_lines(progress, "still starting", every=0.01):
        assert said.wait(5)
    count = len(lines)
    assert lines[0].startswith("still starting: ") and lines[0].endswith(" s so far")
    time.sleep(0.05)
    assert len(lines) == count  # nothing after the block ends
