"""One writer per store: an advisory lock (``fcntl.flock``) held by every command that writes a store.

The lock file sits inside a Parquet store (``_depthlens.lock``, a name Parquet readers skip) or beside a JSONL
store (``.<name>.lock``). The holder writes its pid, host and command into it, so a second writer is refused
naming them. The kernel releases the lock when its holder dies (kill -9 included), so a lock never outlives its
run; the note stays where the holder died (a clean release empties it), which is how a folder left by a killed
writer is told (``abandoned``: a Python verb's scratch store, ``api.scratch``). Readers take no lock: they read
the last committed state (see ``stores.layout``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from depthlens.errors import StoreError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks here; writers are not excluded (docs/reliability.md)
    fcntl = None  # type: ignore[assignment]  # the module is absent: `fcntl is None` says so below

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


def _note(command: str | None) -> str:
    """What the holder writes into its lock: ``pid 123 on host (depthlens generate …)``."""
    said = command or " ".join(["depthlens", *sys.argv[1:]])
    return f"pid {os.getpid()} on {socket.gethostname()} ({said[:300]})\n"


def _acquire(store: Path, path: Path, command: str | None = None) -> int:
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
        os.write(fd, _note(command).encode())
    return fd


@contextlib.contextmanager
def store_lock(store: Path, command: str | None = None) -> Iterator[None]:
    """Hold the write lock of ``store`` (created where missing) for the block; re-entrant within a process.
    ``command``: what the lock's note says holds it (None: the command line, ``depthlens …``).

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
    fd = _acquire(store, path, command)
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


_NOTE = re.compile(r"pid (\d+) on (\S+) \(")


def abandoned(store: Path) -> bool:
    """Whether ``store``'s writer died holding its lock: the lock's note names a process of this host (a clean
    release empties the note) that no longer runs, and no process holds the lock. False wherever that cannot be
    told — no lock file or note, another host's writer (a lock taken there is not seen here), no ``flock``."""
    path = lock_path(store)
    if fcntl is None or path.is_symlink() or path.resolve() in _held:
        return False
    found = _NOTE.match(holder(store))
    if found is None or found.group(2) != socket.gethostname():
        return False
    try:
        os.kill(int(found.group(1)), 0)
    except ProcessLookupError:
        pass  # gone: the lock's kernel side says the rest
    except OSError:  # alive, another user's
        return False
    else:
        return False  # that pid runs (itself, or a process that took its number since: left alone)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held after all
    finally:
        os.close(fd)  # closing drops a lock taken here
    return True
