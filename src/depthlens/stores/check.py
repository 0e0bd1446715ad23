"""``depthlens check STORE`` (like ``git fsck``): every file of a store against its manifest, what is missing, cut,
changed, foreign or unlisted, and the one safe remedy for each. Reads only; changes nothing."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from depthlens.config import StoreFormat
from depthlens.errors import StoreError
from depthlens.stores import layout, shard_checks
from depthlens.stores.commits import committed_problem
from depthlens.stores.files import manifest_path, read_json
from depthlens.stores.jsonl_checks import jsonl_commit_problem, jsonl_ranges, jsonl_record_problem
from depthlens.stores.lock import writer
from depthlens.stores.parquet import duplicate_problem, shard_fault, store_manifest
from depthlens.stores.readers import sample_store_of
from depthlens.stores.records import VOCAB
from depthlens.stores.samples import SAMPLES, SHARDS
from depthlens.stores.shortfall import quiet, shortfall


@dataclasses.dataclass
class CheckReport:
    """What ``check`` found: problems (each with its remedy), notes (nothing wrong), and what is committed."""

    store: Path
    problems: list[layout.Problem] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    shards: int = 0
    records: int = 0
    incomplete: str | None = (
        None  # whole, but fewer records than its run set out to write (``stores.shortfall``)
    )


def check(path: Path, verify: bool = True) -> list[CheckReport]:
    """Check the store at ``path``: a sample store directory (its responses), a Parquet store, or a JSONL store."""
    if not path.exists():
        raise StoreError(f"{path} does not exist")
    # a Parquet store, its manifest present or lost
    whole = layout.is_store(path) or layout.without_manifest(path)
    stores = [path / SHARDS, path / SAMPLES] if path.is_dir() and not whole else [path]
    # shards whose manifest is gone are a damaged store, checked as one (its manifest listed missing)
    found = [s for s in stores if layout.is_store(s) or s.is_file() or layout.without_manifest(s)]
    if not found:
        raise StoreError(
            f"{path}: neither a Parquet store ({layout.MANIFEST}), a JSONL store nor a sample store "
            f"({SHARDS}/ or {SAMPLES}); nothing to check"
        )
    if path.is_file() and _is_parquet(path):
        raise StoreError(
            f"{path}: a shard of a Parquet store, not a store; check the store it belongs to: "
            f"`depthlens check {path.parent}`"
        )
    out_dir = sample_store_of(found[0]) if len(found) == 1 else None
    # a sample store's JSONL commit is checked by its reader, after its records (``_read_as_studies_do``)
    reports = [
        check_parquet(s, verify) if s.is_dir() else check_jsonl(s, verify, commit=out_dir is None)
        for s in found
    ]
    if out_dir is not None:  # a sample store (or its responses): are its summaries of its present state?
        with quiet():  # its shortfall is this report's own line
            _read_as_studies_do(out_dir, reports[0], "parquet" if found[0].is_dir() else "jsonl", verify)
        if out_dir == path:
            reports[0].notes += _derived(path)
    for report in reports if len(found) == 1 else []:
        _completeness(report, out_dir)
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


_POINTS_AT_CHECK = re.compile(
    r"\s*[(—;,]*\s*(?:the responses are untouched; )?`depthlens check [^`]*` lists [^);]*\)?"
)


def own_remedy(remedy: str) -> str:
    """A remedy as ``check`` gives it: without the clause that sends the reader to ``depthlens check`` (the
    readers' refusals end with it; ``check`` is where the user already is)."""
    return _POINTS_AT_CHECK.sub("", remedy).rstrip(" ;,—") or remedy


def _completeness(report: CheckReport, out_dir: Path | None) -> None:
    """A whole store's count against what its run set out to write (``incomplete``), and a note where its manifest
    records no vocabulary size, so token ids cannot be checked against it."""
    if report.problems:
        return
    try:
        manifest = store_manifest(report.store)
    except StoreError:
        return
    report.incomplete = shortfall(report.store, manifest, report.records, out_dir)
    if report.incomplete is not None and " so far: " in report.incomplete:  # being written: not a fault
        report.notes.append(report.incomplete)
        report.incomplete = None
    if VOCAB not in manifest and report.records and _holds_token_ids(report.store):
        report.notes.append(
            f"its manifest records no vocabulary size ({VOCAB}: written before it was recorded): token ids are "
            "checked for being whole numbers ≥ 0 and distinct within each layer's top-k, not against the "
            "model's vocabulary"
        )


def _holds_token_ids(store: Path) -> bool:
    """Whether the records of ``store`` hold token ids (``token_ids`` or each layer's top-k)."""
    import pyarrow.parquet as pq

    fields = ("token_ids", "layer_top_ids")
    if store.is_dir():
        shard = next(iter(sorted(store.glob("part-*.parquet"))), None)
        try:
            return shard is not None and any(f in pq.read_schema(shard).names for f in fields)
        except (OSError, pa.ArrowException):
            return False
    try:
        with store.open("rb") as f:
            first = f.readline()
    except OSError:
        return False
    return any(f'"{f}"'.encode() in first for f in fields)


def _is_parquet(path: Path) -> bool:
    """A Parquet file (it starts with ``PAR1``), whatever its name."""
    try:
        with path.open("rb") as f:
            return f.read(4) == b"PAR1"
    except OSError:
        return False


def _read_as_studies_do(out_dir: Path, report: CheckReport, fmt: StoreFormat, verify: bool) -> None:
    """The sample store read through the one reader every study uses (``read_responses``): what it refuses beyond
    the files — the manifest's fields, a record's fields, the divergences' kinds and width — is listed too, so
    `check` says ok only where every reader reads. Skipped where the files already have problems (every reader
    refuses those first)."""
    from depthlens.stores.parquet import verifying
    from depthlens.stores.samples import picking, read_responses

    if report.problems:
        return
    try:
        # a JSONL store's committed bytes are hashed here (a Parquet store's shards were, by check_parquet)
        with picking(fmt), verifying(verify and fmt == "jsonl"):
            for _ in read_responses(out_dir):
                pass
    except layout.Refused as exc:
        report.problems.append(exc.problem)
        _uncount(report, exc.problem)
    except StoreError as exc:
        report.problems.append(layout.Problem(out_dir, "refused", str(exc), "mend what the message names"))


def _uncount(report: CheckReport, problem: layout.Problem) -> None:
    """The records of a shard (or line) the reader refused after the files' checks counted it whole: no longer
    counted, so `check` and `check --quick` count alike whichever check names the fault (a sha256, or a record)."""
    name = problem.path.name.split(" ")[0]
    if not report.store.is_dir():
        report.records -= name.startswith(f"{report.store.name}:")
        return
    try:
        shards = read_json(layout.manifest_file(report.store), "manifest", "").get("shards", [])
    except (StoreError, AttributeError):
        return
    for shard in shards:
        if isinstance(shard, dict) and shard.get("file") == name and isinstance(shard.get("rows"), int):
            report.shards -= 1
            report.records -= shard["rows"]


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
    """A note where a command writes the store now: asked of the kernel (``lock.writer``), not of the lock file's
    text, which a writer killed with -9 leaves behind (its note would be false: a new writer is not blocked)."""
    who = writer(store)
    if who:
        report.notes.append(f"being written now by {who}: files in flight are expected")


def _manifest_problem(meta: Path, exc: StoreError) -> layout.Problem:
    """A manifest that cannot be read or does not hold a list of shards: the fault, named as such."""
    problem = getattr(exc, "problem", None)
    if problem is not None:
        return problem
    text = str(exc).removeprefix(f"{meta}: ")
    detail, _, remedy = text.partition("; ")
    return layout.Problem(meta, "manifest", detail, remedy or "restore it from a copy of the store")


def check_parquet(store: Path, verify: bool) -> CheckReport:
    """Every file of a Parquet store, each shard read and checked by the readers' own checks (``shard_fault``,
    the duplicate ids across shards); ``verify`` also hashes each shard. A manifest that cannot be read, or lists
    an id twice, is listed as the fault (nothing else can be checked without it)."""
    report = CheckReport(store)
    _held(store, report)
    meta = layout.manifest_file(store)
    lost = layout.without_manifest(store)
    if lost:  # only its shards are here (``check`` looks no further otherwise): the commit is gone
        detail, _, remedy = lost.removeprefix(f"{meta}: ").partition("; ")
        report.problems.append(layout.Problem(meta, "missing", detail, remedy))
        return report
    try:
        manifest, unlisted = shard_checks.snapshot(
            store, lambda: read_json(meta, "manifest", "restore it from a copy of the store")
        )
        shards = layout.entries(store, manifest)
    except StoreError as exc:
        report.problems.append(_manifest_problem(meta, exc))
        return report
    if layout.is_legacy(store):
        report.notes.append(
            f"written before {layout.MANIFEST} (its manifest.json stops `pd.read_parquet`); the "
            "next --resume moves it to the current layout"
        )
    report.problems += unlisted
    uncommitted = committed_problem(store, manifest)
    if uncommitted is not None:
        report.problems.append(uncommitted)
    seen: dict[str, str] = {}
    for shard in shards:
        problem, table = _check_shard(store, manifest, shard, verify)
        if problem is None and table is not None:
            problem = duplicate_problem(store, manifest, shard, table, seen)
        if problem is not None:
            if problem not in report.problems:  # a damaged manifest: listed once, not under every shard
                report.problems.append(problem)
            continue
        assert table is not None
        report.shards += 1
        report.records += table.num_rows
        if layout.locate(store, shard) == layout.staged(store, shard["file"]):
            report.notes.append(
                f"{store / shard['file']}: committed, not yet under its name (a writer stopped "
                "between its commit and the rename); the next --resume renames it"
            )
    _hidden(store, {s["file"] for s in shards}, report)
    return report


def _check_shard(
    store: Path, manifest: dict[str, Any], shard: dict[str, Any], verify: bool
) -> tuple[layout.Problem | None, pa.Table | None]:
    """One listed shard as a reader reads it: found, its size (and hash), read whole with its page checksums,
    then ``shard_fault`` — the very checks ``iter_store`` makes."""
    path, problem = shard_checks.shard_problem(store, manifest, shard, verify)
    if problem is not None or path is None:
        return problem, None
    try:
        table = layout.read_table(path, shard_checks.resume_remedy(store, manifest, shard))
    except (StoreError, FileNotFoundError) as exc:
        detail = str(exc).removeprefix(f"{path}: ").split("; rerun")[0]
        # its size is the committed one (``shard_problem`` passed) and, verified, its sha256 too: the bytes are
        # those its entry commits — unreadable as committed, or its entry edited to match — not changed since
        if verify and isinstance(shard.get("sha256"), str):
            detail += (
                ", though its bytes are the ones its manifest entry commits (size and sha256 match): it was "
                "committed unreadable, or its entry was edited to match it"
            )
        else:
            detail += " of the committed size (`check` without --quick compares its sha256 too)"
        return layout.Problem(
            path, "changed", detail, shard_checks.resume_remedy(store, manifest, shard)
        ), None
    problem = shard_fault(store, path, manifest, shard, table)
    return problem, None if problem is not None else table


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


def check_jsonl(store: Path, verify: bool = True, commit: bool = True) -> CheckReport:
    """A JSONL store line by line, with the readers' own checks (``jsonl_record_problem``): cut or non-JSON
    lines, repeated ids, values out of range; its manifest, present and readable; and the file against the
    records its manifest committed (``jsonl_commit_problem``; ``verify`` also hashes them; ``commit`` False: the
    caller reads the store through its reader, which checks that last)."""
    report = CheckReport(store)
    _held(store, report)
    meta = manifest_path(store)
    if not meta.is_file():
        report.problems.append(
            layout.Problem(
                meta, "missing", "the store's manifest is missing", "restore it from a copy of the store"
            )
        )
    else:
        try:
            read_json(meta, "manifest", "restore it from a copy of the store")
        except StoreError as exc:
            report.problems.append(_manifest_problem(meta, exc))
    fix = (
        "rerun the command that wrote it with --resume: it sets that line aside and computes its record again"
    )
    ranges, seen = jsonl_ranges(store), dict[str, str]()
    with store.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{store}:{number}"
            if not raw.endswith(b"\n"):
                report.problems.append(
                    layout.Problem(
                        Path(where), "cut", "the last line is cut short (an interrupted write)", fix
                    )
                )
                continue
            try:
                record = json.loads(raw)
                record["id"]
            except (ValueError, KeyError, TypeError, IndexError, RecursionError):
                report.problems.append(layout.Problem(Path(where), "cut", "not a JSON record", fix))
                continue
            problem = jsonl_record_problem(store, where, record, ranges, seen)
            if problem is not None:
                report.problems.append(problem)
                continue
            report.records += 1
    committed = jsonl_commit_problem(store, verify)
    if (
        commit
        and committed is not None
        and not any(p.kind in ("damaged", "ids", "cut") for p in report.problems)
    ):
        report.problems.append(committed)  # a damaged line is the fault named (editing it changed the bytes)
    return report
