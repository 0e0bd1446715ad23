"""The request threads: a fixed pool of daemon threads.

``concurrent.futures.ThreadPoolExecutor`` would do, but its threads are joined when the interpreter exits (its
``atexit`` hook waits for each one's current call, whatever ``shutdown(wait=False)`` said): a served request whose
engine step takes a minute would hold the process a minute after SIGTERM, its answer long sent. Here the server
waits for them a bounded time instead (``join``; ``serve.server.finish``): a cancelled request's thread ends at
its engine's next step, and one that does not end in time is not left to the interpreter's exit (which would kill
it inside the step: see ``serve.server.finish``), so the process ends within a bound that does not depend on how
long a step takes.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonPool(Executor):
    """``workers`` daemon threads named ``{name}_{i}`` running the calls submitted, in order of submission."""

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: Future[T] = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited (``shutdown(cancel_futures=True)``)
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # the caller's to see, as ThreadPoolExecutor hands it on
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more calls; ``cancel_futures``: those still queued are cancelled; ``wait``: join the threads (each
        ends after its current call). Not waiting, a thread still in a call is abandoned when the process exits."""
        self._closed = True
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds in all for every thread to end (after ``shutdown``, each ends once its
        current call returns); whether all did."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    @property
    def closed(self) -> bool:
        return self._closed
