"""A Python verb's store when the caller names none (``out=None``): a temporary directory the verb reads back and
removes however the call ends — returned, raised, interrupted (KeyboardInterrupt) or terminated (SIGTERM) — as
docs/python.md promises; a store the caller named is kept, whole or as far as it got.

A process killed outright (kill -9, the out-of-memory killer) runs no ``finally``, so its directory stays behind.
Each directory is named ``depthlens-scratch-…`` and holds its verb's write lock (``stores.lock``: the pid and
host in its note) while the verb runs; every verb's call first removes those whose writer is gone
(``remove_abandoned``) — only such directories, holding nothing but that lock and the store, never anything
else in the temporary folder, and never one whose writer still runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from depthlens.stores.lock import LOCK, abandoned, store_lock

PREFIX = "depthlens-scratch-"
STORE = "store"  # the verb's store, inside the directory


@contextlib.contextmanager
def scratch_or(out: str | Path | None, verb: str = "a verb") -> Iterator[Path]:
    """Where a verb's store goes: ``out`` (replaced, and kept however the call ends), or a temporary directory
    holding the verb's lock (its note naming ``depthlens.<verb>``), removed when the call ends — returned, raised,
    interrupted (KeyboardInterrupt) or terminated (SIGTERM, as a job scheduler or ``timeout`` sends it:
    ``terminated_raises``)."""
    if out is not None:
        yield Path(out)
        return
    with (
        terminated_raises(),
        tempfile.TemporaryDirectory(prefix=PREFIX, ignore_cleanup_errors=True) as scratch,
        store_lock(Path(scratch), f"depthlens.{verb}"),  # released before the directory goes
    ):
        yield Path(scratch) / STORE


def remove_abandoned(folder: str | Path | None = None) -> list[Path]:
    """Remove the scratch directories in ``folder`` (None: the temporary folder) whose verb was killed before it
    could remove its own (``stores.lock.abandoned``); the ones removed. A directory is one only by its name, its
    owner (this user) and its contents (the lock, and the store): anything else there is left as it is."""
    where = Path(folder) if folder is not None else Path(tempfile.gettempdir())
    try:
        entries = [e for e in os.scandir(where) if e.name.startswith(PREFIX)]
    except OSError:
        return []
    removed = []
    for entry in entries:
        path = Path(entry.path)
        if _ours(entry) and abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _ours(entry: os.DirEntry[str]) -> bool:
    """A directory (not a link) of this user holding a lock file and at most the store beside it."""
    try:
        if not entry.is_dir(follow_symlinks=False):
            return False
        if hasattr(os, "getuid") and entry.stat(follow_symlinks=False).st_uid != os.getuid():
            return False
        names = set(os.listdir(entry.path))
    except OSError:
        return False
    return LOCK in names and names <= {LOCK, STORE}


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
