"""Stores for the explorer's tests (``depthlens view``), written by the CLI with the tiny llama and a character
tokenizer saved where the CLI loads it (as tests/test_faults.py does): built once per session, each test copies
what it damages.

- ``samples``: ``generate`` into a sharded Parquet store (3 questions × pool 4, every token read out, g = 0.012
  so the 3-layer model's tokens settle at different layers); ``samples_jsonl``: the same as JSONL;
- ``answers``: the Parquet store's responses with varied answers (the random model states none), rewritten
  through the store's own writer under its own manifest, so votes, ties and right / wrong have something to do;
- ``online``: a live ``thinkn --online`` run (warm-up 2, up to 6 responses, batch 1, decision at ℓ = 3, η 0.25);
- ``scores`` / ``scores_jsonl``: ``score --tokens`` of the JSONL store's responses;
- ``tcb``: a ``tcb trace`` (per generated token δ, V_eff, perplexity; no layers);
- ``lens``: ``generate --layer-top-k 3`` (1 question × pool 2, up to 99 tokens, Parquet): each layer's top-3 per
  read-out token, a response long enough for the logit lens to scroll;
  ``lens_scores``: ``score --tokens --layer-top-k 3`` of the JSONL store's responses (a JSONL score store).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from depthlens.cli.app import main
from depthlens.stores.parquet import store_manifest
from depthlens.stores.samples import SHARDS, iter_samples
from depthlens.stores.shard_writer import ShardWriter
from tests.conftest import save_chat_model

TASK = ["--task", "reasoning_gym:chain_sum", "--task-config", "min_terms=2,max_terms=2,max_digits=1"]
SAMPLE = [
    *TASK,
    "--max-new-tokens",
    "10",
    "--readout-tokens",
    "all",
    "--g",
    "0.012",
    "--temperature",
    "1.0",
    "--answer-fallback",
    "last-number",
    "--device",
    "cpu",
]


def cli(*args: object) -> None:
    """Run ``depthlens ARGS`` in this process; a failure raises with its exit code."""
    saved = sys.argv
    sys.argv = ["depthlens", *map(str, args)]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise AssertionError(f"depthlens {' '.join(map(str, args))} exited {exc.code}") from None
    finally:
        sys.argv = saved


def _answered(source: Path, out: Path) -> None:
    """``source``'s store with answers spread over a few values (right where the key is "1"), rewritten whole
    through ``ShardWriter`` under the same manifest."""
    shutil.copytree(source, out, ignore=shutil.ignore_patterns(SHARDS))
    manifest = {k: v for k, v in store_manifest(source / SHARDS).items() if k != "shards"}
    records = list(iter_samples(source))
    with ShardWriter(out / SHARDS, manifest, resume=False, shard_rows=4) as writer:
        for position, record in enumerate(records):
            key = str((record["sample"] + position // 4) % 3)
            record.update(
                answer=key,
                vote_key=key,
                answer_source="boxed",
                correct=key == "1",
                grade="correct" if key == "1" else "wrong",
            )
            if record["sample"] == 3 and position // 4 == 0:
                record.update(
                    answer=None, vote_key=None, answer_source="none", correct=False, grade="no_answer"
                )
            writer.write(record)


_BUILT: dict[Path, dict[str, Path]] = {}  # one build per session root (two test modules ask for it)


def build_stores(root: Path) -> dict[str, Path]:
    """Every store of the module docstring under ``root`` (built once per ``root``)."""
    if root in _BUILT:
        return _BUILT[root]
    model = save_chat_model(root / "tiny-chat")
    out = {name: root / name for name in ("samples", "samples_jsonl", "answers", "online")}
    common = ["--model", model, *SAMPLE]
    cli("generate", *common, "--questions", "3", "--pool", "4", "--batch-size", "4", "--out", out["samples"])
    cli(
        "generate",
        *common,
        "--questions",
        "3",
        "--pool",
        "4",
        "--batch-size",
        "4",
        "--store",
        "jsonl",
        "--out",
        out["samples_jsonl"],
    )
    _answered(out["samples"], out["answers"])
    cli(
        "thinkn",
        "--online",
        *common,
        "--questions",
        "2",
        "--warmup",
        "2",
        "--max-n",
        "6",
        "--batch-size",
        "1",
        "--prefix",
        "3",
        "--eta",
        "0.25",
        "--consensus",
        "1",
        "--out",
        out["online"],
    )
    out["scores"] = root / "scores"
    out["scores_jsonl"] = root / "scores.jsonl"
    out["lens_scores"] = root / "lens-scores.jsonl"
    scored = {"scores": (), "scores_jsonl": (), "lens_scores": ("--layer-top-k", "3")}
    for name, extra in scored.items():
        cli(
            *("score", "--model", model, "--in", out["samples_jsonl"] / "samples.jsonl", "--out", out[name]),
            *("--tokens", *extra, "--g", "0.012", "--device", "cpu"),
        )
    out["lens"] = root / "lens"
    long = [
        *common[: common.index("--max-new-tokens") + 1],
        "99",  # the tiny model's context (256) less its prompt
        *common[common.index("--max-new-tokens") + 2 :],
    ]
    cli("generate", *long, "--questions", "1", "--pool", "2", "--layer-top-k", "3", "--out", out["lens"])
    out["tcb"] = root / "tcb"
    cli("tcb", "trace", "--model", model, "--device", "cpu", "--max-new-tokens", "8", "--out", out["tcb"])
    _BUILT[root] = out
    return out
