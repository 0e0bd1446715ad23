"""uvicorn's server with the shutdown docs/serve.md promises.

On SIGTERM (or Ctrl-C) uvicorn stops accepting connections and waits for the running requests; past its
``timeout_graceful_shutdown`` it cancels their handlers, which answers a plain-text 500 (a traceback in the log)
or cuts a started stream without ``[DONE]``. So the server aborts them itself first: once ``--shutdown-grace``
has run out, every running request's samples are aborted in the engine (``Runner.abort``) and each request
answers as any aborted request does — an OpenAI-shaped 503, or a started stream's error event then ``[DONE]`` —
while uvicorn waits ``ANSWER_MARGIN`` seconds more for those answers to go out.
"""

from __future__ import annotations

import asyncio
import math
import socket
from typing import Any

import uvicorn

from depthlens.serve.runner import Runner

ANSWER_MARGIN = 10  # s uvicorn waits past the grace period for the aborted requests' answers


class GracefulServer(uvicorn.Server):
    """``uvicorn.Server`` that aborts ``runner``'s requests ``grace`` seconds into its shutdown."""

    def __init__(self, config: uvicorn.Config, runner: Runner, grace: float) -> None:
        super().__init__(config)
        self.runner = runner
        self.grace = grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.runner.closing = True  # a request that still arrives gets 503; /health says unavailable
        timer = asyncio.get_running_loop().call_later(self.grace, self.runner.abort)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def make_server(app: Any, host: str, port: int, log_level: str, grace: float) -> uvicorn.Server:
    """The server for ``app`` (``serve.app.create_app``) on ``host:port``; ``grace``: ``--shutdown-grace``."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=math.ceil(grace) + ANSWER_MARGIN,
    )
    return GracefulServer(config, app.state.server.runner, grace)
