"""The sample store (``depthlens generate`` / ``thinkn --out``): its files, its manifest, its record schema, the
one rounding rule of its floats, and the one reader every study uses (docs/architecture.md, "The sample store").
What a run writes into it — its manifest, resume rules, the format picked — is ``stores.sample_writes``.

A store is a directory:
- ``questions.jsonl`` — the questions, reference answers and choices, as generated;
- ``samples/`` — the responses as a sharded Parquet store (the default), or ``samples.jsonl`` (``--store jsonl``,
  and every store written before Parquet) with ``samples.jsonl.manifest.json``;
- ``thinkn-n<n>-eta<η>-l<ℓ>.json`` / ``.csv`` — one summary per voting setting (``studies.thinkn``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthlens import __version__
from depthlens.config import (
    StoreFormat,
)
from depthlens.errors import InputError, StoreError, named
from depthlens.sampling.backend import PER_TOKEN
from depthlens.stores.files import manifest_path, read_json
from depthlens.stores.formats import FORMATS
from depthlens.stores.layout import Problem, Refused, is_store, manifest_file, without_manifest
from depthlens.stores.names import current_names, divergence_field
from depthlens.stores.parquet import iter_store_located
from depthlens.stores.records import record_problem, wrong_fields
from depthlens.stores.shortfall import say, shortfall

if TYPE_CHECKING:
    pass

STORE_VERSION = 1
MANIFEST_FIX = (
    "a manifest is written whole, so it was edited or damaged outside depthlens: restore it from a copy of the "
    "store (the responses are untouched; `depthlens check {store}` lists them)"
)
QUESTIONS = "questions.jsonl"
SHARDS = "samples"  # the responses of a sharded store (the default): a Parquet store directory
SAMPLES = "samples.jsonl"  # or, in a JSONL store, one line per response
REQUIRED = (
    "id",
    "question_id",
    "sample",
    "status",
    "token_count",
    "vote_key",
    "correct",
    *PER_TOKEN,
    "divergence",
)
"""The fields of a usable (``status: ok``) response record that voting and the studies read."""

DEPTH_FIELDS = ("settling_depth", "deep", "dtr", "dtr_prefix", "mean_settling_depth")
"""The depth a response record carries beside its divergences (``metrics.dtr.response_depth``), computed with the
manifest's ``dtr`` settings, ``dtr_prefix`` over its ``depth.prefix`` tokens. A store written before them lacks them
(readers derive them: ``studies.pool_table``; ``depthlens regrade`` writes them in)."""

STORED_DIGITS = 5
"""Per-token floats are stored rounded to 5 decimals (a divergence row costs ~9 bytes per layer in JSONL). A live
online run decides on values rounded the same way, so a replay of its store makes its decisions bit for bit."""


def stored(values: Sequence[float]) -> list[float]:
    """``values`` as a store keeps them (``STORED_DIGITS`` decimals)."""
    return [round(v, STORED_DIGITS) for v in values]


def stored_rows(rows: Sequence[Sequence[float]]) -> list[list[float]]:
    """Rows of per-layer values (a divergence table) as a store keeps them."""
    return [stored(row) for row in rows]


def samples_path(out_dir: Path, fmt: StoreFormat) -> Path:
    """Where a store's responses are: ``samples/`` (a sharded Parquet store) or ``samples.jsonl``."""
    return out_dir / (SHARDS if fmt == "parquet" else SAMPLES)


_picked: contextvars.ContextVar[StoreFormat | None] = contextvars.ContextVar("picked_format", default=None)


@contextlib.contextmanager
def picking(fmt: str | None) -> Iterator[None]:
    """Read the responses in ``fmt`` where a directory holds both formats (``--store`` of a reading command, as
    given: checked here)."""
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"{named('store')} {fmt!r}: use one of {', '.join(FORMATS)}")
    token = _picked.set(fmt)  # one of FORMATS (narrowed by the check above), or None
    try:
        yield
    finally:
        _picked.reset(token)


def two_stores(out_dir: Path) -> StoreError:
    """The refusal of a directory holding a store of responses in each format."""
    return StoreError(
        f"{out_dir} holds two stores of responses, {out_dir / SHARDS}/ (parquet) and {out_dir / SAMPLES} (jsonl); "
        f"pick one with {named('store')} parquet or {named('store')} jsonl, or move the other out of the directory"
    )


def stored_format(out_dir: Path) -> StoreFormat:
    """The format of the responses in ``out_dir``: Parquet where ``samples/`` has its manifest, JSONL where
    ``samples.jsonl`` is (also where there is no store yet). A directory with both is refused naming them, unless
    a reading command picked one (``picking``)."""
    sharded, jsonl = is_store(out_dir / SHARDS), (out_dir / SAMPLES).exists()
    if sharded and jsonl:
        picked = _picked.get()
        if picked is None:
            raise two_stores(out_dir)
        return picked
    return "parquet" if sharded else "jsonl"


def samples_manifest(out_dir: Path) -> Path:
    """The manifest of a store's responses: beside ``samples.jsonl``, or inside the sharded ``samples/``."""
    if stored_format(out_dir) == "parquet":
        return manifest_file(out_dir / SHARDS)
    return manifest_path(out_dir / SAMPLES)


def iter_samples(out_dir: Path) -> Iterator[dict[str, Any]]:
    """A store's response records, from ``samples.jsonl`` or from every shard of ``samples/`` read as one."""
    for _, record in iter_store_located(samples_path(out_dir, stored_format(out_dir))):
        yield current_names(record)


def manifest_lost(out_dir: Path) -> str | None:
    """Where ``out_dir`` holds responses whose manifest (their commit) is gone — shards without theirs, or
    ``samples.jsonl`` without its own — what every reader says (the store is damaged, not missing), else None."""
    jsonl, meta = out_dir / SAMPLES, manifest_path(out_dir / SAMPLES)
    if jsonl.is_file() and not meta.is_file() and not is_store(out_dir / SHARDS):
        return (
            f"{meta}: missing — the store's manifest (its commit) is gone: the store is damaged; restore the "
            "manifest from a copy of the store"
        )
    return without_manifest(out_dir / SHARDS)


def read_manifest(out_dir: Path) -> dict[str, Any]:
    """The store's manifest, checked: a version this depthlens reads, and the fields readers rely on."""
    samples, meta = samples_path(out_dir, stored_format(out_dir)), samples_manifest(out_dir)
    if not samples.exists() or not meta.is_file():
        lost = manifest_lost(out_dir)
        if lost:
            raise StoreError(lost)
        raise StoreError(
            f"{out_dir} is not a depthlens sample store (no {SAMPLES} or {SHARDS}/ with its manifest); "
            "create one with `depthlens generate`"
        )
    manifest = read_json(meta, "store's manifest", MANIFEST_FIX.format(store=out_dir))
    version = manifest.get("store_version")
    if version != STORE_VERSION:
        raise Refused(
            Problem(
                meta,
                "manifest",
                f"a version-{version} store; this depthlens ({__version__}) reads version {STORE_VERSION}",
                "read it with the depthlens that wrote it",
            )
        )
    wrong = wrong_fields(manifest)
    if wrong:
        raise Refused(
            Problem(
                meta,
                "manifest",
                f"field(s) {wrong} missing or of the wrong type",
                MANIFEST_FIX.format(store=out_dir),
            )
        )
    return manifest


def stored_kinds(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The divergence kinds a store holds: the primary one (``divergence``), then ``--also-divergences``."""
    readout = manifest.get("readout", {})
    return (readout.get("divergence", "jsd"), *readout.get("also", ()))


def kind_field(kind: str, manifest: dict[str, Any]) -> str:
    """The record field holding divergence ``kind``: ``divergence`` for the primary one, else ``divergence_<kind>``."""
    return divergence_field(kind, stored_kinds(manifest)[0])


def damaged(where: str, exc: Exception) -> StoreError:
    """A store record whose fields do not have the types `depthlens generate` writes."""
    return StoreError(
        f"{where}: a field has the wrong type or shape ({type(exc).__name__}: {exc}); the store is damaged "
        "or was not written by `depthlens generate`"
    )


def read_responses(out_dir: Path, fields: Sequence[str] = REQUIRED) -> Iterator[tuple[str, dict[str, Any]]]:
    """The one reader of a store's responses: (where, record) for each, ``where`` naming the file and line (JSONL)
    or the shard and row (Parquet). A record ``response_problem`` finds wrong raises StoreError naming it; failed
    ones (``status: failed``) are yielded as they are, for the caller to count. Read to its end, a store holding
    fewer responses than its manifest's questions × pool is said in a warning (``stores.shortfall``)."""
    manifest = read_manifest(out_dir)
    against = checked_against(manifest)
    store, count = samples_path(out_dir, stored_format(out_dir)), 0
    for where, record in iter_store_located(store):
        current_names(record)
        problem = response_problem(out_dir, where, record, against, fields)
        if problem is not None:
            raise Refused(problem)
        count += 1
        yield where, record
    say(shortfall(store, manifest, count, out_dir))  # a store shorter than its run: said once


def checked_against(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` as ``response_problem`` takes it: its questions a set (looked up once per record)."""
    questions = manifest.get("questions")
    return {**manifest, "questions": frozenset(questions if isinstance(questions, list) else ())}


def response_problem(
    out_dir: Path,
    where: str,
    record: dict[str, Any],
    against: dict[str, Any],
    fields: Sequence[str] = REQUIRED,
) -> Problem | None:
    """What every reader refuses in one response record of the store ``out_dir`` (``against``: its manifest, via
    ``checked_against``), or None: a usable record (``status: ok``) missing any of ``fields``, or whose
    divergences disagree with the manifest (layers, kinds); then its values against each other and the store
    (``stores.records``). The explorer (``view.store``) asks this of each record it opens."""
    if record.get("status") != "failed":
        missing = [k for k in fields if k not in record]
        if missing:
            return Problem(
                Path(where),
                "damaged",
                f"missing field(s) {missing} (record {record.get('id')!r}; the store is damaged or was "
                "not written by `depthlens generate`)",
                _record_fix(out_dir),
            )
        wrong_schema = _schema_problem(where, record, against, out_dir)
        if wrong_schema is not None:
            return wrong_schema
    wrong = record_problem(record, against)
    if wrong:
        return Problem(Path(where), "damaged", f"record {record.get('id')!r}: {wrong}", _record_fix(out_dir))
    return None


def _record_fix(out_dir: Path) -> str:
    if stored_format(out_dir) == "parquet":
        return (
            "move that shard out of the store and rerun the command that wrote it with --resume: it computes the "
            "shard's records again"
        )
    return "delete that line and rerun the command that wrote the store with --resume: it computes that record again"


def _schema_problem(
    where: str, record: dict[str, Any], manifest: dict[str, Any], out_dir: Path
) -> Problem | None:
    """A record's divergences as its manifest describes them: ``n_layers`` values a row, one field per kind. The
    records were written with the settings their run had, so a disagreement names the manifest as the fault."""
    kinds = stored_kinds(manifest)
    fields = {kind_field(k, manifest) for k in kinds}
    present = {k for k in record if k == "divergence" or k.startswith("divergence_")}
    meta = samples_manifest(out_dir)
    if present - fields or (fields - present and "divergence" in present):
        return Problem(
            meta,
            "manifest",
            f"says the records hold {sorted(fields)} (readout kinds {', '.join(kinds)}), but they hold "
            f"{sorted(present)} ({where}): the manifest's readout was edited outside depthlens",
            "put the divergence kinds the records hold back in the manifest's readout (or restore it from "
            f"a copy of the store); `depthlens check {out_dir}` then says ok",
        )
    rows, n_layers = record.get("divergence"), manifest.get("n_layers")
    if isinstance(rows, list) and rows and isinstance(rows[0], list) and len(rows[0]) != n_layers:
        return Problem(
            meta,
            "manifest",
            f"says n_layers {n_layers}, but the records' divergence rows have {len(rows[0])} "
            f"layers ({where}): the manifest was edited outside depthlens",
            f"set n_layers back to {len(rows[0])} in the manifest (or restore it from a copy of the store); "
            f"`depthlens check {out_dir}` then says ok",
        )
    return None


def kinds_line(manifest: dict[str, Any]) -> str:
    """What divergences a store holds, for errors about an option it cannot honour."""
    kinds = stored_kinds(manifest)
    return f"{kinds[0]}" + (f" (also {', '.join(kinds[1:])})" if kinds[1:] else "")
