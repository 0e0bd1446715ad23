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
import logging
import os
import socket
import sys
from typing import Any

import uvicorn

from depthlens.serve.runner import Runner

ANSWER_MARGIN = 10  # s uvicorn waits past the grace period for the aborted requests' answers to go out
STEP_WAIT = (
    5.0  # s the request threads get, once every client is answered, to end the engine step they are in
)
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


def finish(runner: Runner, timeout: float = STEP_WAIT) -> None:
    """After the server has stopped (every client answered, the engine closed): let each request thread end the
    engine step it is in — cancelled, it then returns — so that the interpreter exits with none inside torch.

    A daemon thread still in a torch call when the interpreter exits is killed there: CPython 3.11 ends it with
    ``pthread_exit`` as it takes the GIL back, whose unwinding through torch's C++ frames calls ``std::terminate``
    ("terminate called without an active exception", SIGABRT, exit 134, after every answer had gone out). A step
    that does not end within ``timeout`` (a step that never returns) cannot be waited for: the process then leaves
    at once with ``os._exit(0)``, its output flushed, without the interpreter's exit."""
    if not runner.pool.closed:  # the app's lifespan did not close it (it never started)
        runner.close()
    if runner.pool.join(timeout):
        return
    logging.getLogger("depthlens.serve").warning(
        "a request thread is still inside an engine step %.0f s after the shutdown; exiting without it",
        timeout,
    )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
