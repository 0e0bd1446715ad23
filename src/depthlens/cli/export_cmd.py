"""``depthlens export``: a results store (sharded Parquet, or JSONL) as one JSONL file with its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthlens.cli import options as opt
from depthlens.cli.app import app, err_console, warn


def refuse_run_files(out: Path) -> None:
    """An export's file is its own: ``out`` may be no file of a run's directory (a sample store's questions,
    responses, manifests and summaries are that run's), no file inside a Parquet store, and no results store of
    another command (a file with a manifest beside it that no export wrote) — ``--overwrite`` or not."""
    from depthlens.errors import InputError
    from depthlens.stores.files import manifest_path
    from depthlens.stores.layout import is_store
    from depthlens.stores.samples import QUESTIONS, SAMPLES, SHARDS

    target = out.resolve()
    folder = target.parent
    run_dir = (folder / SHARDS).is_dir() or (folder / SAMPLES).is_file() or (folder / QUESTIONS).is_file()
    if run_dir or any(is_store(p) for p in target.parents):
        raise InputError(
            f"--out {out}: {folder} is a run's directory (a store of `depthlens generate`, `thinkn` or `score`) "
            "and its files are that run's, --overwrite or not; write the export outside it"
        )
    theirs = target.is_file() and manifest_path(target).is_file() and not _is_export(manifest_path(target))
    if target.name.endswith(".manifest.json") or theirs:
        raise InputError(
            f"--out {out}: a results store of another command (its manifest is beside it), or a manifest; "
            "--overwrite replaces only an earlier export — give another --out"
        )


def _is_export(meta: Path) -> bool:
    """Whether the manifest ``meta`` is an export's (``export`` marks its own, so it may replace only those)."""
    import json

    try:
        return bool(json.loads(meta.read_bytes()).get("exported_from"))
    except (OSError, ValueError, AttributeError):
        return False


@app.command("export", short_help="Write a Parquet results store out as one JSONL file.")
def export(
    store: opt.ResultsStore,
    out: opt.ExportOut,
    overwrite: opt.OverwriteOut = False,
    verify: opt.Verify = False,
) -> None:
    """Write every record of STORE to one JSONL file, in shard order, and its manifest beside it.

    The JSONL file reads like a `depthlens score` output of the same run (per-token floats at the store's width).
    """

    from depthlens.errors import InputError, StoreError
    from depthlens.stores.parquet import store_manifest

    if not store.exists():
        raise InputError(f"store {str(store)!r} does not exist")
    stored = store_manifest(store)  # a store at all?
    from depthlens.stores.guard import refuse_inside

    refuse_inside(out, store)
    refuse_run_files(out)
    if out.exists() and not overwrite:
        raise StoreError(f"{out} already exists; pass --overwrite to replace it")
    manifest = {
        k: v for k, v in stored.items() if k not in ("shards", "store", "layout", "next_shard", "superseded")
    }
    manifest["exported_from"] = str(
        store
    )  # marks the export as export's own: a later --overwrite may replace it
    from depthlens.stores.lock import store_lock

    with store_lock(out):  # the export is a store of its own: one writer
        count, escaped = _write_export(store, out, manifest, verify)
    err_console.print(f"wrote {count} records to {out}", highlight=False)
    if escaped:
        more = f" and {len(escaped) - 1} more" if len(escaped) > 1 else ""
        warn(
            f"record {escaped[0]}{more} held a lone surrogate (text UTF-8 cannot encode, edited outside "
            f"depthlens): written as a JSON escape (\\ud800), which JSON readers read back as the same text"
        )


def _write_export(store: Path, out: Path, manifest: dict[str, Any], verify: bool) -> tuple[int, list[str]]:
    """Every record of ``store`` into ``out`` (a temporary name, then renamed), its manifest beside it; the count,
    and the records (id and field) whose text was written escaped."""
    import errno
    import json
    import os

    from depthlens.errors import StoreError
    from depthlens.stores.commits import COMMITTED, Running
    from depthlens.stores.files import manifest_path, write_error, write_json
    from depthlens.stores.readers import read_checked
    from depthlens.stores.records import unencodable

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    count, committed, escaped = 0, Running(), []  # the export's own commit, as every JSONL store keeps one
    try:
        with tmp.open("wb") as f:
            # the checked read every reader makes (``stores.readers``): export refuses what `check` refuses, bar
            # a text UTF-8 cannot carry (a lone surrogate), which it writes as a JSON escape (``\ud800``): every
            # JSON reader turns it back into the same text, and the rest of the line stays as it was
            for _, record in read_checked(store, verify=verify, escape_text=True):
                text = json.dumps(record, ensure_ascii=False) + "\n"
                try:
                    line = text.encode("utf-8")
                except UnicodeEncodeError:
                    line = text.encode("utf-8", "backslashreplace")
                    escaped.append(f"{record.get('id')!r} ({unencodable(record)})")
                f.write(line)
                committed.add(line)
                count += 1
        write_json(manifest_path(out), {**manifest, COMMITTED: committed.entry()})
        tmp.replace(out)
    except OSError as exc:
        # not write_error's advice (--resume): an export has none, and keeps nothing of a failed write
        if exc.errno == errno.ENOSPC:
            raise StoreError(
                f"{out}: the disk is full; nothing was written (an export is written whole or not at all) — "
                "free some space, then run the export again"
            ) from exc
        raise write_error(out, exc) from exc
    finally:
        tmp.unlink(missing_ok=True)  # every failure (a damaged shard included) leaves no temporary file
    return count, escaped
