"""The one checked read of any results store: a sample store's responses through ``samples.read_responses`` (its
manifest, every record's fields, ranges and consistency: ``stores.records``), any other store through
``parquet.iter_store_located`` (its files and ranges). ``depthlens export`` reads this way, so it refuses what
``check`` and ``thinkn --from`` refuse (issue 51)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from depthlens.stores.files import manifest_path
from depthlens.stores.layout import is_store, manifest_file
from depthlens.stores.parquet import iter_store_located, store_manifest, verifying
from depthlens.stores.records import escaping_text
from depthlens.stores.samples import SAMPLES, SHARDS, picking, read_responses
from depthlens.stores.shortfall import say, shortfall


def sample_store_of(store: Path) -> Path | None:
    """The sample store directory whose responses ``store`` is (``RUN/samples/`` or ``RUN/samples.jsonl``, with a
    sample store's manifest: a pool and questions), or None for any other results store."""
    if store.name == SHARDS and is_store(store):
        meta = manifest_file(store)
    elif store.name == SAMPLES and store.is_file():
        meta = manifest_path(store)
    else:
        return None
    try:
        manifest = json.loads(meta.read_bytes())
    except (OSError, ValueError, RecursionError):
        return store.parent  # a sample store's name: its reader names the unreadable manifest
    return (
        store.parent
        if isinstance(manifest, dict) and ("pool" in manifest or "questions" in manifest)
        else None
    )


def read_checked(
    store: Path, verify: bool = False, escape_text: bool = False
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) for every record of ``store``, each checked as its kind of store is: a sample store's
    responses as every study reads them, any other results store by its files and ranges. ``escape_text``: a text
    UTF-8 cannot encode (a lone surrogate) is let through, for a writer that escapes it (``depthlens export``)."""
    out_dir = sample_store_of(store)
    with escaping_text() if escape_text else contextlib.nullcontext():
        if out_dir is None:
            count = 0
            for located in iter_store_located(store, verify):
                count += 1
                yield located
            say(shortfall(store, store_manifest(store), count))  # a store shorter than its input: said once
            return
        with verifying(verify), picking("parquet" if store.is_dir() else "jsonl"):
            yield from read_responses(out_dir)
