"""``depthlens check STORE`` (like ``git fsck``): every file of a store against its manifest, what is missing, cut,
changed, foreign or unlisted, and the one safe remedy for each. Reads only; changes nothing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from depthlens.errors import StoreError
from depthlens.stores import layout
from depthlens.stores.files import manifest_path, read_json
from depthlens.stores.lock import holder
from depthlens.stores.samples import SAMPLES, SHARDS


@dataclasses.dataclass
class CheckReport:
    """What ``check`` found: problems (each with its remedy), notes (nothing wrong), and what is committed."""

    store: Path
    problems: list[layout.Problem] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    shards: int = 0
    records: int = 0


def check(path: Path, verify: bool = True) -> list[CheckReport]:
    """Check the store at ``path``: a sample store directory (its responses), a Parquet store, or a JSONL store."""
    if not path.exists():
        raise StoreError(f"{path} does not exist")
    stores = [path / SHARDS, path / SAMPLES] if path.is_dir() and not layout.is_store(path) else [path]
    found = [s for s in stores if layout.is_store(s) or s.is_file()]
    if not found:
        raise StoreError(
            f"{path}: neither a Parquet store ({layout.MANIFEST}), a JSONL store nor a sample store "
            f"({SHARDS}/ or {SAMPLES}); nothing to check"
        )
    reports = [check_parquet(s, verify) if s.is_dir() else check_jsonl(s) for s in found]
    if len(found) == 1 and found[0].parent == path:  # a sample store: are its summaries of its present state?
        reports[0].notes += _derived(path)
    if len(found) > 1:
        reports[0].problems.append(
            layout.Problem(
                path,
                "two stores",
                f"holds both {SHARDS}/ and {SAMPLES}",
                "read one with --store parquet or --store jsonl, or move the other out of the directory",
            )
        )
    return reports


def _derived(out_dir: Path) -> list[str]:
    """A note per summary or replay computed from another state of the store than the present one."""
    from depthlens.stores.state import stale

    notes = []
    for path in sorted([*out_dir.glob("thinkn-*.json"), *out_dir.glob("online_replay.json")]):
        try:
            why = stale(json.loads(path.read_bytes()), out_dir)
        except (OSError, ValueError, StoreError):
            continue
        if why:
            notes.append(f"{path}: {why} — rerun the command that wrote it (with --overwrite) for this state")
    return notes


def _held(store: Path, report: CheckReport) -> None:
    who = holder(store)
    if who:
        report.notes.append(f"being written now by {who}: files in flight are expected")


def check_parquet(store: Path, verify: bool) -> CheckReport:
    report = CheckReport(store)
    _held(store, report)
    manifest, unlisted = layout.snapshot(
        store,
        lambda: read_json(layout.manifest_file(store), "manifest", "restore it from a copy of the store"),
    )
    shards = layout.entries(store, manifest)
    if layout.is_legacy(store):
        report.notes.append(
            f"written before {layout.MANIFEST} (its manifest.json stops `pd.read_parquet`); the "
            "next --resume moves it to the current layout"
        )
    report.problems += unlisted
    listed = {s["file"] for s in shards}
    seen: dict[str, str] = {}
    for shard in shards:
        problem, table = _check_shard(store, manifest, shard, verify)
        if problem is not None:
            report.problems.append(problem)
            continue
        assert table is not None
        report.shards += 1
        report.records += table.num_rows
        for i in (str(x) for x in table.column("id").to_pylist()) if "id" in table.column_names else []:
            if i in seen:
                report.problems.append(
                    layout.Problem(
                        store / shard["file"],
                        "ids",
                        f"id {i!r} is also in {seen[i]}",
                        layout.resume_remedy(store, manifest, shard),
                    )
                )
                break
            seen[i] = shard["file"]
        if layout.locate(store, shard) == layout.staged(store, shard["file"]):
            report.notes.append(
                f"{store / shard['file']}: committed, not yet under its name (a writer stopped "
                "between its commit and the rename); the next --resume renames it"
            )
    _hidden(store, listed, report)
    return report


def _check_shard(
    store: Path, manifest: dict[str, Any], shard: dict[str, Any], verify: bool
) -> tuple[layout.Problem | None, pa.Table | None]:
    path, problem = layout.shard_problem(store, manifest, shard, verify)
    if problem is not None or path is None:
        return problem, None
    try:
        schema = pq.read_schema(path)
        columns = ["id"] if "id" in schema.names else None  # the ids and the row count: enough to check
        table = pq.read_table(path, columns=columns).replace_schema_metadata(schema.metadata)
    except (OSError, pa.ArrowException) as exc:
        return layout.Problem(
            path, "cut", f"not a readable Parquet shard ({exc})", layout.resume_remedy(store, manifest, shard)
        ), None
    return layout.table_problem(store, path, manifest, shard, table), table


def _hidden(store: Path, listed: set[str], report: CheckReport) -> None:
    """Hidden files: what a writer had in flight, shards a regrade replaced, shards --resume set aside."""
    for path in sorted(store.iterdir()):
        name = path.name
        if name.endswith(".tmp") and name.startswith(".part-") and name[1:-4] not in listed:
            report.notes.append(
                f"{path}: a shard that was being written and never committed; the next write "
                "to the store removes it (Parquet readers do not see it)"
            )
        elif name.endswith(".old"):
            report.notes.append(
                f"{path}: replaced by a regrade, kept for readers that started before it; the "
                "next write removes it"
            )
        elif name.endswith((".damaged", ".unlisted")):
            report.notes.append(
                f"{path}: set aside by --resume (cut, or not listed); its records were computed "
                "again — remove it once you no longer want it"
            )


def check_jsonl(store: Path) -> CheckReport:
    report = CheckReport(store)
    _held(store, report)
    if not manifest_path(store).is_file():
        report.problems.append(
            layout.Problem(
                manifest_path(store),
                "missing",
                "the store's manifest is missing",
                "restore it from a copy of the store",
            )
        )
    fix = (
        "rerun the command that wrote it with --resume: it sets that line aside and computes its record again"
    )
    seen: dict[str, int] = {}
    with store.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = Path(f"{store}:{number}")
            if not raw.endswith(b"\n"):
                report.problems.append(
                    layout.Problem(where, "cut", "the last line is cut short (an interrupted write)", fix)
                )
                continue
            try:
                rid = str(json.loads(raw)["id"])
            except (ValueError, KeyError, TypeError):
                report.problems.append(layout.Problem(where, "cut", "not a JSON record", fix))
                continue
            if rid in seen:
                report.problems.append(
                    layout.Problem(
                        where, "ids", f"id {rid!r} also on line {seen[rid]}", "keep one of the two lines"
                    )
                )
            seen[rid] = number
            report.records += 1
    return report
