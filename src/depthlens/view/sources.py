"""Which store a path holds and what it is read with: its kind and root (``identify``), its manifest read by the
library's own readers — or, where they refuse, what of it still parses, with a notice — and the source of its
records (``access``), the model's depth from the stored divergences where no manifest says it, and its DTR
settings. ``view.store`` opens a store on these."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from depthlens.config import DTRConfig
from depthlens.errors import DepthlensError, InputError
from depthlens.stores import samples
from depthlens.stores.access import ParquetSource
from depthlens.stores.commits import committed_problem
from depthlens.stores.files import manifest_path
from depthlens.stores.jsonl_access import JsonlSource
from depthlens.stores.jsonl_checks import jsonl_commit_problem
from depthlens.stores.layout import MANIFEST, is_store, manifest_file
from depthlens.stores.parquet import store_manifest
from depthlens.stores.samples import SAMPLES

Kind = Literal["samples", "scores", "tcb"]
TRACE = "trace.progress.jsonl"  # `depthlens tcb trace`'s record: per generated token δ, V_eff, perplexity
EXPECTED = (
    f"a sample store directory (from `depthlens generate` or `thinkn --out`: samples/ with its {MANIFEST}, or "
    "samples.jsonl with samples.jsonl.manifest.json), a score store (from `depthlens score`: a directory with "
    f"{MANIFEST} and part-*.parquet shards, or a .jsonl file with its .manifest.json beside it) or a TCB "
    f"trace (from `depthlens tcb trace`: a directory with {TRACE})"
)


def identify(path: Path) -> tuple[Kind, Path]:
    """The kind of store at ``path`` and its root (a sample store's directory, a score store's directory or
    file); InputError naming what was expected when it is none. Reads no record."""
    if not path.exists():
        raise InputError(f"{path}: no such file or directory; give {EXPECTED}")
    if path.is_dir():
        if (path / samples.SHARDS).is_dir() or (path / SAMPLES).is_file():
            return "samples", path
        if path.name == samples.SHARDS and (path.parent / samples.QUESTIONS).is_file():
            return "samples", path.parent  # the samples/ directory itself
        if is_store(path) or any(path.glob("part-*.parquet")):
            return "scores", path
        if (path / TRACE).is_file():
            return "tcb", path
    elif path.name == SAMPLES:
        return "samples", path.parent
    elif path.name == TRACE:
        return "tcb", path.parent
    elif path.suffix == ".jsonl" and manifest_path(path).is_file():
        return "scores", path
    what = "a directory" if path.is_dir() else "a file"
    raise InputError(
        f"{path}: not a depthlens store ({what} with none of the files one holds); give {EXPECTED}"
    )


def open_samples(root: Path, notices: list[str]) -> tuple[dict[str, Any], ParquetSource | JsonlSource]:
    """A sample store's manifest and the source of its responses; a refused manifest, or records removed since
    their commit, become notices and the settings are taken from what is left."""
    sharded = (root / samples.SHARDS).is_dir() and not (root / SAMPLES).exists()
    try:
        manifest = samples.read_manifest(root)
    except DepthlensError as exc:
        notices.append(f"{exc} — shown: what the store's records hold")
        manifest = read_loose(
            manifest_file(root / samples.SHARDS) if sharded else manifest_path(root / SAMPLES)
        )
    source: ParquetSource | JsonlSource
    if sharded:
        source = parquet = ParquetSource(root / samples.SHARDS, manifest or None, notices)
        manifest = {**parquet.settings(), **manifest}
        lost = committed_problem(root / samples.SHARDS, manifest)  # shards removed with their entries
        if lost is not None:
            notices.append(
                f"{lost.message()} — every reader (export, thinkn --from, report) refuses this store; shown: what "
                "the manifest lists"
            )
    else:
        source = JsonlSource(root / SAMPLES, notices)
        lost = jsonl_commit_problem(root / SAMPLES, verify=False)  # records removed since their commit
        if lost is not None and lost.kind == "cut":  # an edited record is named when it opens
            notices.append(
                f"{lost.message()} — every reader (export, thinkn --from, report) refuses this store; shown: what "
                "the file holds"
            )
    return manifest, source


def open_scores(root: Path, notices: list[str]) -> tuple[dict[str, Any], ParquetSource | JsonlSource]:
    """A score store's manifest and the source of its records; a refused manifest becomes a notice."""
    try:
        manifest = store_manifest(root)
    except DepthlensError as exc:
        notices.append(f"{exc} — shown: what the store's records hold")
        manifest = read_loose(manifest_file(root) if root.is_dir() else manifest_path(root))
    if root.is_dir():
        parquet = ParquetSource(root, manifest or None, notices)
        return {**parquet.settings(), **manifest}, parquet
    return manifest, JsonlSource(root, notices)


def read_loose(path: Path) -> dict[str, Any]:
    """Whatever of a manifest still parses as a JSON object ({} when nothing does): a refused manifest's settings
    may still name the model and the DTR settings."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def stored_layers(source: ParquetSource | JsonlSource) -> int | None:
    """The model's depth from the stored divergences' width, where no manifest says it."""
    if isinstance(source, ParquetSource):
        return source.matrix_width("divergence")
    for _, record in source.records():
        rows = record.get("divergence")
        if isinstance(rows, list) and rows and isinstance(rows[0], list):
            return len(rows[0])
    return None


def manifest_dtr(manifest: dict[str, Any], notices: list[str]) -> DTRConfig:
    """The store's DTR settings; unreadable ones are a notice and the defaults are used."""
    if "study" in manifest:  # a TCB study reads out no layers: no DTR settings to miss
        return DTRConfig()
    try:
        return DTRConfig.from_dict(manifest["dtr"])
    except (KeyError, TypeError, DepthlensError):
        notices.append("no readable DTR settings (g, ρ, deep rule) in the manifest; the defaults are used")
        return DTRConfig()
