"""Fault injection: each long command is killed with SIGKILL at a seeded random point, resumed with --resume, and
must then hold exactly what an uninterrupted run holds — records and summary.

The kill: a subprocess runs the command with ``DEPTHLENS_FAULT_KILL_AFTER=k``; ``ResultWriter`` writes half of
its (k+1)-th record and SIGKILLs the process (a torn line, as a real kill -9 mid-write leaves); ``ShardWriter``
(a Parquet store) commits k shards and dies with the next one half-written under its temporary name. The
uninterrupted run and the resume run in-process. ``DEPTHLENS_FAULT_POINTS=N`` tries N kill points per command
(default 1).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from depthlens.stores.samples import iter_samples
from tests.conftest import save_chat_model
from tests.test_cli import run
from tests.test_cli_ux import cli

POINTS = int(os.environ.get("DEPTHLENS_FAULT_POINTS", "1"))
SRC = Path(__file__).parent.parent / "src"


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """The tiny llama with a character-level fast tokenizer and a chat template, saved where the CLI loads it."""
    return save_chat_model(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="module")
def score_input(tmp_path_factory):
    path = tmp_path_factory.mktemp("in") / "in.jsonl"
    rng = random.Random(0)
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"r{i}",
                    "prompt_ids": [rng.randrange(3, 100) for _ in range(4)],
                    "completion_ids": [rng.randrange(3, 100) for _ in range(6)],
                }
            )
            + "\n"
            for i in range(8)
        )
    )
    return path


def _commands(tiny: Path, chat: Path, score_input: Path) -> dict[str, tuple[list[str], str, int]]:
    """name → (arguments before --out, the progress file under --out ('' = --out is the file or store), its
    records — for a Parquet store (a directory), its shards: ``DEPTHLENS_FAULT_KILL_AFTER`` counts those)."""
    model = ["--model", str(chat), "--device", "cpu"]
    task = [
        "--task",
        "reasoning_gym:chain_sum",
        "--questions",
        "2",
        "--max-new-tokens",
        "6",
        "--batch-size",
        "2",
    ]
    return {
        "score": (["score", "--model", str(tiny), "--in", str(score_input), "--device", "cpu"], "", 8),
        "score-parquet": (["score", "--model", str(tiny), "--in", str(score_input), "--device", "cpu"], "", 1),
        "generate": (["generate", *model, *task, "--pool", "4", "--readout-tokens", "all", "--store", "jsonl"],
                     "samples.jsonl", 8),
        "generate-parquet": (["generate", *model, *task, "--pool", "4", "--readout-tokens", "all"], "samples", 4),
        "thinkn": (["thinkn", *model, *task, "--n", "2", "--pool", "4", "--prefix", "3", "--trials", "3",
                    "--store", "jsonl"], "samples.jsonl", 8),
        "thinkn-parquet": (["thinkn", *model, *task, "--n", "2", "--pool", "4", "--prefix", "3", "--trials", "3"],
                           "samples", 4),
        "tcb-regimes": (["tcb", "regimes", *model], "regimes.progress.jsonl", 89),
        "tcb-geometry": (["tcb", "geometry", *model, "--top-k", "4"], "geometry.progress.jsonl", 89),
        "tcb-prompts": (["tcb", "prompts", *model, "--questions", "2", "--templates", "bare,terse", "--shots", "0",
                         "--max-new-tokens", "6"], "prompts.progress.jsonl", 4),
        "tcb-trace": (["tcb", "trace", *model, "--max-new-tokens", "6"], "trace.progress.jsonl", 1),
    }  # fmt: skip


def _snapshot(out: Path) -> dict[str, object]:
    """Everything a run leaves, as comparable values (a summary's ``command`` line and path aside)."""
    files = [out] if out.is_file() else sorted(p for p in out.rglob("*") if p.is_file())
    snap: dict[str, object] = {}
    for path in files:
        if path.suffix == ".png" or path.name.endswith(".manifest.json") or path.suffix == ".md":
            continue  # figures embed timestamps; manifests the command line; .md the command too
        if path.name.startswith((".", "_depthlens.lock")):
            continue  # hidden: a lock, a shard set aside
        if (
            path.suffix == ".parquet"
        ):  # a shard: its rows and the settings it was written with (not its run id)
            table = pq.read_table(path)
            meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != b"depthlens.run_id"}
            snap[path.name] = (table.to_pylist(), meta)
            continue
        if path.name == "_manifest.json":  # a Parquet store's: its shards' hashes cover their run id
            data = json.loads(path.read_text())
            data["shards"] = [
                {k: v for k, v in s.items() if k not in ("bytes", "sha256")} for s in data["shards"]
            ]
            snap[f"{path.parent.name}/{path.name}"] = {
                k: v for k, v in data.items() if k not in ("command", "started", "run_id")
            }
            continue
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
            data.pop("command", None)
            data.pop("store", None)  # the store's own path
            data.pop("store_state", None)  # a Parquet store's state includes its run id, new for every run
            snap[path.name] = data
        else:
            snap[path.name] = text
    return snap


KILLED = [
    "score",
    "score-parquet",
    "generate",
    "generate-parquet",
    "thinkn",
    "thinkn-parquet",
    "tcb-regimes",
    "tcb-geometry",
    "tcb-prompts",
    "tcb-trace",
]


@pytest.mark.parametrize("name", KILLED)
def test_killed_run_resumes_to_the_uninterrupted_result(
    name, tmp_path, chat_dir, score_input, monkeypatch, capsys
):
    tiny = chat_dir  # the score case needs no tokenizer, but the same tiny weights serve
    args, progress, records = _commands(tiny, chat_dir, score_input)[name]
    sharded = name.endswith("-parquet")
    suffix = ".jsonl" if not progress and not sharded else ""
    whole = tmp_path / f"whole{suffix}"
    # The TCB studies' float64 values are written to the last digit, and in-process they came out different in the
    # last bits after some earlier tests of the suite (not after any one alone); each of a user's runs is a fresh
    # process, so here the uninterrupted and the resumed TCB runs are too.
    fresh = name.startswith("tcb")

    def again(*more):
        return cli(*args, *more, COLUMNS="400") if fresh else run(monkeypatch, capsys, *args, *more)

    code, _, err = again("--out", whole)
    assert code in (0, None), err
    rng = random.Random(f"{name}")
    for point in range(POINTS):
        k = rng.randrange(records)
        cut = tmp_path / f"cut{point}{suffix}"
        env = {**os.environ, "DEPTHLENS_FAULT_KILL_AFTER": str(k), "PYTHONPATH": str(SRC), "COLUMNS": "400"}
        killed = subprocess.run(
            [sys.executable, "-c", "from depthlens.cli.app import main; main()", *args, "--out", str(cut)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        written = cut if not progress else cut / progress
        if sharded:  # k committed shards and a torn one in flight
            assert len(json.loads((written / "_manifest.json").read_text())["shards"]) == k
            assert len(list(written.glob(".part-*.parquet.tmp"))) == 1
        else:
            lines = written.read_text().split("\n")
            assert len(lines) == k + 1 and lines[-1], "the kill leaves k whole records and a torn one"
        code, _, err = again("--out", cut, "--resume")
        assert code in (0, None), err
        assert _snapshot(cut) == {k.replace("whole", f"cut{point}"): v for k, v in _snapshot(whole).items()}


def test_generate_cli_resumes_with_another_batch_size_and_more_questions(
    tmp_path, chat_dir, monkeypatch, capsys
):
    # The check before the model loads must allow what the store allows (batch size, a longer question list).
    args = [
        "generate",
        "--model",
        str(chat_dir),
        "--device",
        "cpu",
        "--task",
        "reasoning_gym:chain_sum",
        "--max-new-tokens",
        "4",
        "--pool",
        "2",
        "--out",
        str(tmp_path / "s"),
    ]
    code, _, err = run(monkeypatch, capsys, *args, "--questions", "1", "--batch-size", "2")
    assert code in (0, None), err
    code, _, err = run(monkeypatch, capsys, *args, "--questions", "2", "--batch-size", "1", "--resume")
    assert code in (0, None), err
    ids = [r["id"] for r in iter_samples(tmp_path / "s")]
    assert sorted(ids) == ["chain_sum-0#0", "chain_sum-0#1", "chain_sum-1#0", "chain_sum-1#1"]
    code, _, err = run(monkeypatch, capsys, *args, "--questions", "2", "--seed", "1", "--resume")
    assert code == 2 and "seed: stored 0, this run 1" in " ".join(err.split())


def test_a_run_that_made_nothing_usable_exits_2_and_its_remedies_work(
    tmp_path, chat_dir, monkeypatch, capsys
):
    """Every response failing (here the device running out of memory) ends `generate` with exit 2 naming the cause,
    `thinkn --from` on that store says the same instead of "generate more", and the remedy both name — generate
    again with --overwrite once the cause is gone — gives a store `thinkn --from` votes on."""
    from depthlens.sampling.hf import HFGenerator

    args = [
        "generate",
        "--model",
        str(chat_dir),
        "--device",
        "cpu",
        "--task",
        "reasoning_gym:chain_sum",
        "--questions",
        "1",
        "--max-new-tokens",
        "4",
        "--pool",
        "2",
        "--out",
        str(tmp_path / "s"),
    ]
    real_start = HFGenerator.start

    def out_of_memory(*a: object, **k: object) -> None:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(HFGenerator, "start", out_of_memory)
    code, _, err = run(monkeypatch, capsys, *args)
    line = " ".join(err.split())
    assert code == 2 and "2 failed" in line, err
    assert (
        f"error: {tmp_path / 's'}: all 2 responses this run sampled failed (the first: RuntimeError: CUDA out of "
        "memory), so it made nothing usable; fix that, then generate again with --overwrite (--resume does not "
        "retry failed responses)"
    ) in line
    code, _, err = run(monkeypatch, capsys, "thinkn", "--from", tmp_path / "s", "--n", "2")
    assert code == 2 and "generate more" not in err
    assert (
        f"error: {tmp_path / 's'}: all 2 of its responses failed to generate (the first: RuntimeError: CUDA out "
        "of memory), so there is nothing to vote on; fix that, then generate the store again with --overwrite"
    ) in " ".join(err.split())
    code, _, err = run(monkeypatch, capsys, *args, "--resume")  # the failed records are kept, not retried
    assert code == 0 and "2 already there" in " ".join(err.split()), err
    monkeypatch.setattr(HFGenerator, "start", real_start)  # the cause fixed; the remedy followed
    code, _, err = run(monkeypatch, capsys, *args, "--overwrite")
    assert code == 0 and "wrote 2 responses" in err, err
    code, out, err = run(monkeypatch, capsys, "thinkn", "--from", tmp_path / "s", "--n", "2")
    assert code == 0 and "think@n" in out, err
