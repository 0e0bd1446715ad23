"""A sample store's responses as the Python API's rows: each response with the depth it is about — per-token
``settling_depth`` and ``deep``, per-response ``dtr``, ``dtr_prefix`` and ``mean_settling_depth`` — under the
names of every other table (``dtr``, ``token_count``). A store's records carry their depth
(``stores.samples.DEPTH_FIELDS``); a record written before they did, or read with other DTR settings than its
store's, gets it computed here from its stored divergences (``metrics.dtr.response_depth``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from depthlens.config import DTRConfig
from depthlens.metrics.dtr import response_depth
from depthlens.models.tokens import layer_top_texts, token_texts
from depthlens.stores.samples import DEPTH_FIELDS, current_names

METADATA_KEY = (
    "depthlens"  # the table's schema metadata: the store's manifest and the DTR settings of its depth
)


LABELS = ("tokens", "layer_top_tokens")
"""The columns a pool table adds for people (a tokenizer's labels), which its store never holds."""


def pool_row(
    record: dict[str, Any],
    n_layers: int,
    dtr: DTRConfig,
    prefix: int | None,
    tokenizer: Any | None = None,
    as_stored: bool = False,
) -> dict[str, Any]:
    """A stored response as a row of the API's pool table: its fields, its depth and, where a tokenizer is at
    hand, its ``tokens`` (and each layer's ``layer_top_tokens``) as readable labels. ``as_stored``: ``dtr`` and
    ``prefix`` are the store's own, so depth the record carries is kept as it is (it was computed before the
    divergences were rounded for storing)."""
    row = dict(record)
    if row.get("status") == "failed":
        return row
    if not (as_stored and all(k in row for k in DEPTH_FIELDS)):
        row.update(response_depth(row["divergence"], n_layers, dtr, prefix, row.get("layer_top_ids")))
    if tokenizer is not None:
        row["tokens"] = token_texts(tokenizer, row["token_ids"])
        if "layer_top_ids" in row:
            row["layer_top_tokens"] = layer_top_texts(tokenizer, row["layer_top_ids"])
    return row


def pool_rows(
    records: Iterable[dict[str, Any]],
    n_layers: int,
    dtr: DTRConfig,
    prefix: int | None,
    tokenizer: Any = None,
    as_stored: bool = False,
) -> list[dict[str, Any]]:
    return [pool_row(r, n_layers, dtr, prefix, tokenizer, as_stored) for r in records]


def store_records(rows: Iterable[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The rows of a pool table back as the store's records, (where, record) as ``read_responses`` yields them
    (a table written out by an older depthlens may hold the old names: they are read as today's)."""
    for i, row in enumerate(rows):
        record = {k: v for k, v in row.items() if k not in LABELS}
        yield f"row {i} of the pool table", current_names(record)


def read_metadata(schema_metadata: dict[bytes, bytes] | None) -> dict[str, Any] | None:
    """``metadata`` read back from a table's schema (None: a table that lost it, e.g. through pandas)."""
    raw = (schema_metadata or {}).get(METADATA_KEY.encode())
    return json.loads(raw) if raw else None
