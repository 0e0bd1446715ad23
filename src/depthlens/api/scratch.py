"""A Python verb's store when the caller names none (``out=None``): a temporary directory the verb reads back and
removes however the call ends — returned, raised, interrupted (KeyboardInterrupt) or terminated (SIGTERM) — as
docs/python.md promises; a store the caller named is kept, whole or as far as it got."""

from __future__ import annotations

import contextlib
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def scratch_or(out: str | Path | None) -> Iterator[Path]:
    """Where a verb's store goes: ``out`` (replaced, and kept however the call ends), or a temporary directory
    removed when the call ends — returned, raised, interrupted (KeyboardInterrupt) or terminated (SIGTERM, as a
    job scheduler or ``timeout`` sends it: ``terminated_raises``)."""
    if out is not None:
        yield Path(out)
        return
    with (
        terminated_raises(),
        tempfile.TemporaryDirectory(prefix="depthlens-", ignore_cleanup_errors=True) as scratch,
    ):
        yield Path(scratch) / "store"


class Terminated(SystemExit):
    """SIGTERM during a verb that writes a temporary store: raised so the store is removed on the way out, then
    the process ends as it would have (a SystemExit: exit status 128 + SIGTERM)."""


@contextlib.contextmanager
def terminated_raises() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` for the call's duration, where Python's default would end the process with
    no ``finally`` run; a handler the caller installed, or a call off the main thread, is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminate(signum: int, _frame: object) -> None:
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
