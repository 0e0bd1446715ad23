"""Results stores, either format: which one a store has or gets, and one way to check, open and read it.

A store is a sharded Parquet directory (``stores.parquet``), the default for new stores, or a JSONL file
(``stores.jsonl``): written where asked for (``score --out x.jsonl``, ``generate --store jsonl``), and every store
written before Parquet. An existing store keeps its own format, so an old JSONL store resumes and reads as it
always did; ``depthlens export`` writes any store out as one JSONL file. Inputs are JSONL or Parquet files with
the same columns.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from depthlens.config import StoreFormat
from depthlens.errors import InputError, named
from depthlens.stores.files import ResumeRules
from depthlens.stores.inputs import BadLine, InputRecord, RecordCollector, read_records
from depthlens.stores.jsonl import ResultWriter, check_output
from depthlens.stores.parquet import committed_shards, iter_store
from depthlens.stores.shard_writer import ShardWriter, check_store

COMMIT_S = 30.0  # a Parquet results store commits what it holds at least this often (a kill loses no more)


@dataclasses.dataclass(frozen=True)
class Format:
    """One store format, a registry row: how a run checks it may write (resume, overwrite) and opens its writer."""

    check: Callable[..., bool]  # (out, manifest, resume, overwrite, rules) -> whether writing resumes it
    open: Callable[
        ..., ResultWriter | ShardWriter
    ]  # (out, manifest, resume, overwrite, rules, hashes, timed)


def _open_jsonl(
    out: Path,
    manifest: dict[str, Any],
    resume: bool,
    overwrite: bool,
    rules: ResumeRules,
    hashes: dict[str, str] | None,
    timed: bool,
) -> ResultWriter:
    return ResultWriter(out, manifest, resume, overwrite, rules, hashes)  # every record is on disk as written


def _open_parquet(
    out: Path,
    manifest: dict[str, Any],
    resume: bool,
    overwrite: bool,
    rules: ResumeRules,
    hashes: dict[str, str] | None,
    timed: bool,
) -> ShardWriter:
    return ShardWriter(out, manifest, resume, overwrite, rules, hashes, commit_s=COMMIT_S if timed else None)


REGISTRY: dict[StoreFormat, Format] = {
    "parquet": Format(check_store, _open_parquet),
    "jsonl": Format(check_output, _open_jsonl),
}
FORMATS: tuple[StoreFormat, ...] = tuple(REGISTRY)  # the names, the default first


def results_format(out: Path) -> StoreFormat:
    """The format of the results store at ``out``: an existing directory is Parquet and an existing file JSONL;
    a new ``out`` is JSONL when its name ends in ``.jsonl``, else a Parquet store directory."""
    if out.is_dir():
        return "parquet"
    return "jsonl" if out.exists() or out.suffix == ".jsonl" else "parquet"


def store_entry(
    fmt: StoreFormat, float16: bool, jsonl_fix: str = "give --out a name without .jsonl"
) -> dict[str, Any] | None:
    """The manifest's ``store`` entry: how a Parquet store keeps its floats (None for JSONL, which has none;
    ``float16`` there is refused, the error saying ``jsonl_fix``)."""
    if fmt == "jsonl":
        if float16:
            raise InputError(f"{named('float16')} applies to Parquet stores; {jsonl_fix}")
        return None
    return {"format": "parquet", "float16": float16}


def check_results(
    out: Path,
    manifest: dict[str, Any] | None,
    resume: bool,
    overwrite: bool = False,
    rules: ResumeRules = ResumeRules(),
    fmt: StoreFormat | None = None,
) -> bool:
    """Whether writing the store ``out`` resumes it (``jsonl.check_output`` or ``shard_writer.check_store``, by
    ``fmt``, default the store's own format); refusals name every setting that differs."""
    return REGISTRY[fmt or results_format(out)].check(out, manifest, resume, overwrite, rules)


def open_results(
    out: Path,
    manifest: dict[str, Any],
    *,
    resume: bool,
    overwrite: bool = False,
    rules: ResumeRules = ResumeRules(),
    hashes: dict[str, str] | None = None,
    fmt: StoreFormat | None = None,
    timed: bool = True,
) -> ResultWriter | ShardWriter:
    """A writer for the store ``out`` in ``fmt`` (default: the store's own format, see ``results_format``).

    Both append records with ``write`` and keep what they hold on ``flush``: a JSONL line is on disk once
    written; a Parquet shard is committed every 256 records, at each ``flush``, and (``timed``) once a record
    comes ``COMMIT_S`` seconds or more after the last commit.
    """
    return REGISTRY[fmt or results_format(out)].open(out, manifest, resume, overwrite, rules, hashes, timed)


def input_shards(path: Path) -> list[Path] | None:
    """The Parquet files an input is read from: the file itself, a store's committed shards, or None (JSONL)."""
    if path.is_dir():
        return committed_shards(path)
    return [path] if path.suffix == ".parquet" else None


def read_inputs(path: Path, skip_bad: bool = False) -> tuple[list[InputRecord], list[BadLine]]:
    """Input records from JSONL, a Parquet file with the same columns (by its ``.parquet`` name), or a Parquet
    store (a directory: a sample store's ``samples/``, whose rows hold ``prompt_ids`` + ``token_ids``)."""
    shards = input_shards(path)
    if shards is None:
        return read_records(path, skip_bad)
    if not path.exists():
        raise InputError(f"input file {str(path)!r} does not exist")
    if path.is_dir():  # a store: its committed records, each shard checked as every reader checks it
        rows = list(iter_store(path))
    else:
        try:
            rows = pq.read_table(path).to_pylist()
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"input {str(path)!r} is not readable Parquet ({exc})") from None
    collected = RecordCollector(skip_bad, unit="row")
    for number, row in enumerate(rows, start=1):  # a column a row does not have is null: left out
        collected.add(number, f"{path}: row {number}", functools.partial(_present, row))
    return collected.records, collected.bad


def _present(row: dict[str, Any]) -> dict[str, Any]:
    """A Parquet row's fields that hold a value (a null is a column the row does not have)."""
    return {k: v for k, v in row.items() if v is not None}
