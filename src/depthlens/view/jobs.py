"""The explorer's background work: one daemon thread computing what a page asked for, most urgent first.

Voting over a large store takes seconds to minutes (every method over every trial's draw, pure Python), so the
API never waits for it: ``later`` answers from the cache, or queues the work and answers None (the page polls).
One thread does it all, so two votes never compete for the GIL with each other or with a page being served more
than one thread's worth; work for settings the page no longer shows is dropped before it starts.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Hashable
from typing import Any

from depthlens.stores.shortfall import quiet


class Background:
    """Results by key, computed one at a time on a daemon thread (a daemon: it never holds up a stop)."""

    def __init__(self, keep: int = 16) -> None:
        self._cache: dict[Hashable, Any] = {}
        self._queued: set[Hashable] = set()
        self._jobs: queue.PriorityQueue[tuple[int, int, Hashable, Hashable, Callable[[], Any]]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._wanted: Hashable = None
        self._lock = threading.Lock()
        self._keep = keep
        self._thread: threading.Thread | None = None

    def later(self, key: Hashable, group: Hashable, priority: int, compute: Callable[[], Any]) -> Any:
        """``compute()``'s result for ``key`` if done, else None after queueing it (lower ``priority`` first).
        ``group`` names the settings the page shows now: queued work of any other group is dropped."""
        with self._lock:
            self._wanted = group
            if key in self._cache:
                return self._cache[key]
            if key not in self._queued:
                self._queued.add(key)
                self._jobs.put((priority, next(self._order), key, group, compute))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._work, name="view-background", daemon=True)
                    self._thread.start()
        return None

    def _work(self) -> None:
        while True:
            _, _, key, group, compute = self._jobs.get()
            with self._lock:
                if group != self._wanted:  # the page moved on; asking again queues it again
                    self._queued.discard(key)
                    continue
            with quiet():  # a store's shortfall is the page's own notice, not a warning on stderr
                result = compute()
            with self._lock:
                if len(self._cache) >= self._keep:
                    self._cache.clear()
                self._cache[key] = result
                self._queued.discard(key)
