"""A JSONL store's records checked as every reader and ``depthlens check`` check them: each record's id, text, ranges
and meaning (``jsonl_record_problem``), and the file against the commit its manifest records
(``jsonl_commit_problem``); ``iter_jsonl_checked`` reads a store through both. A Parquet store's shards are
``stores.shard_checks``'s.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from depthlens.stores import layout
from depthlens.stores.commits import commit_problem
from depthlens.stores.jsonl import iter_jsonl_located
from depthlens.stores.meaning import Facts
from depthlens.stores.meaning import record_problem as meaning_problem
from depthlens.stores.records import id_problem, text_problem
from depthlens.stores.validate import Bound, bounds, record_fault


def _jsonl_manifest(path: Path) -> dict[str, Any]:
    """The manifest beside a JSONL store, or {} where none is readable (the store is then read as it is)."""
    from depthlens.stores.files import manifest_path

    try:
        manifest = json.loads(manifest_path(path).read_bytes())
    except (OSError, ValueError, RecursionError):
        manifest = {}
    return manifest if isinstance(manifest, dict) else {}


@dataclasses.dataclass(frozen=True)
class JsonlRules:
    """What a JSONL store's records are checked against: each value's range, and what the values mean together."""

    ranges: dict[str, Bound]
    facts: Facts


def jsonl_ranges(path: Path) -> JsonlRules:
    """The checks of a JSONL store's values, from the manifest beside it (none readable: the ranges every store
    has, without depth, divergence kind, vocabulary or K)."""
    manifest = _jsonl_manifest(path)
    return JsonlRules(bounds(manifest), Facts.of(manifest))


def jsonl_commit_problem(path: Path, verify: bool, held: int | None = None) -> layout.Problem | None:
    """A JSONL store holding fewer records than its manifest committed (records removed), or (``verify``) other
    bytes: the same refusal for ``check`` and every reader (``stores.commits``)."""
    from depthlens.stores.files import manifest_path

    found = commit_problem(path, _jsonl_manifest(path), verify, held)
    if found is None:
        return None
    kind, detail = found
    if kind == "manifest":
        return layout.Problem(manifest_path(path), kind, detail, "restore it from a copy of the store")
    return layout.Problem(
        path,
        kind,
        detail,
        "restore the file from a copy of the store, or rerun the command that wrote it with --resume: it computes "
        "the missing records again",
    )


def jsonl_record_problem(
    path: Path, where: str, record: dict[str, Any], rules: JsonlRules, seen: dict[str, str]
) -> layout.Problem | None:
    """What a reader refuses in one JSONL record: an id an earlier line holds (``seen``: id → line), a value
    out of its range, or values that disagree (``stores.meaning``). ``depthlens check`` runs this same function."""
    fix = (
        "rerun the command that wrote it with --resume: it sets that line aside (in "
        f"{path.name}.damaged) and computes its record again"
    )
    rid = str(record.get("id"))
    mismatch = id_problem(record)
    if mismatch:  # an edited id: named on its own line, not as a repeat of the record it now names
        return layout.Problem(Path(where), "damaged", f"record {record.get('id')!r}: {mismatch}", fix)
    if "id" in record and rid in seen:
        return layout.Problem(
            Path(where),
            "ids",
            f"id {rid!r} is also on {seen[rid]} (a line repeated); readers would count it twice",
            "rerun the command that wrote it with --resume: it keeps the first line and sets the repeat aside "
            f"(in {path.name}.damaged)",
        )
    seen[rid] = where
    text = text_problem(record)
    if text is not None:
        return layout.Problem(Path(where), "damaged", f"record {record.get('id')!r}: {text}", fix)
    fault = record_fault(record, rules.ranges)
    if fault is not None:
        return layout.Problem(Path(where), "damaged", fault.detail(record.get("id")), fix)
    wrong = meaning_problem(record, rules.facts)
    if wrong is not None:
        return layout.Problem(
            Path(where), "damaged", f"record {record.get('id')!r}: {wrong} — the record is damaged", fix
        )
    return None


def iter_jsonl_checked(path: Path, verify: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """A JSONL store's records: the file against its manifest's commit, each record as ``jsonl_record_problem``
    says."""
    ranges, seen = jsonl_ranges(path), dict[str, str]()
    for where, record in iter_jsonl_located(path):
        problem = jsonl_record_problem(path, where, record, ranges, seen)
        if problem is not None:
            raise layout.Refused(problem)
        yield where, record
    # last, as `check` lists it: a damaged record is named as such first (editing one changes the bytes too)
    problem = jsonl_commit_problem(path, verify, len(seen))
    if problem is not None:
        raise layout.Refused(problem)
