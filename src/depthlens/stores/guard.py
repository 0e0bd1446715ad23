"""A run that fails before its first record leaves no ``--out`` behind: an empty store left by a failed pre-flight
(a Ray cluster that does not answer, a model that does not load) would block the rerun and later read as
damaged. What holds a committed record is never removed."""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from depthlens.errors import InputError, named
from depthlens.stores.files import WriteFailed, manifest_path
from depthlens.stores.lock import lock_path


def committed(store: Path) -> bool:
    """Whether the results store ``store`` (a Parquet directory or a JSONL file) holds a committed record."""
    if store.is_dir():
        from depthlens.stores.layout import manifest_file  # pyarrow: only once there is a store to look at

        try:
            return bool(json.loads(manifest_file(store).read_bytes()).get("shards"))
        except (OSError, ValueError, AttributeError):
            return any(p.suffix == ".parquet" for p in store.iterdir())  # unreadable: keep it
    return store.is_file() and store.stat().st_size > 0


def _remove(out: Path) -> None:
    if out.is_dir():
        shutil.rmtree(out, ignore_errors=True)
        return
    for path in (out, manifest_path(out), lock_path(out)):
        path.unlink(missing_ok=True)


def kept_records(store: Path) -> int:
    """The records a results store holds committed: a Parquet store's listed rows, a JSONL store's whole lines."""
    try:
        if store.is_dir():
            from depthlens.stores.layout import manifest_file

            shards = json.loads(manifest_file(store).read_bytes()).get("shards") or []
            return sum(int(s.get("rows") or 0) for s in shards if isinstance(s, dict))
        with store.open("rb") as f:
            return sum(1 for raw in f if raw.endswith(b"\n") and raw.strip())
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


@contextlib.contextmanager
def new_out(out: Path, *stores: Path) -> Iterator[None]:
    """Run the block; if it fails and ``out`` did not exist before it, remove ``out`` unless one of ``stores``
    (the results stores under ``out``; default ``out`` itself) holds a committed record. A write that failed (a
    full disk) is said with what is truly kept: the records committed before, or nothing (``out`` removed)."""
    existed = out.exists()
    try:
        yield
    except BaseException as exc:
        removed = False
        if not existed and out.exists() and not any(committed(s) for s in stores or (out,)):
            _remove(out)
            removed = True
        failed = _write_failed(exc)
        if failed is None:
            raise
        raise _kept(failed, out, stores or (out,), removed) from None


def _write_failed(exc: BaseException) -> WriteFailed | None:
    """``exc`` as a failed write (a full disk anywhere in the run's files), or None."""
    if isinstance(exc, WriteFailed):
        return exc
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return WriteFailed(Path(exc.filename or "(a file of the run)"), exc)
    return None


def _kept(failed: WriteFailed, out: Path, stores: tuple[Path, ...], removed: bool) -> WriteFailed:
    if removed:
        return failed.keeping(
            f"nothing is kept: no record had been committed, and {out}, which this run created, was removed — "
            f"{failed.remedy}, then run the command again"
        )
    held = [(s, kept_records(s)) for s in stores if s.exists()]
    count = sum(n for _, n in held)
    where = next((s for s, n in held if n), out)
    if count:
        return failed.keeping(
            f"the {count} record(s) committed before are kept in {where} — {failed.remedy}, then rerun the "
            f"command with {named('resume')}"
        )
    return failed.keeping(
        f"{out} holds no committed record — {failed.remedy}, then rerun the command with {named('resume')}"
    )


def refuse_same_file(in_path: Path, out_path: Path) -> None:
    """Scores never replace their own input (``--overwrite`` included): nothing a user has is lost."""
    if out_path.exists() and in_path.exists() and out_path.resolve() == in_path.resolve():
        raise InputError(
            f"{named('out')} {out_path} is the input file itself; write the scores to another file"
        )


def refuse_inside(out: Path, store: Path, what: str = "the export") -> None:
    """Writes never land inside a store: ``out`` may be neither the store, a file in it, its manifest, nor a file
    in a sample store's directory (it would read as that store's responses). The refusal names the store ``out``
    lies in — ``store``, or the sample store beside it (another run's, with several stores read) — and ``what``
    is written."""
    from depthlens.stores.files import manifest_path
    from depthlens.stores.samples import SAMPLES, SHARDS

    target, source = out.resolve(), store.resolve()
    if target == source or source in target.parents or target == manifest_path(source):
        where = f"inside the store {store} (or where its responses are kept)"
    elif ((target.parent / SHARDS).is_dir() or (target.parent / SAMPLES).is_file()) and target.name in (
        SAMPLES,
        manifest_path(Path(SAMPLES)).name,
    ):
        run_dir = out.parent if out.parent.parts else target.parent
        where = f"where the sample store {run_dir} keeps its responses"
    else:
        return
    raise InputError(setting="out", value=out, requirement=f"{where}; write {what} outside it")
