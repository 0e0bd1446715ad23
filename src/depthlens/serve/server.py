"""uvicorn's server with the shutdown docs/serve.md promises.

uvicorn alone, on SIGTERM (or Ctrl-C), closes its socket at once (a request a second later is refused at the
socket) and past its ``timeout_graceful_shutdown`` cancels the handlers still running (a plain-text 500, a stream
cut without ``[DONE]``, CancelledError tracebacks). So the server drains first: the socket stays open and a new
request gets an OpenAI-shaped 503 ``shutting_down``; the running requests get ``--shutdown-grace`` seconds to
finish; then every request still waiting is answered at once (``Runner.abort``: 503 ``aborted``, or a started
stream's error event then ``[DONE]``) without waiting for its engine's step, and uvicorn closes the connections.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

from depthlens.serve.runner import Runner

ANSWER_MARGIN = 10  # s uvicorn waits past the grace period for the aborted requests' answers to go out
_POLL = 0.05  # s between looks at the requests still running while they drain


class GracefulServer(uvicorn.Server):
    """``uvicorn.Server`` that aborts ``runner``'s requests ``grace`` seconds into its shutdown."""

    def __init__(self, config: uvicorn.Config, runner: Runner, grace: float) -> None:
        super().__init__(config)
        self.runner = runner
        self.grace = grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Drain, then abort, then uvicorn's own shutdown: the socket stays open while the running requests
        drain (a new one gets 503 ``shutting_down``, /health says unavailable); past ``grace`` every request
        still waiting is answered at once (``Runner.abort``: 503 ``aborted``, or a stream's error event then
        ``[DONE]``), however long its engine's step takes; uvicorn then closes the connections."""
        loop = asyncio.get_running_loop()
        self.runner.closing = True
        end = loop.time() + self.grace
        while self.runner.busy() and loop.time() < end and not self.force_exit:
            await asyncio.sleep(_POLL)
        self.runner.abort()
        self.config.timeout_graceful_shutdown = ANSWER_MARGIN  # the grace is spent: only the answers remain
        await super().shutdown(sockets)


def make_server(app: Any, host: str, port: int, log_level: str, grace: float) -> uvicorn.Server:
    """The server for ``app`` (``serve.app.create_app``) on ``host:port``; ``grace``: ``--shutdown-grace``."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=ANSWER_MARGIN,  # counted from the end of the drain (``shutdown``)
    )
    return GracefulServer(config, app.state.server.runner, grace)
