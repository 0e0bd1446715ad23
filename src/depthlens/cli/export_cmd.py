"""``depthlens export``: a results store (sharded Parquet, or JSONL) as one JSONL file with its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from depthlens.cli.app import app, err_console


@app.command("export", short_help="Write a Parquet results store out as one JSONL file.")
def export(
    store: Annotated[
        Path, typer.Argument(help="A results store: a Parquet store directory or a JSONL file.")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="The JSONL file to write (its manifest beside it).")
    ],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out.")] = False,
) -> None:
    """Write every record of STORE to one JSONL file, in shard order, and its manifest beside it.

    The JSONL file reads like a `depthlens score` output of the same run (per-token floats at the store's width).
    """
    import json

    from depthlens.errors import InputError, StoreError
    from depthlens.stores.files import manifest_path, write_error, write_json
    from depthlens.stores.parquet import iter_store, store_manifest

    if not store.exists():
        raise InputError(f"store {str(store)!r} does not exist")
    if out.exists() and not overwrite:
        raise StoreError(f"{out} already exists; pass --overwrite to replace it")
    if out.resolve() == store.resolve():
        raise InputError(f"--out {out} is the store itself; write the export to another file")
    manifest = {k: v for k, v in store_manifest(store).items() if k not in ("shards", "store")}
    tmp = out.with_name(out.name + ".tmp")
    count = 0
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for record in iter_store(store):
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(out, exc) from exc
    write_json(manifest_path(out), manifest)
    err_console.print(f"wrote {count} records to {out}", highlight=False)
