"""Resume semantics: changed inputs are rescored, harmless settings may change, summaries are never silently
replaced, interruptions say how to go on, and a full disk leaves no torn record."""

from __future__ import annotations

import errno
import json
import os

import pytest

from depthlens.config import GenerateRun, SamplingConfig, ScoreRun, StoreSpec, VotingConfig
from depthlens.errors import StoreError
from depthlens.evals.tasks import Question
from depthlens.stores import jsonl as records
from depthlens.stores.jsonl import iter_jsonl
from depthlens.studies.generate import generate
from depthlens.studies.score import ScoreEvents, run_score
from depthlens.studies.thinkn import summarise
from tests.test_cli import run


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"id": f"r{i}", "prompt_ids": [4, 5 + i], "completion_ids": [7, 8, 9 + i]} for i in range(4)]


def test_resume_rescores_records_whose_input_changed(tiny_llama, tmp_path):
    src, out = _write(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out)))
    changed = [*ROWS[:2], {**ROWS[2], "completion_ids": [7, 8]}, ROWS[3]]
    _write(src, changed)
    rescored = []
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out, resume=True)), ScoreEvents(on_rescore=rescored.extend))
    assert rescored == ["r2"]
    fresh = tmp_path / "fresh.jsonl"
    run_score(tiny_llama, ScoreRun(src, StoreSpec(fresh)))
    by_id = {r["id"]: r for r in iter_jsonl(out)}
    assert [by_id[r["id"]] for r in iter_jsonl(fresh)] == list(iter_jsonl(fresh))  # r2 moved to the end


def test_disk_full_leaves_whole_records_and_resume_completes(tiny_llama, tmp_path, monkeypatch):
    src, out = _write(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    real_fsync, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 4:  # the manifest, two records, then the third
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StoreError, match="the disk is full; what finished before is kept"):
        run_score(tiny_llama, ScoreRun(src, StoreSpec(out)))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert out.read_text().endswith("\n") and [r["id"] for r in iter_jsonl(out)] == ["r0", "r1"]
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out, resume=True)))
    whole = tmp_path / "whole.jsonl"
    run_score(tiny_llama, ScoreRun(src, StoreSpec(whole)))
    assert list(iter_jsonl(out)) == list(iter_jsonl(whole))


def _questions(n):
    return [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(n)]


def test_generate_resume_accepts_batch_size_and_more_questions(tiny_chat, tmp_path):
    sampling = SamplingConfig(max_new_tokens=4, readout_tokens=None)
    store = tmp_path / "s"
    generate(tiny_chat, GenerateRun(StoreSpec(store), pool=4, batch_size=4, sampling=sampling), _questions(1))
    report = generate(
        tiny_chat,
        GenerateRun(StoreSpec(store, resume=True), pool=4, batch_size=2, sampling=sampling),
        _questions(2),
    )
    assert report.skipped == 4 and report.written == 4
    assert report.changed == [
        "batch_size: stored 4, this run 2",
        "questions: stored ['q0'], this run ['q0', 'q1']",
    ]
    with pytest.raises(StoreError, match=r"questions: stored \['q0', 'q1'\], this run \['q1'\]"):
        generate(
            tiny_chat,
            GenerateRun(StoreSpec(store, resume=True), pool=4, sampling=sampling),
            _questions(2)[1:],
        )
    with pytest.raises(StoreError, match="pool: stored 4, this run 3"):
        generate(
            tiny_chat, GenerateRun(StoreSpec(store, resume=True), pool=3, sampling=sampling), _questions(2)
        )


def test_summaries_are_named_by_settings_and_never_silently_replaced(tiny_chat, tmp_path):
    store = tmp_path / "s"
    generate(
        tiny_chat,
        GenerateRun(StoreSpec(store), pool=4, sampling=SamplingConfig(max_new_tokens=4)),
        _questions(2),
    )
    summarise(store, VotingConfig(n=2, trials=2, rank_prefix=3))
    summarise(store, VotingConfig(n=3, trials=2, rank_prefix=3))
    assert sorted(p.name for p in store.glob("thinkn-*.json")) == [
        "thinkn-n2-eta0.5-l3.json",
        "thinkn-n3-eta0.5-l3.json",
    ]
    # the same settings: the same summary, rewritten
    summarise(store, VotingConfig(n=2, trials=2, rank_prefix=3))
    with pytest.raises(
        StoreError, match=r"other settings \(voting.trials: stored 2, this run 5\); pass overwrite"
    ):
        summarise(store, VotingConfig(n=2, trials=5, rank_prefix=3))
    summarise(store, VotingConfig(n=2, trials=5, rank_prefix=3), overwrite=True)
    assert json.loads((store / "thinkn-n2-eta0.5-l3.json").read_text())["voting"]["trials"] == 5


@pytest.mark.parametrize(("signal_name", "code"), [("Terminated", 143), ("KeyboardInterrupt", 130)])
def test_interrupt_says_what_was_kept_and_how_to_continue(signal_name, code, tmp_path, monkeypatch, capsys):
    from depthlens.cli import app
    from tests.conftest import tiny_model

    model = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(model)
    src, out = _write(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    real_write = records.ResultWriter.write
    signal_type = app.Terminated if signal_name == "Terminated" else KeyboardInterrupt

    def write(self, record):
        if record["id"] == "r2":
            raise signal_type
        real_write(self, record)

    monkeypatch.setattr(records.ResultWriter, "write", write)
    got, _, err = run(
        monkeypatch, capsys, "score", "--model", model, "--in", src, "--out", out, "--overwrite"
    )
    assert got == code
    what = "terminated" if code == 143 else "interrupted"
    assert f"{what}: 2 finished record(s) kept in {out}" in err
    assert f"continue with: depthlens score --model {model} --in {src} --out {out} --resume" in err
