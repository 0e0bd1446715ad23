"""Scoring files: record shapes, bad input, crash-safe output and resume."""

from __future__ import annotations

import json

import pytest

from depthlens.config import DTRConfig, ScoreRun, StoreSpec
from depthlens.errors import InputError, StoreError
from depthlens.stores.files import manifest_path
from depthlens.stores.jsonl import iter_jsonl
from depthlens.studies.score import ScoreEvents, run_score, score
from depthlens.studies.scoring import SUMMARY_FIELDS


def _write(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def _records(n=5):
    return [
        {
            "id": f"r{i}",
            "prompt_ids": [3 + i, 7, 9],
            "completion_ids": [(11 * i + k) % 90 + 3 for k in range(4 + i)],
        }
        for i in range(n)
    ]


def test_score_in_memory_fields(tiny_llama):
    results = score(tiny_llama, _records(2), tokens=True, dtr=DTRConfig(dtr_prefix_tokens=2))
    assert [r["id"] for r in results] == ["r0", "r1"]
    for r, rec in zip(results, _records(2), strict=True):
        assert set(SUMMARY_FIELDS) <= set(r)
        assert (
            r["token_count"] == len(rec["completion_ids"]) == len(r["settling_depth"]) == len(r["divergence"])
        )
        assert r["token_ids"] == rec["completion_ids"]
        assert all(len(row) == tiny_llama.n_layers for row in r["divergence"])
        assert 0 <= r["dtr"] <= 1 and 0 <= r["dtr_prefix"] <= 1
        assert r["dtr"] == sum(r["deep"]) / r["token_count"]


def test_empty_completion_gives_null_metrics(tiny_llama):
    (r,) = score(tiny_llama, [{"id": "e", "prompt_ids": [5, 6], "completion_ids": []}])
    assert "n_tokens" not in r and r["token_count"] == 0
    assert r["dtr"] is None and r["log_prob"] is None and r["self_certainty"] is None


def test_batching_gives_the_same_scores(tiny_llama):
    one = score(tiny_llama, _records(5), batch_size=1)
    many = score(tiny_llama, _records(5), batch_size=3)
    for a, b in zip(one, many, strict=True):
        assert a.keys() == b.keys()
        assert a["id"] == b["id"]
        for key in SUMMARY_FIELDS:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_text_records_need_a_tokenizer(tiny_llama):
    with pytest.raises(InputError, match="has no tokenizer; give 'prompt_ids' and 'completion_ids'"):
        score(tiny_llama, [{"id": "t", "prompt": "hi", "completion": "there"}])


def test_malformed_line_is_named_or_skipped(tiny_llama, tmp_path):
    src = _write(tmp_path / "in.jsonl", [_records(1)[0], "{not json", {"id": "x", "prompt": "no completion"}])
    with pytest.raises(InputError, match=r"in.jsonl:2: not valid JSON .* \(pass skip_bad"):
        run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "out.jsonl")))
    skipped = run_score(
        tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "out.jsonl", overwrite=True), skip_bad=True)
    )
    assert [b.line for b in skipped] == [2, 3]
    assert "needs 'prompt' + 'completion'" in skipped[1].reason
    assert [r["id"] for r in iter_jsonl(tmp_path / "out.jsonl")] == ["r0"]


def test_duplicate_ids_and_too_long_records(tiny_llama, tmp_path):
    src = _write(tmp_path / "dup.jsonl", [_records(1)[0], _records(1)[0]])
    with pytest.raises(InputError, match="id 'r0' already used on line 1"):
        run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "o.jsonl")))
    long = {"id": "long", "prompt_ids": [5] * 250, "completion_ids": [6] * 10}
    src = _write(tmp_path / "long.jsonl", [_records(1)[0], long])
    with pytest.raises(InputError, match=r"line 2 \(id 'long'\): 260 tokens .* context of 256") as info:
        run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "o2.jsonl")))
    assert "kept in" in str(info.value)
    assert [r["id"] for r in iter_jsonl(tmp_path / "o2.jsonl")] == ["r0"]  # finished work is kept
    skipped = run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "o3.jsonl"), skip_bad=True))
    assert [b.line for b in skipped] == [2]


def test_interrupted_run_resumes_to_the_same_output(tiny_llama, tmp_path):
    src = _write(tmp_path / "in.jsonl", _records(5))
    full = tmp_path / "full.jsonl"
    run_score(tiny_llama, ScoreRun(src, StoreSpec(full), tokens=True, batch_size=2))

    out = tmp_path / "part.jsonl"
    seen = []

    def crash_after_two(result):
        seen.append(result["id"])
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_score(
            tiny_llama,
            ScoreRun(src, StoreSpec(out), tokens=True, batch_size=2),
            ScoreEvents(on_record=crash_after_two),
        )
    assert len(list(iter_jsonl(out))) == 2
    with out.open("a") as f:
        f.write('{"id": "r2", "n_tok')  # a write torn by the crash
    with pytest.raises(StoreError, match="already exists; pass resume"):
        run_score(tiny_llama, ScoreRun(src, StoreSpec(out), tokens=True, batch_size=2))
    with pytest.raises(StoreError, match="tokens: stored True, this run False"):
        run_score(tiny_llama, ScoreRun(src, StoreSpec(out, resume=True), tokens=False, batch_size=2))
    progress = []
    run_score(
        tiny_llama,
        ScoreRun(src, StoreSpec(out, resume=True), tokens=True, batch_size=2),
        ScoreEvents(on_start=lambda total, done: progress.append((total, done))),
    )
    assert progress == [(5, 2)]
    assert list(iter_jsonl(out)) == list(iter_jsonl(full))
    manifest = json.loads(manifest_path(out).read_text())
    assert manifest["dtr"] == DTRConfig().to_dict() and manifest["tokens"] is True


def test_a_resumed_score_keeps_the_input_order_after_a_rescore(tiny_llama, tmp_path):
    """A record whose input changed is scored again on --resume and put back where the input has it (it used to
    go to the end), equal to a fresh score of the same input."""
    rows = [{"id": f"r{i}", "prompt_ids": [4, 5 + i], "completion_ids": [7, 8, 9 + i]} for i in range(4)]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out)))
    rows[1] = {**rows[1], "completion_ids": [7, 8]}
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rescored: list[str] = []
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out, resume=True)), ScoreEvents(on_rescore=rescored.extend))
    assert rescored == ["r1"]
    assert [r["id"] for r in iter_jsonl(out)] == ["r0", "r1", "r2", "r3"]
    fresh = tmp_path / "fresh.jsonl"
    run_score(tiny_llama, ScoreRun(src, StoreSpec(fresh)))
    assert list(iter_jsonl(out)) == list(iter_jsonl(fresh))
