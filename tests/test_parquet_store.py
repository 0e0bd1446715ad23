"""Sharded Parquet stores without Ray: the same records as JSONL, resume, settings refused, export, size."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from depthlens.config import ScoreRun, StoreSpec
from depthlens.errors import StoreError
from depthlens.stores.formats import read_inputs
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.parquet import MANIFEST, iter_store, to_table
from depthlens.studies.score import run_score, score_summary
from tests.test_cli import run

ROWS = [
    {
        "id": f"r{i}",
        "prompt_ids": [3 + i, 7, 9],
        "completion_ids": [(11 * i + k) % 90 + 3 for k in range(4 + i)],
    }
    for i in range(5)
]
ROWS.append({"id": "empty", "prompt_ids": [4, 5], "completion_ids": []})


def _write(path, rows=ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def assert_same_results(a: dict, b: dict, float16: bool = False) -> None:
    """Equal per record and per token: summaries to float rounding, per-token floats to the store's width
    (float32: 2e-6 absolute, as the JSONL keeps divergences to 6 decimals; float16: 1e-3 relative)."""
    assert a.keys() == b.keys()
    tol = {"rtol": 1e-3, "atol": 1e-3} if float16 else {"rtol": 1e-6, "atol": 2e-6}
    for rid in a:
        x, y = a[rid], b[rid]
        assert x.keys() == y.keys(), rid
        for key in x:
            u, v = x[key], y[key]
            if key in ("divergence", "tcb", "v_eff", "margin"):
                assert np.allclose(np.asarray(u, float), np.asarray(v, float), **tol), (rid, key)
            elif isinstance(u, float):
                assert v == pytest.approx(u, rel=1e-5, abs=1e-7), (rid, key)
            else:
                assert u == v, (rid, key)


def test_parquet_store_holds_the_jsonl_records(tiny_llama, tmp_path):
    src = _write(tmp_path / "in.jsonl")
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "a.jsonl"), tokens=True))
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "store", float16=False), tokens=True))
    jsonl = {r["id"]: r for r in iter_jsonl(tmp_path / "a.jsonl")}
    parquet = {r["id"]: r for r in iter_store(tmp_path / "store")}
    assert_same_results(jsonl, parquet)
    assert score_summary(iter_store(tmp_path / "store"))["records"] == len(ROWS)
    schema = pq.read_schema(next((tmp_path / "store").glob("part-*.parquet")))
    assert str(schema.field("divergence").type) == "list<element: fixed_size_list<element: float>[3]>"


def test_float16_store_is_smaller_and_close(tiny_llama, tmp_path):
    src = _write(tmp_path / "in.jsonl")
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "a.jsonl"), tokens=True))
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "half", float16=True), tokens=True))
    jsonl = {r["id"]: r for r in iter_jsonl(tmp_path / "a.jsonl")}
    assert_same_results(jsonl, {r["id"]: r for r in iter_store(tmp_path / "half")}, float16=True)


def test_resume_skips_committed_shards_and_refuses_other_settings(tiny_llama, tmp_path):
    src, out = _write(tmp_path / "in.jsonl"), tmp_path / "store"
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out, float16=False), tokens=True))
    before = sorted(p.name for p in out.iterdir())
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out, resume=True, float16=False), tokens=True))
    assert sorted(p.name for p in out.iterdir()) == before
    with pytest.raises(StoreError, match=r"cannot resume .*store\.float16: stored False, this run True"):
        run_score(tiny_llama, ScoreRun(src, StoreSpec(out, resume=True, float16=True), tokens=True))


def test_a_shard_of_another_run_is_refused_naming_the_setting(tiny_llama, tmp_path):
    src = _write(tmp_path / "in.jsonl")
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "a", float16=False), tokens=True))
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "b", float16=False), tokens=False))
    shutil.copy(tmp_path / "b" / "part-000000.parquet", tmp_path / "a" / "part-000000.parquet")
    with pytest.raises(StoreError, match=r"a/part-000000.parquet: a shard of another run \("):
        list(iter_store(tmp_path / "a"))
    shutil.copy(tmp_path / "b" / "part-000000.parquet", tmp_path / "a" / "part-000009.parquet")
    with pytest.raises(StoreError, match="a data file the manifest does not list"):
        list(iter_store(tmp_path / "a"))


def test_parquet_input_scores_like_jsonl(tiny_llama, tmp_path):
    src = _write(tmp_path / "in.jsonl")
    pq.write_table(to_table(ROWS), tmp_path / "in.parquet")
    assert [r.data for r in read_inputs(tmp_path / "in.parquet")[0]] == [r.data for r in read_inputs(src)[0]]
    run_score(tiny_llama, ScoreRun(tmp_path / "in.parquet", StoreSpec(tmp_path / "p.jsonl")))
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "j.jsonl")))
    assert [r["dtr"] for r in iter_jsonl(tmp_path / "p.jsonl")] == [
        r["dtr"] for r in iter_jsonl(tmp_path / "j.jsonl")
    ]


def test_cli_parquet_score_then_export_gives_the_jsonl_records(tmp_path, monkeypatch, capsys):
    from tests.conftest import tiny_model

    tiny_model("llama").save_pretrained(tmp_path / "tiny")
    src = _write(tmp_path / "in.jsonl")
    common = [
        "score",
        "--model",
        str(tmp_path / "tiny"),
        "--in",
        str(src),
        "--device",
        "cpu",
        "--tokens",
        "-q",
    ]
    for args in (
        [*common, "--out", tmp_path / "a.jsonl"],
        [*common, "--out", tmp_path / "store"],
        ["export", tmp_path / "store", "--out", tmp_path / "x.jsonl"],
    ):
        code, _, err = run(monkeypatch, capsys, *args)
        assert code in (0, None), err
    assert (tmp_path / "store" / MANIFEST).is_file()
    assert_same_results(
        {r["id"]: r for r in iter_jsonl(tmp_path / "a.jsonl")},
        {r["id"]: r for r in iter_jsonl(tmp_path / "x.jsonl")},
    )
    assert json.loads((tmp_path / "x.jsonl.manifest.json").read_text())["tokens"] is True


def test_a_sample_store_votes_and_correlates_alike_in_either_format(tiny_chat, tmp_path):
    """The same responses as JSONL (5-decimal text) and as Parquet (float32): the same votes, DTRs and tables."""
    from depthlens.config import DTRConfig, GenerateRun, ReadoutConfig, SamplingConfig, VotingConfig
    from depthlens.evals.tasks import Question
    from depthlens.stores.samples import SHARDS, iter_samples
    from depthlens.studies.correlation import dtr_settings
    from depthlens.studies.generate import generate
    from depthlens.studies.stored import load_store
    from depthlens.studies.thinkn import summarise

    questions = [Question(f"q{i}", f"{i} {i}", str(2 * i)) for i in range(3)]
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=8, readout_tokens=None)
    for fmt in ("jsonl", "parquet"):
        generate(
            tiny_chat,
            GenerateRun(
                StoreSpec(tmp_path / fmt, format=fmt),
                pool=6,
                seed=2,
                sampling=sampling,
                batch_size=4,
                readout=ReadoutConfig(also=("kl",)),
            ),
            questions,
        )
    assert (tmp_path / "parquet" / SHARDS / MANIFEST).is_file() and not (tmp_path / "jsonl" / SHARDS).exists()
    jsonl, parquet = ({r["id"]: r for r in iter_samples(tmp_path / f)} for f in ("jsonl", "parquet"))
    assert jsonl.keys() == parquet.keys()
    for rid, r in jsonl.items():
        assert r["token_ids"] == parquet[rid]["token_ids"] and r["vote_key"] == parquet[rid]["vote_key"]
        assert np.allclose(r["divergence"], parquet[rid]["divergence"], atol=1e-6)
    voting = VotingConfig(n=3, trials=5, rank_prefix=4)
    assert (
        summarise(tmp_path / "jsonl", voting).summaries == summarise(tmp_path / "parquet", voting).summaries
    )
    stores = [load_store(tmp_path / f) for f in ("jsonl", "parquet")]
    settings = [dtr_settings(store, DTRConfig()) for store in stores]
    for kind in ("jsd", "kl"):  # per response, the correlation study's DTR of every divergence kind
        ratios = [
            [st.ratio(r, kind) for r in store.responses] for st, store in zip(settings, stores, strict=True)
        ]
        assert ratios[0] == ratios[1]


def test_a_slow_run_commits_by_time_and_a_store_is_a_score_input(tiny_llama, tmp_path, monkeypatch):
    """A Parquet store commits what it holds every ``commit_s`` (a kill loses no more than that); its
    directory reads back as input, as JSONL does."""
    from depthlens.stores import formats as stores

    monkeypatch.setattr(stores, "COMMIT_S", 0.0)  # every record arrives 'late': a shard each
    src = _write(tmp_path / "in.jsonl")
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "store"), tokens=True))
    manifest = json.loads((tmp_path / "store" / MANIFEST).read_text())
    assert [s["rows"] for s in manifest["shards"]] == [1] * len(ROWS)
    from depthlens.stores.shard_writer import ShardWriter

    with ShardWriter(tmp_path / "inputs", {}, resume=False, shard_rows=4) as writer:
        for row in ROWS:
            writer.write(row)
    assert [r.data for r in read_inputs(tmp_path / "inputs")[0]] == [r.data for r in read_inputs(src)[0]]
