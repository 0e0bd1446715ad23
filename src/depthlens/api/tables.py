"""The verbs' tables: rows as a pyarrow Table that carries what it is about — a pool's manifest and the settings of
its depth, a vote's settings and its notes — in its schema metadata (``depthlens``) and in the ``attrs`` of every
DataFrame made from it (pyarrow's ``table.to_pandas()`` or ``depthlens.to_pandas``; pandas keeps them through
filtering, and back through ``pa.Table.from_pandas`` or ``depthlens.from_pandas``). ``notes`` reads a vote's
notes from either.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from depthlens.studies.pool_table import METADATA_KEY, read_metadata

Table = Any  # a pyarrow.Table (pyarrow is imported only under stores/)


def carrying(rows: Iterable[dict[str, Any]], about: dict[str, Any]) -> Table:
    """``rows`` as a table carrying ``about`` (JSON-able) in its schema metadata and its frames' ``attrs``."""
    from depthlens.stores.arrow import to_table, with_frame_attrs

    table = to_table(rows)
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(about, default=str)})
    attrs = {METADATA_KEY: json.loads(json.dumps(about, default=str))}
    if "notes" in about:
        attrs["notes"] = list(about["notes"])
    return with_frame_attrs(table, attrs)


def carried(table: Table) -> dict[str, Any] | None:
    """What ``table`` carries about itself (``carrying``): from its schema metadata, or — a table made again
    from a DataFrame by ``pa.Table.from_pandas`` — from the frame's ``attrs``; None for a table without it."""
    from depthlens.stores.arrow import frame_attrs

    own = read_metadata(table.schema.metadata)
    if own is not None:
        return own
    attrs = frame_attrs(table).get(METADATA_KEY)
    return dict(attrs) if isinstance(attrs, dict) else None


def table_manifest(table: Table) -> dict[str, Any]:
    """The manifest a pool table carries; a table that lost it (a frame rebuilt by hand) gets the parts voting
    needs: its layers, its questions in order, the most responses one has."""
    about = carried(table)
    if about is not None and "manifest" in about:
        return about["manifest"]
    rows = table.select(["question_id", "divergence"]).to_pylist()
    layers = next((len(r["divergence"][0]) for r in rows if r["divergence"]), 1)
    pools = Counter(r["question_id"] for r in rows)
    return {"n_layers": layers, "questions": list(pools), "pool": max(pools.values(), default=0)}


def notes(result: Any) -> list[str]:
    """The notes a verb's table carries (``think_at_n``'s: how answers were read, what the draws can and cannot
    tell, the control row), from the table or any DataFrame made from it (``df.attrs["notes"]``)."""
    attrs = getattr(result, "attrs", None)
    if isinstance(attrs, dict) and "notes" in attrs:
        return list(attrs["notes"])
    about = carried(result) if hasattr(result, "schema") else None
    return list((about or {}).get("notes", []))
