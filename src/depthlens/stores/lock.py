"""One writer per store: an advisory lock (``fcntl.flock``) held by every command that writes a store.

The lock file sits inside a Parquet store (``_depthlens.lock``, a name Parquet readers skip) or beside a JSONL
store (``.<name>.lock``). The holder writes its pid and command into it, so a second writer is refused naming
them. The kernel releases the lock when its holder dies (kill -9 included), so a lock never outlives its run.
Readers take no lock: they read the last committed state (see ``stores.layout``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from depthlens.errors import StoreError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks here; writers are not excluded (docs/reliability.md)
    fcntl = None  # type: ignore[assignment]

LOCK = "_depthlens.lock"
_held: dict[Path, tuple[int, int]] = {}  # lock file → (fd, depth): a process re-enters its own lock


def lock_path(store: Path) -> Path:
    """The lock file of ``store``: inside a store directory, beside a store file."""
    if store.is_dir() or (not store.suffix and not store.is_file()):
        return store / LOCK
    return store.with_name(f".{store.name}.lock")


def holder(store: Path) -> str:
    """Who holds the lock of ``store`` as its holder wrote it (``pid 123 (depthlens generate …)``), or ''."""
    try:
        return lock_path(store).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _acquire(store: Path, path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        who = holder(store)
        raise StoreError(
            f"{store} is being written by another command ({who or 'pid unknown'}); wait for it to finish, or "
            "stop it — one writer at a time keeps the store whole"
        ) from None
    with contextlib.suppress(
        OSError
    ):  # a full disk: the lock holds without its note (the kernel knows the holder)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} ({' '.join(['depthlens', *sys.argv[1:]])[:300]})\n".encode())
    return fd


@contextlib.contextmanager
def store_lock(store: Path) -> Iterator[None]:
    """Hold the write lock of ``store`` (created where missing) for the block; re-entrant within a process.

    Raises StoreError naming the holder when another process writes the store.
    """
    path = lock_path(store).resolve()
    if path in _held:
        fd, depth = _held[path]
        _held[path] = (fd, depth + 1)
        try:
            yield
        finally:
            _held[path] = (fd, _held[path][1] - 1)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(store, path)
    _held[path] = (fd, 1)
    try:
        yield
    finally:
        if _held[path][1] == 1:
            del _held[path]
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            if (
                not store.exists()
            ):  # the command failed before writing anything: leave no lock of nothing behind
                path.unlink(missing_ok=True)
            os.close(fd)  # releases the lock; the file stays (removing it would race with a waiting writer)
        else:
            _held[path] = (fd, _held[path][1] - 1)


def writer(store: Path) -> str | None:
    """Who is writing ``store`` now (``pid 123 (depthlens generate …)``), or None when no command holds its lock.

    Asked of the kernel (a non-blocking ``flock`` taken and dropped at once), not of the lock file's text, which a
    writer killed with -9 leaves behind. A lock this process holds is not another writer's."""
    path = lock_path(store)
    if fcntl is None or not path.exists() or path.resolve() in _held:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return holder(store) or "pid unknown"
    finally:
        os.close(fd)  # closing drops a lock taken here
    return None
