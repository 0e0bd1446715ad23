"""A sample store's responses as the Python API's rows: each response with the depth it is about — per-token
``settling_depth`` and ``deep``, per-response ``dtr``, ``dtr_prefix`` and ``mean_settling_depth`` — computed from
its stored divergences with the run's DTR settings (``metrics.dtr``), under the score store's names (``dtr``,
``token_count``). A store written before these columns reads the same: they are derived here, on read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from depthlens.config import DTRConfig
from depthlens.metrics.dtr import deep_flags, deep_thinking_ratio, mean_settling_depth, settling_depth
from depthlens.models.tokens import token_texts

# The score store's name of a quantity ← the sample store's name of the same quantity (one name per quantity in
# every table the API returns; the sample store keeps its own until it is migrated).
RENAMED = {"dtr": "dtr_readout", "token_count": "n_tokens"}
_STORE_TO_API = {old: new for new, old in RENAMED.items()}
DEPTH_COLUMNS = ("settling_depth", "deep", "dtr", "dtr_prefix", "mean_settling_depth")
METADATA_KEY = (
    "depthlens"  # the table's schema metadata: the store's manifest and the DTR settings of its depth
)


def depth_fields(
    divergence: list[list[float]], n_layers: int, dtr: DTRConfig, prefix: int | None
) -> dict[str, Any]:
    """The depth of one response from its stored [T × L] divergences: c_t, deep flags, DTR over the read-out
    tokens, DTR over the first ``prefix`` of them (None: all) and the mean c_t (None for no tokens)."""
    table = torch.tensor(divergence, dtype=torch.float32).reshape(-1, n_layers)
    settling = settling_depth(table, dtr.g)
    deep = deep_flags(settling, n_layers, dtr.rho, dtr.deep_rule)
    return {
        "settling_depth": settling.tolist(),
        "deep": deep.tolist(),
        "dtr": deep_thinking_ratio(deep),
        "dtr_prefix": deep_thinking_ratio(deep, prefix),
        "mean_settling_depth": mean_settling_depth(settling),
    }


def pool_row(
    record: dict[str, Any], n_layers: int, dtr: DTRConfig, prefix: int | None, tokenizer: Any | None = None
) -> dict[str, Any]:
    """A stored response as a row of the API's pool table: the store's fields under the score store's names, its
    depth (``depth_fields``) and, where a tokenizer is at hand, its ``tokens`` as readable labels."""
    row = {_STORE_TO_API.get(key, key): value for key, value in record.items()}
    if record.get("status") == "failed":
        return row
    row.update(depth_fields(record["divergence"], n_layers, dtr, prefix))
    if tokenizer is not None:
        row["tokens"] = token_texts(tokenizer, record["token_ids"])
    return row


def pool_rows(
    records: Iterable[dict[str, Any]],
    n_layers: int,
    dtr: DTRConfig,
    prefix: int | None,
    tokenizer: Any = None,
) -> list[dict[str, Any]]:
    return [pool_row(r, n_layers, dtr, prefix, tokenizer) for r in records]


def store_records(rows: Iterable[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The rows of a pool table back as the store's records, (where, record) as ``read_responses`` yields them."""
    for i, row in enumerate(rows):
        record = {RENAMED.get(k, k): v for k, v in row.items() if k not in DEPTH_COLUMNS or k == "dtr"}
        yield f"row {i} of the pool table", record


def metadata(manifest: dict[str, Any], dtr: DTRConfig, prefix: int | None) -> dict[str, str]:
    """What a pool table carries about itself (schema metadata): the store's manifest and its depth's settings."""
    return {
        METADATA_KEY: json.dumps({"manifest": manifest, "dtr": dtr.to_dict(), "prefix": prefix}, default=str)
    }


def read_metadata(schema_metadata: dict[bytes, bytes] | None) -> dict[str, Any] | None:
    """``metadata`` read back from a table's schema (None: a table that lost it, e.g. through pandas)."""
    raw = (schema_metadata or {}).get(METADATA_KEY.encode())
    return json.loads(raw) if raw else None
