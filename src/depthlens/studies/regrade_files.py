"""A regrade's writes, each whole or not at all: a JSONL store's responses and manifest replaced together
(``write_together``), and a store copied for ``regrade --out`` (``copy_store``); a failure (a full disk) leaves the
store as it was and says so."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from depthlens.errors import StoreError
from depthlens.stores.files import WriteFailed
from depthlens.stores.lock import LOCK


def write_together(files: dict[Path, list[str]], store: Path) -> None:
    """Replace each of ``files`` (path → its lines) whole, all or none: each written to a temporary file beside it
    and fsynced, then all renamed over theirs (a JSONL store's responses and manifest). A write that fails (a
    full disk) removes every temporary file and leaves the store as it was."""
    staged: dict[Path, Path] = {}
    try:
        for path, lines in files.items():
            tmp = staged[path] = path.with_name(f".{path.name}.regrade-tmp")
            with tmp.open("w", encoding="utf-8") as f:
                f.writelines(lines)
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        raise WriteFailed(
            Path(exc.filename or next(reversed(staged))), exc, not_committed(store, exc)
        ) from None
    renamed = 0
    try:
        for path, tmp in staged.items():
            os.replace(tmp, path)
            renamed += 1
    except OSError as exc:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        if renamed == 0:
            raise WriteFailed(Path(exc.filename or store), exc, not_committed(store, exc)) from None
        raise WriteFailed(
            Path(exc.filename or store),
            exc,
            f"the regraded responses are in place but the manifest beside them is the one before; "
            f"`depthlens check {store}` names it — run regrade again once the disk has room",
        ) from None
    finally:
        directory = os.open(store, os.O_RDONLY)
        try:
            os.fsync(directory)  # the renames themselves survive a power cut
        finally:
            os.close(directory)


def not_committed(store: Path, exc: OSError) -> str:
    """The remedy of a regrade whose write failed before its commit: the store is as it was."""
    remedy = "free some space" if exc.errno == errno.ENOSPC else "check the path and its permissions"
    return (
        f"the regrade was not committed and its temporary files were removed: {store} is as it was — {remedy}, "
        "then run regrade again"
    )


def copy_store(store: Path, out: Path) -> None:
    """Copy the store's files (not its locks nor a regrade's temporary files) to ``out``, stopping at the first
    that fails (a full disk): ``out`` is then removed whole, named with the file that could not be written."""
    skip = shutil.ignore_patterns(LOCK, ".*.lock", ".*.regrade-tmp")
    try:
        shutil.copytree(store, out, ignore=skip, copy_function=_copy_file)
    except (OSError, shutil.Error, _CopyFailed) as exc:
        shutil.rmtree(out, ignore_errors=True)
        cause = exc.args[0] if isinstance(exc, _CopyFailed) else exc
        where = Path(cause.filename or out) if isinstance(cause, OSError) else out
        if not isinstance(cause, OSError):
            raise StoreError(f"{out}: could not copy {store} ({exc}); the copy was removed") from None
        raise WriteFailed(
            where,
            cause,
            f"the copy {out} was removed and {store} is as it was — "
            f"{'free some space' if cause.errno == errno.ENOSPC else 'check the path and its permissions'}, then "
            "run the same regrade again",
        ) from None


class _CopyFailed(Exception):
    """The first file ``copytree`` could not copy (it would go on with the rest and report them as a list)."""


def _copy_file(src: str, dst: str) -> object:
    """``shutil.copy2``, its first failure raised as ``_CopyFailed`` naming the file (``copytree`` would go on)."""
    try:
        return shutil.copy2(src, dst)
    except OSError as exc:
        if exc.filename is None:
            exc.filename = dst
        raise _CopyFailed(exc) from None
