"""``GET /metrics``: the server's counters in Prometheus's text format (``prometheus-client``), as vLLM users
scrape theirs — requests by route and status, their latency, prompt / generated / read-out tokens, the samples
the engine aborted, requests running and waiting.

Each app has its own registry (tests start several apps in one process). Requests and latency are taken by an
ASGI middleware around every route (a stream's latency runs to its last byte); tokens when a request's outcome is
known; the gauges and the engine's aborted samples are read at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from depthlens.serve.runner import Runner

# No ``*_created`` series beside each counter and histogram: a scraper reads process start from its own
# ``process_start_time_seconds``, and one timestamp per label set doubled the page (prometheus-client's switch).
disable_created_metrics()

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)  # s: a CPU request takes seconds to minutes


class _Engine(Collector):
    """The engine's own counters, read at scrape time."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def collect(self) -> Iterator[CounterMetricFamily]:
        aborted = CounterMetricFamily(
            "depthlens_aborted_samples",
            "Samples the engine stopped before their end (rejected at ℓ, stopped by a policy or a stop string; "
            "on vLLM also those of a cancelled request)",
        )
        aborted.add_metric([], float(self.runner.engine.health().get("aborted", 0)))
        yield aborted


class Metrics:
    """The server's metrics in their own registry."""

    def __init__(self, runner: Runner) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "depthlens_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "depthlens_request_duration_seconds",
            "Time from a request's arrival to its response's last byte",
            ["route"],
            buckets=BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "depthlens_prompt_tokens", "Prompt tokens of served requests", registry=r
        )
        self.generation_tokens = Counter(
            "depthlens_generation_tokens",
            "Tokens generated for served requests (rejected and stopped samples included)",
            registry=r,
        )
        self.readout_tokens = Counter(
            "depthlens_readout_tokens", "Tokens read out at every layer (their depth measured)", registry=r
        )
        running = Gauge("depthlens_requests_running", "Requests running on the engine", registry=r)
        running.set_function(lambda: min(runner.active, runner.running))
        waiting = Gauge("depthlens_requests_waiting", "Requests admitted and waiting for a slot", registry=r)
        waiting.set_function(lambda: max(0, runner.active - runner.running))
        r.register(_Engine(runner))

    def served(self, prompt: int, generated: int, readout: int) -> None:
        """Count one finished request's tokens."""
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)
        self.readout_tokens.inc(readout)

    def response(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class Measured:
    """ASGI middleware: each HTTP request's status and latency into ``metrics`` (unknown routes as ``other``)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in ROUTES else "/v1/models" if path.startswith("/v1/models/") else "other"
        began = time.monotonic()
        status: list[Any] = [500]  # what an exception that escapes every handler ends as

        async def sent(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            self.metrics.requests.labels(route, str(status[0])).inc()
            self.metrics.latency.labels(route).observe(time.monotonic() - began)
