"""What a run writes into a sample store (``stores.samples``): its manifest and the settings a resumed run may
change, the vocabulary entry stored token ids are checked against, its questions, and the format its responses are
written in (picked before any model loads; ``--overwrite`` removes the other)."""

from __future__ import annotations

import datetime
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthlens import __version__
from depthlens.config import (
    PREFIX_TOKENS,
    AnswerConfig,
    DTRConfig,
    EngineConfig,
    ReadoutConfig,
    SamplingConfig,
    StoreFormat,
    depth_prefix,
)
from depthlens.errors import InputError, StoreError, named
from depthlens.evals.grading import RULES
from depthlens.stores.files import ResumeRules, manifest_path
from depthlens.stores.formats import FORMATS, store_entry
from depthlens.stores.records import VOCAB
from depthlens.stores.samples import QUESTIONS, STORE_VERSION, samples_path, two_stores

if TYPE_CHECKING:
    from depthlens.evals.tasks import Question


MANIFEST_DEFAULTS = {
    "sampling": SamplingConfig().to_dict(),
    "readout": ReadoutConfig().to_dict(),
    "dtr": DTRConfig().to_dict(),
    "engine": EngineConfig().to_dict(),  # stores written before the engine was recorded: hf
    "depth": {"prefix": PREFIX_TOKENS},  # stores written before their records carried depth
    "layer_stats": {},  # a caller's statistics (name → m): stores written before them hold none
}
"""Settings a manifest written before a field existed is read with."""
# Batch size and a longer question list change no stored response (a response's seed is its own; a changed batch
# size rounds batched products differently, so floats may differ in the last kept digit), so a resumed run may
# change them. The KV cache's size changes no token either, and a run resumed after running out of it must be able
# to raise it.
RESUME_RULES = ResumeRules(
    defaults=MANIFEST_DEFAULTS,
    # ``vocab_rows``: a store from before it was recorded resumes (the model is compared by name)
    free=("batch_size", "task.questions", "engine.kv_cache_gib", "engine.gpu_memory_utilization", VOCAB),
    extend=("questions",),
)


def store_manifest(
    model: str, n_layers: int | None, questions: Sequence[Question], settings: dict[str, Any]
) -> dict[str, Any]:
    """The manifest of a sample store: ``settings`` holds pool, seed, batch_size, task, sampling, readout, dtr,
    engine, answers (the configs themselves) and any extra entries (``store``, ``online``). ``n_layers`` None (the
    model not loaded yet) and ``answers`` None leave those entries out (a check before loading compares only the
    entries it is given)."""
    settings = dict(settings)
    configs = {key: settings.pop(key) for key in ("sampling", "readout", "dtr", "engine", "answers")}
    answers: AnswerConfig | None = configs["answers"]
    manifest = {
        "store_version": STORE_VERSION,
        "depthlens_version": __version__,
        "model": model,
        "n_layers": n_layers,
        "task": settings.pop("task"),
        "questions": [q.id for q in questions],
        **settings,
        "sampling": configs["sampling"].to_dict(),
        "readout": configs["readout"].to_dict(),
        "dtr": configs["dtr"].to_dict(),
        "depth": {"prefix": depth_prefix(configs["dtr"])},
        "engine": configs["engine"].to_dict(),
        "answers": {**answers.to_dict(), "rules": RULES} if answers is not None else None,
        "command": " ".join(sys.argv),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    return {k: v for k, v in manifest.items() if v is not None or k not in ("n_layers", "answers")}


def vocab_entry(lm: object) -> dict[str, int]:
    """The manifest entry recording the model's vocabulary rows (``stores.records.VOCAB``): stored token ids at or
    past it are refused. Empty for a model that does not say."""
    rows = getattr(lm, "vocab_rows", None)
    return {VOCAB: int(rows)} if isinstance(rows, int) and rows > 0 else {}


def write_questions(out_dir: Path, questions: Sequence[Question]) -> None:
    (out_dir / QUESTIONS).write_text(
        "".join(json.dumps(q.to_dict(), ensure_ascii=False) + "\n" for q in questions), encoding="utf-8"
    )


def samples_format(
    out_dir: Path, requested: StoreFormat | None, resume: bool = False, overwrite: bool = False
) -> StoreFormat:
    """The format a run writes the responses of ``out_dir`` in: the existing store's when resumed (``requested``
    must agree) or neither resumed nor overwritten, else ``requested`` (default Parquet). Needs no model:
    commands check it before loading one."""
    if requested is not None and requested not in FORMATS:
        raise InputError(f"{named('store')} {requested!r}: use one of {', '.join(FORMATS)}")
    found = [f for f in FORMATS if samples_path(out_dir, f).exists()]
    if len(found) > 1 and (overwrite or (resume and requested is not None)):
        found = [requested or "parquet"]  # the flag picks one; --overwrite removes the other
    elif len(found) > 1:
        raise two_stores(out_dir)
    existing: StoreFormat | None = found[0] if found else None
    if existing is not None and not resume and not overwrite:
        return existing  # whose check then says it exists: --resume or --overwrite
    if resume and existing is not None:
        if requested is not None and requested != existing:
            raise StoreError(
                f"{named('store')} {requested}: the store in {out_dir} is {existing}; resume it without "
                f"{named('store')}, or give "
                f"a new {named('out')}"
            )
        return existing
    return requested or "parquet"


def remove_other_format(out_dir: Path, fmt: StoreFormat) -> None:
    """``--overwrite`` with a store of the other format in ``out_dir``: remove it, so one store remains."""
    for other in FORMATS:
        old = samples_path(out_dir, other)
        if other == fmt or not old.exists():
            continue
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
            manifest_path(old).unlink(missing_ok=True)


def samples_entry(fmt: StoreFormat, float16: bool) -> dict[str, Any]:
    """The manifest entries of the responses' format: ``store`` for a Parquet store, nothing for JSONL."""
    entry = store_entry(fmt, float16, jsonl_fix="leave out --store jsonl")
    return {} if entry is None else {"store": entry}
