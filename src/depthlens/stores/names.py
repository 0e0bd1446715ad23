"""One name per quantity across the stores, the server and the Python API, and the names of stores written before
(issue 42): a record or a shard read from an older store is given today's names here, on read. A config field
renamed since keeps its key in a manifest (``config.base.Config.DICT_KEYS``: the three ℓ_prefix settings are
``prefix`` in every manifest, summary and response), so older stores need no legacy name for it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

LEGACY_NAMES = {"n_tokens": "token_count", "dtr_readout": "dtr"}
"""A response field's name in stores written before one name per quantity ← its name now (the score store's, the
server's and the Python API's). ``read_responses`` and ``iter_samples`` give every record the names of now."""


def divergence_field(kind: str, primary: str | None = None) -> str:
    """The field (and column) holding divergence ``kind`` in a store whose primary divergence is ``primary``:
    ``divergence`` for the primary one, ``divergence_<kind>`` for one measured beside it (``also``; None: ``kind``
    is one of those)."""
    return "divergence" if kind == primary else f"divergence_{kind}"


def current_names(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its ``LEGACY_NAMES`` fields renamed, in place (a record of now is returned as it is)."""
    for old, new in LEGACY_NAMES.items():
        if old in record:
            value = record.pop(old)
            record.setdefault(new, value)
    return record


def current_column(names: Sequence[str], name: str) -> str:
    """The column of a shard or table that holds ``name`` (a name of now): ``name``, or its legacy name in a store
    written before it."""
    if name in names:
        return name
    return next((old for old, new in LEGACY_NAMES.items() if new == name and old in names), name)


def stored_columns(names: Sequence[str], wanted: Sequence[str]) -> list[str]:
    """The columns of a shard (``names``) to read for ``wanted`` (names of now): each, or its legacy name."""
    return [c for c in (current_column(names, w) for w in wanted) if c in names]


def current_table(table: pa.Table) -> pa.Table:
    """A shard's table under today's names: a legacy column renamed, or dropped where its new name is there too (a
    score store wrote ``n_tokens`` beside ``token_count``)."""
    names = table.column_names
    keep = [n for n in names if not (n in LEGACY_NAMES and LEGACY_NAMES[n] in names)]
    if keep != names:
        table = table.select(keep)
    return table.rename_columns([LEGACY_NAMES.get(n, n) for n in table.column_names])
