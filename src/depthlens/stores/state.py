"""Which committed state of a sample store a derived file came from.

Summaries (``thinkn-*.json``), online replays and reports are computed from a store's responses; each records the
store's *state* — a fingerprint of its committed responses — so a reader can tell a summary of this state from one
of an earlier state (before a resume added questions, a regrade, or an ``--overwrite``). A Parquet store's state
is a hash of its run id and its committed shards' hashes (the manifest holds them: nothing is re-read); a JSONL
store's is a hash of its responses file. ``--overwrite`` removes the derived files of the run it replaces.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from depthlens.stores.files import read_json
from depthlens.stores.samples import SHARDS, samples_manifest, samples_path, stored_format

DERIVED = (
    "thinkn-*.json",
    "thinkn-*.csv",
    "thinkn.json",
    "thinkn.csv",
    "online_replay.json",
    "online_sweep.csv",
    "online_sweep.png",
)
"""The files depthlens derives from a store's responses and writes beside them (``report/`` too)."""


def store_state(out_dir: Path) -> str:
    """The fingerprint of the committed responses of the sample store ``out_dir`` (16 hex digits)."""
    if stored_format(out_dir) == "parquet":
        manifest = read_json(samples_manifest(out_dir), "manifest", "see `depthlens check`")
        return manifest_state(manifest, out_dir / SHARDS)
    digest = hashlib.sha256()
    with samples_path(out_dir, "jsonl").open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def manifest_state(manifest: dict[str, Any], shards_dir: Path) -> str:
    """The fingerprint of the Parquet store ``shards_dir`` as ``manifest`` commits it: a hash of its run id and its
    shards' hashes, nothing re-read (a reader holding one manifest gets the state of exactly that snapshot)."""
    digest = hashlib.sha256()
    shards = [(s.get("file"), s.get("sha256") or s.get("rows")) for s in manifest.get("shards", [])]
    digest.update(json.dumps([manifest.get("run_id"), shards]).encode())
    if not all(isinstance(s.get("sha256"), str) for s in manifest.get("shards", [])):
        for name, _ in shards:  # a store of the earlier layout: its shards' sizes stand in for their hashes
            path = shards_dir / str(name)
            digest.update(str(path.stat().st_size if path.is_file() else -1).encode())
    return digest.hexdigest()[:16]


def stale(derived: dict[str, Any], out_dir: Path) -> str | None:
    """Why ``derived`` (a summary's JSON) is not of the store's current state, or None when it is."""
    recorded, now = derived.get("store_state"), store_state(out_dir)
    if recorded == now:
        return None
    if recorded is None:
        return f"it records no store state (written by an earlier depthlens); the store is now at {now}"
    return f"it was computed from state {recorded} of the store, which is now at {now}"


def remove_derived(out_dir: Path) -> list[Path]:
    """Remove the derived files of ``out_dir`` (the run an ``--overwrite`` replaces); returns what was removed."""
    removed = [p for pattern in DERIVED for p in sorted(out_dir.glob(pattern)) if p.is_file()]
    for path in removed:
        path.unlink()
    report = out_dir / "report"
    if (report / "report.md").is_file() or (report / "correlation.json").is_file():
        shutil.rmtree(report)
        removed.append(report)
    return removed
