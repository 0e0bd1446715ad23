"""Admission and execution: a bounded queue in front of a pool of request threads, cancellation when a client
leaves, and the shutdown that aborts what is still running.

Each admitted request runs on a thread of the pool (``Engine.max_running`` of them: its engine calls block
there while the engine works for everyone). Requests beyond those wait in the pool's queue; past
``max_running + max_queue`` a request is refused at once with 429 and a ``Retry-After`` from the recent request
durations. A request's ``threading.Event`` is set when its client disconnects (or the server stops): the engine
aborts its samples at the next step and its thread ends.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import statistics
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

from starlette.requests import Request

from depthlens.config import ServeConfig
from depthlens.sampling.live import GenerationCancelled
from depthlens.serve.engines import Engine
from depthlens.serve.errors import ApiError, ClientGone
from depthlens.serve.pool import DaemonPool

T = TypeVar("T")


class Runner:
    def __init__(self, engine: Engine, settings: ServeConfig) -> None:
        self.engine = engine
        self.running = min(engine.max_running, settings.max_running)
        self.capacity = self.running + settings.max_queue
        self.pool = DaemonPool(self.running, "depthlens-request")  # daemons: exit never waits for a step
        self.active = 0  # admitted and not yet finished (running + queued); touched on the event loop only
        self.cancels: set[threading.Event] = set()
        self.waiting = 0  # handlers waiting for their request's work (answers not yet decided)
        self._aborted: asyncio.Event | None = None  # set by ``abort``: every waiting handler answers at once
        self._streams: set[asyncio.Queue[dict[str, Any]]] = set()
        self.closing = False
        self.stats: collections.Counter[str] = collections.Counter()
        self.durations: collections.deque[float] = collections.deque(maxlen=64)

    def admit(self) -> threading.Event:
        """A slot for one request, or 429 / 503; returns the request's cancel flag."""
        if self.closing:
            raise ApiError(503, "the server is shutting down; retry on another replica", code="shutting_down")
        if self.engine.health().get("engine") == "failed":
            raise ApiError(
                503, f"the engine failed: {self.engine.health().get('error')}", code="engine_failed"
            )
        if self.active >= self.capacity:
            self.stats["rejected"] += 1
            wait = self.retry_after()
            raise ApiError(
                429,
                f"{self.active} requests running or queued (the server runs {self.running} and queues "
                f"{self.capacity - self.running}); retry in {wait} s",
                code="queue_full",
                headers={"Retry-After": str(wait)},
            )
        self.active += 1
        cancel = threading.Event()
        self.cancels.add(cancel)
        return cancel

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the median recent request time × queued requests per thread."""
        median = statistics.median(self.durations) if self.durations else 1.0
        return max(1, min(60, math.ceil(median * max(1, self.active - self.running) / self.running)))

    def submit(self, work: Callable[[], T], cancel: threading.Event) -> asyncio.Future[T]:
        """Run ``work`` on a request thread; its slot is freed when it ends, whoever waits for it."""
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        future = loop.run_in_executor(self.pool, work)

        def release(done: asyncio.Future[T]) -> None:
            if not done.cancelled():
                done.exception()  # retrieved: a request answered before its thread ended logs no traceback
            self.active -= 1
            self.cancels.discard(cancel)
            self.durations.append(time.monotonic() - began)
            self.stats["cancelled" if cancel.is_set() else "served"] += 1

        future.add_done_callback(release)
        return future

    async def call(self, work: Callable[[], T], cancel: threading.Event, request: Request) -> T:
        """``work``'s result, or ``ClientGone`` once the client disconnected (``cancel`` then set)."""
        future = self.submit(work, cancel)
        gone = asyncio.ensure_future(_disconnected(request))
        aborted = asyncio.ensure_future(self._abort_event().wait())
        self.waiting += 1
        try:
            waits: set[asyncio.Future[Any]] = {future, gone, aborted}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not future.done():
                cancel.set()  # the engine aborts its samples at its next step; the answer does not wait for it
                if aborted.done():
                    raise GenerationCancelled()  # answered now (503 aborted), however long a step takes
                await asyncio.wait({future})
                raise ClientGone()
            return future.result()
        except asyncio.CancelledError:  # the server cancels the handler (its own timeout ran out)
            cancel.set()
            raise
        finally:
            self.waiting -= 1
            gone.cancel()
            aborted.cancel()

    def _abort_event(self) -> asyncio.Event:
        if self._aborted is None:
            self._aborted = asyncio.Event()
        return self._aborted

    def stream(
        self, work: Callable[[Callable[[dict[str, Any]], None]], T], cancel: threading.Event
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Start ``work(push)`` on a request thread now; the iterator returned yields what it pushes, then
        ``{"type": "done", "outcome": ...}`` (or ``{"type": "error", "error": exc}``). Closing the iterator early
        (a client that left) cancels the work. Started here, not on first iteration, so its slot is freed even if
        the response is never sent."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def push(event: dict[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the loop has closed (shutdown): nobody is listening any more
                cancel.set()

        def run() -> None:
            try:
                push({"type": "done", "outcome": work(push)})
            except BaseException as exc:  # handed to the stream, which answers with an error event
                push({"type": "error", "error": exc})

        self.submit(run, cancel)
        self._streams.add(
            queue
        )  # now, not on first iteration: an abort before the response starts reaches it
        return self._drain(queue, cancel)

    def busy(self) -> bool:
        """Whether a handler still waits for its request's answer (a shutdown drains until none does)."""
        return bool(self.waiting or self._streams)

    async def _drain(
        self, queue: asyncio.Queue[dict[str, Any]], cancel: threading.Event
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events of one stream until its last; ``abort`` puts an aborted error event in its queue, so the
        stream ends with it (then ``[DONE]``) at once, not at the engine's next step."""
        ended = False
        self.waiting += 1
        try:
            while not ended:
                event = await queue.get()
                ended = event["type"] in ("done", "error")
                yield event
        finally:
            self._streams.discard(queue)
            self.waiting -= 1
            if not ended:
                cancel.set()  # the client left mid-stream (or the server cancelled the handler)

    def health(self) -> dict[str, Any]:
        return {
            "active": self.active,
            "running_limit": self.running,
            "capacity": self.capacity,
            **self.stats,
            **self.engine.health(),
        }

    def abort(self) -> None:
        """Abort every request still running or queued (the shutdown's grace period is over): each ends as an
        aborted request does (``GenerationCancelled``: a 503, or a stream's error event) at its engine's next
        step. New requests are refused from now on."""
        self.closing = True
        for cancel in list(self.cancels):
            cancel.set()
        with contextlib.suppress(RuntimeError):  # called off the event loop (no loop): nobody waits to answer
            asyncio.get_running_loop()
            self._abort_event().set()
            for queue in list(self._streams):
                queue.put_nowait({"type": "error", "error": GenerationCancelled()})

    def close(self) -> None:
        """Abort every request still running, stop the engine; the request threads end at their engine's next
        step, or are abandoned when the process exits (daemons, not waited for: the shutdown's time must not
        depend on how long a step takes)."""
        self.abort()
        self.engine.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


async def _disconnected(request: Request) -> None:
    """Returns once the client has disconnected."""
    while not await request.is_disconnected():
        await asyncio.sleep(0.2)
