"""A ``score`` call's records as the scorer reads them: a list (or any iterable) of dicts shaped like
``depthlens score``'s JSONL input. What a notebook holds instead is named with what to pass (a DataFrame, one
dict, a path, a table); token ids as a numpy array or a torch tensor are taken as the list they hold; two records
with one id are refused by name, as a store could not tell them apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from depthlens.errors import InputError
from depthlens.stores.inputs import InputRecord, check_record

Records = Iterable[dict[str, Any]]
IDS = ("prompt_ids", "completion_ids", "token_ids")
"""The fields that hold token ids."""


def _instead(records: object) -> str | None:
    """What to pass instead of ``records`` where it is not a collection of records, else None."""
    if hasattr(records, "to_dict") and hasattr(records, "columns"):
        return "a pandas DataFrame; pass its rows as dicts: records.to_dict('records')"
    if hasattr(records, "to_pylist") and hasattr(records, "schema"):
        return "a pyarrow Table; pass its rows as dicts: records.to_pylist()"
    if isinstance(records, dict):
        return "one dict; pass a list of records, even of one: [record]"
    if isinstance(records, (str, bytes)) or hasattr(records, "__fspath__"):
        return (
            f"a {type(records).__name__}; pass a list of dicts (a JSONL file's lines: "
            "[json.loads(line) for line in open(path)]), or score the file with `depthlens score --in PATH`"
        )
    if not isinstance(records, Iterable):
        return f"a {type(records).__name__}; pass a list of dicts"
    return None


def _as_list(ids: Any) -> Any:
    """Token ids as a list of Python ints: a numpy array or a torch tensor (1-D) as the list it holds."""
    if hasattr(ids, "tolist") and getattr(ids, "ndim", 1) == 1:
        ids = ids.tolist()
    if isinstance(ids, list):
        return [i.item() if hasattr(i, "item") and not isinstance(i, (bool, int)) else i for i in ids]
    return ids


def records_of(verb: str, records: object) -> list[InputRecord]:
    """``records`` checked and numbered: each a dict of an accepted shape (``stores.inputs.check_record``), its
    id its ``id`` or its index, no id twice."""
    instead = _instead(records)
    if instead is not None:
        raise InputError(f"depthlens.{verb}(records=…): got {instead}", setting="records")
    out: list[InputRecord] = []
    seen: dict[str, int] = {}
    for i, data in enumerate(cast(Iterable[Any], records)):  # an iterable: ``_instead`` said so
        if not isinstance(data, dict):
            raise InputError(
                f"depthlens.{verb}(records=…): records[{i}] is a {type(data).__name__}; each record is a dict "
                "('prompt' + 'completion', 'messages' + 'completion', or 'prompt_ids' + 'completion_ids')",
                setting="records",
            )
        data = {k: _as_list(v) if k in IDS else v for k, v in data.items()}
        check_record(data, f"records[{i}]")
        key = str(data.get("id", i))
        if key in seen:
            raise InputError(
                f"depthlens.{verb}(records=…): records[{seen[key]}] and records[{i}] have the id {key!r}; give "
                "each record its own 'id' (or leave 'id' out: a record is then known by its index)",
                setting="records",
            )
        seen[key] = i
        out.append(InputRecord(key, 0, data))
    return out
