"""``depthlens export``: a results store (sharded Parquet, or JSONL) as one JSONL file with its manifest."""

from __future__ import annotations

import uuid
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
    # a store of its own: its run id is new, and its manifest names the run and path it came from
    manifest["derived_from"] = {"run_id": stored.get("run_id"), "path": str(store.resolve()), "by": "export"}
    manifest["run_id"] = uuid.uuid4().hex[:16]
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
    """Every record of ``store`` into ``out`` and its manifest beside it, both whole or neither (each written to a
    temporary name, then both renamed); the count, and the records (id and field) whose text was written
    escaped. A failed write (a full disk) removes both temporary files and says so."""
    import json
    import os

    from depthlens.stores.commits import COMMITTED, Running
    from depthlens.stores.files import manifest_path
    from depthlens.stores.readers import read_checked
    from depthlens.stores.records import unencodable

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    meta = manifest_path(out)
    meta_tmp = meta.with_name(f".{meta.name}.{os.getpid()}.tmp")
    count, committed, escaped = 0, Running(), []  # the export's own commit, as every JSONL store keeps one
    writing = out  # the file being written, named by a failure (not by its temporary name)
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
            f.flush()
            os.fsync(f.fileno())
        writing = meta
        with meta_tmp.open("w", encoding="utf-8") as f:
            f.write(
                json.dumps({**manifest, COMMITTED: committed.entry()}, indent=2, ensure_ascii=False) + "\n"
            )
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(out)
        meta_tmp.replace(meta)
    except OSError as exc:  # named by the file it was for, not by its temporary name
        raise _export_failed(writing, out, exc) from None
    finally:
        tmp.unlink(missing_ok=True)  # every failure (a damaged shard included) leaves no temporary file
        meta_tmp.unlink(missing_ok=True)
    return count, escaped


def _export_failed(where: Path, out: Path, exc: OSError) -> Exception:
    """A failed export's one line: the file, what happened, and that nothing of it was kept (an export has no
    --resume: it is written whole or not at all)."""
    from depthlens.stores.files import WriteFailed

    failed = WriteFailed(where, exc)
    kept = "nothing was written" if not out.exists() else f"{out} is as it was before this export"
    return failed.keeping(
        f"{kept} (an export is written whole or not at all) — {failed.remedy}, then run the export again"
    )
