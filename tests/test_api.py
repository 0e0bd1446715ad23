"""The Python API (docs/python.md): each verb's table holds what the CLI's code path computes — the stores' records,
``thinkn --from``'s summary, the online store's decisions — and a response's depth is the same in the API table,
the sample store and the score store (issue 42, items 1 and 2's read side)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import depthlens
from depthlens.config import DTRConfig, ScoreRun, StoreSpec, VotingConfig
from depthlens.errors import InputError
from depthlens.metrics.dtr import deep_flags, settling_depth
from depthlens.models.tokens import token_texts
from depthlens.sampling.choose import vllm_available
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.samples import read_manifest, read_responses
from depthlens.studies.online import DECISIONS
from depthlens.studies.score import run_score, score
from depthlens.studies.thinkn import summarise
from tests.tolerance import float32_close

TASK = "reasoning_gym:chain_sum"
SMALL = {"questions": 2, "max_new_tokens": 10, "task_config": "min_terms=2,max_terms=2,max_digits=1"}


def same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN (a summary's empty paired cells)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """A pool of 4 per question on the tiny chat model, kept in a store (read out at every token)."""
    from depthlens.models.load import wrap
    from tests.conftest import CharTokenizer, tiny_model

    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    out = tmp_path_factory.mktemp("api") / "pool"
    table = depthlens.generate(lm, TASK, pool=4, batch_size=4, readout_tokens=None, out=out, **SMALL)
    return lm, table, out


def test_generate_table_is_the_store_with_its_depth(pooled):
    lm, table, out = pooled
    rows = table.to_pylist()
    stored = [r for _, r in read_responses(out)]
    assert [r["id"] for r in rows] == [r["id"] for r in stored] and len(rows) == 2 * 4
    dtr = DTRConfig()
    for row, record in zip(rows, stored, strict=True):
        assert row["token_count"] == record["token_count"] == len(row["token_ids"])
        assert row["dtr"] == record["dtr"]
        assert "n_tokens" not in row and "dtr_readout" not in row  # one name per quantity
        for key in ("token_ids", "prompt_ids", "text", "answer", "correct", "seed"):
            assert row[key] == record[key]
        assert np.allclose(row["divergence"], record["divergence"], atol=0)
        c = settling_depth(torch.tensor(record["divergence"]), dtr.g)
        deep = deep_flags(c, lm.n_layers, dtr.rho)
        assert row["settling_depth"] == c.tolist() and row["deep"] == deep.tolist()
        assert all(1 <= d <= lm.n_layers for d in row["settling_depth"])
        assert row["mean_settling_depth"] == pytest.approx(float(c.double().mean()))
        assert row["dtr_prefix"] == pytest.approx(float(deep[:50].double().mean()))
        assert row["tokens"] == token_texts(lm.tokenizer, row["token_ids"])  # as `score --tokens` labels them
    again = depthlens.responses(out, tokenizer=lm.tokenizer)
    assert again.to_pylist() == rows and again.schema.metadata == table.schema.metadata


def test_a_temporary_store_is_removed(pooled, tmp_path, monkeypatch):
    lm, table, _ = pooled
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    again = depthlens.generate(lm, TASK, pool=4, batch_size=4, readout_tokens=None, **SMALL)
    assert again.to_pylist() == table.to_pylist()  # same seeds, same pool
    assert list(tmp_path.iterdir()) == []


def test_think_at_n_is_thinkn_from(pooled):
    """The same rows from the table, from the store on disk, and in the summary `thinkn --from` writes."""
    _, table, out = pooled
    voting = VotingConfig(n=4, rank_prefix=5, trials=4)
    from_table = depthlens.think_at_n(table, n=4, prefix=5, trials=4).to_pylist()
    from_store = depthlens.think_at_n(out, n=4, prefix=5, trials=4).to_pylist()
    written = summarise(out, voting, overwrite=True)
    from depthlens.studies.thinkn import control_row, summary_rows

    expected = [*summary_rows(written), control_row(written.control)]  # the control's row last
    assert [r["method"] for r in from_table] == [r["method"] for r in expected]
    assert from_table[-1]["vs"] == "random@n" and from_table[-1]["accuracy_mean"] is None
    for got, other, want in zip(from_table, from_store, expected, strict=True):
        assert set(want) <= set(got)
        assert all(same(got[k], want[k]) and same(other[k], want[k]) for k in want), got["method"]
    import pyarrow as pa

    frame = table.to_pandas()  # pyarrow's own: the manifest travels in the frame's attrs, and back
    assert frame.attrs["depthlens"]["manifest"]["pool"] == 4
    bare = pa.Table.from_pandas(frame)
    assert bare.schema.metadata.get(b"depthlens") is None
    assert depthlens.think_at_n(bare, n=4, prefix=5, trials=4).to_pylist() == from_table
    default_n = depthlens.think_at_n(table, methods=["think@n", "cons@n"], trials=2).to_pylist()
    assert {r["method"] for r in default_n} == {"cons@n", "think@n"}
    assert all(r["questions"] == 2 for r in default_n[:2])  # n = the pool of 4, not VotingConfig.n (16)


def test_score_table_is_the_score_results(tiny_chat):
    records = [
        {"id": "a", "prompt": "1 2", "completion": "3 4 5"},
        {"id": "b", "prompt": "7", "completion": "8"},
    ]
    table = depthlens.score(tiny_chat, records, tokens=True)
    assert table.column_names == list(score(tiny_chat, records, tokens=True)[0])
    assert table.to_pylist() == [_float32(r) for r in score(tiny_chat, records, tokens=True)]


def _float32(result: dict) -> dict:
    """A result as the table holds it: float lists (per token, or token × layer) at float32, the stores' width."""
    floats = lambda v: isinstance(v, list) and v and isinstance(v[0], float | list)  # noqa: E731
    return {
        k: np.asarray(v, dtype=np.float32).astype(float).tolist() if floats(v) else v
        for k, v in result.items()
    }


@pytest.fixture(scope="module")
def online_run(pooled, tmp_path_factory):
    lm = pooled[0]
    out = tmp_path_factory.mktemp("api") / "online"
    policy = {"warmup": 2, "max_n": 4, "batch_size": 2, "prefix": 4}
    return depthlens.online(lm, TASK, out=out, **policy, **SMALL), out


def test_online_table_is_the_decisions(online_run):
    table, out = online_run
    lines = list(iter_jsonl(out / DECISIONS))
    assert table.num_rows == 2 and [r["id"] for r in table.to_pylist()] == [r["id"] for r in lines]
    keys = ("answer", "correct", "tokens", "started", "stop")
    for row, line in zip(table.to_pylist(), lines, strict=True):
        assert {k: row[k] for k in keys} == {k: line[k] for k in keys}
    assert depthlens.responses(out).num_rows >= 2 * 2  # the warm-up at least


def test_unknown_setting_is_refused_naming_the_known(tiny_chat):
    with pytest.raises(
        InputError,
        match=r"depthlens.generate\(temprature=…\): no such setting; did you mean temperature\? \(known: .*",
    ):
        depthlens.generate(tiny_chat, TASK, temprature=0.5)


DEPTH = ("token_count", "dtr", "dtr_prefix", "mean_settling_depth", "settling_depth", "deep")


def test_same_response_in_table_sample_store_score_store_and_server(pooled, tmp_path):
    """Issue 42's "same in all four places": each response's token ids, token count and depth — under one name
    each — equal in the Python API's table, the sample store, `depthlens score` over the sample store (at the
    store's prefix) and the server. The server seeds sample i of its prompt 0 as a sample store seeds response i
    of question "0" (``sample_seed``), so one request with the store's seed and the stored prompt ids samples the
    same responses."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from depthlens.config import SamplingConfig, ServeConfig
    from depthlens.evals.tasks import Question
    from depthlens.serve.app import create_app
    from depthlens.serve.engines import HFEngine

    lm = pooled[0]
    out, pool, seed, max_new = tmp_path / "pool", 3, 11, 12
    question = Question("0", "What is 2 + 3?", "5")
    table = depthlens.generate(
        lm, [question], pool=pool, seed=seed, out=out, readout_tokens=None, max_new_tokens=max_new
    )
    prefix = read_manifest(out)["depth"]["prefix"]
    scores = tmp_path / "scores.jsonl"
    run_score(
        lm,
        ScoreRun(
            out / "samples", StoreSpec(scores), dtr=DTRConfig(dtr_prefix_tokens=prefix), tokens=True, tcb=None
        ),
    )
    scored = {r["id"]: r for r in iter_jsonl(scores)}
    stored = {r["id"]: r for _, r in read_responses(out)}
    rows = table.to_pylist()
    sampling = SamplingConfig()
    body = {
        "model": "tiny",
        "prompt": rows[0]["prompt_ids"],
        "n": pool,
        "max_tokens": max_new,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "seed": seed,
        "depthlens": {"tokens": True, "prefix": prefix},
    }
    with TestClient(create_app(HFEngine(lm), lm.tokenizer, ServeConfig("tiny"))) as client:
        reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    choices = sorted(reply.json()["choices"], key=lambda c: c["index"])
    assert len(rows) == len(choices) == pool
    for row, choice in zip(rows, choices, strict=True):
        s, rec, served = scored[row["id"]], stored[row["id"]], choice["depthlens"]
        served = {**served, **{k: served["tokens"][k] for k in ("token_ids", "settling_depth", "deep")}}
        assert row["token_ids"] == rec["token_ids"] == s["token_ids"] == served["token_ids"]
        assert row["seed"] == served["seed"]
        assert "n_tokens" not in s and "dtr_readout" not in rec  # one name per quantity
        for key in DEPTH:
            values = {"table": row[key], "sample store": rec[key], "score": s[key], "server": served[key]}
            if isinstance(row[key], float):
                assert all(float32_close(v, row[key]) for v in values.values()), (key, values)
            else:
                assert all(v == row[key] for v in values.values()), (key, values)
    assert any(row["token_count"] > 1 for row in rows)  # something to compare


def test_an_old_store_reads_with_todays_names_and_regrade_migrates_it(pooled, tmp_path):
    """A store written before one name per quantity (``n_tokens``, ``dtr_readout``, no depth columns) reads with
    today's names and its depth derived; ``regrade`` rewrites it with both, atomically, and reads the same."""
    import shutil

    from depthlens.studies.regrade import regrade_store

    _, table, out = pooled
    old = tmp_path / "old"
    shutil.copytree(out, old)
    samples = old / "samples"
    manifest = json.loads((samples / "_manifest.json").read_text())
    for entry in manifest[
        "shards"
    ]:  # each shard as an older depthlens wrote it, and its manifest entry to match
        shard = samples / entry["file"]
        t = pq.read_table(shard).drop_columns(["settling_depth", "deep", "dtr_prefix", "mean_settling_depth"])
        meta = dict(pq.read_schema(shard).metadata)
        settings = json.loads(meta[b"depthlens.settings"])
        del settings["depth"]
        meta[b"depthlens.settings"] = json.dumps(settings).encode()
        names = {"token_count": "n_tokens", "dtr": "dtr_readout"}
        t = t.rename_columns([names.get(c, c) for c in t.column_names]).replace_schema_metadata(meta)
        pq.write_table(t, shard)
        entry.update(bytes=shard.stat().st_size, sha256=hashlib.sha256(shard.read_bytes()).hexdigest())
    depth = manifest.pop("depth")
    (samples / "_manifest.json").write_text(json.dumps(manifest))
    assert "n_tokens" in pq.read_table(next(samples.glob("*.parquet"))).column_names
    before = depthlens.responses(old).to_pylist()
    keep = [c for c in table.column_names if c != "tokens"]
    assert [{k: r[k] for k in keep} for r in before] == [{k: r[k] for k in keep} for r in table.to_pylist()]
    regrade_store(old)
    shard = pq.read_table(next(samples.glob("*.parquet")))
    assert {"token_count", "dtr", *DEPTH} <= set(shard.column_names) and "n_tokens" not in shard.column_names
    assert read_manifest(old)["depth"] == depth
    after = depthlens.responses(old).to_pylist()
    assert [{k: r[k] for k in DEPTH} for r in after] == [{k: r[k] for k in DEPTH} for r in before]


def test_the_notebook_example_runs_and_shows_something(tmp_path):
    """examples/notebook.py on the tiny chat model (saved where `depthlens.load` finds it), at a tiny size: the
    pool's table, the Think@n vs Cons@n rows and the heatmap are real."""
    import csv
    import os
    import subprocess
    import sys

    from tests.conftest import save_chat_model

    root = Path(__file__).parent.parent
    model, out = save_chat_model(tmp_path / "model"), tmp_path / "out"
    env = {**os.environ, "NOTEBOOK_QUESTIONS": "2", "NOTEBOOK_TOKENS": "12", "PYTHONPATH": str(root / "src")}
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "notebook.py"), str(model), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for column in ("token_count", "dtr", "dtr_prefix", "mean_settling_depth", "cost_vs_cons"):
        assert column in done.stdout
    rows = list(csv.DictReader((out / "thinkn.csv").read_text().splitlines()))
    voted, control = rows[:-1], rows[-1]  # the methods, then Think@n against random@n, its control
    assert [r["method"] for r in voted] == ["cons@n", "think@n", "random@n"]
    assert (control["method"], control["vs"], control["accuracy_mean"]) == ("think@n", "random@n", "")
    for r in voted:
        assert 0 <= float(r["accuracy_mean"]) <= 1 and float(r["cost_mean"]) > 0
    assert "the last row is the study's primary contrast" in done.stdout  # the vote's notes, printed
    figure = out / "heatmap.png"
    assert figure.stat().st_size > 1000 and figure.read_bytes()[:4] == b"\x89PNG"
    code = [line for line in (root / "examples" / "notebook.py").read_text().splitlines() if line.strip()]
    body = code[code.index('"""', 1) + 1 :]  # after the docstring
    assert len([line for line in body if not line.lstrip().startswith("#")]) < 40


DOC = Path(__file__).parent.parent / "docs" / "python.md"


def doc_columns(verb: str) -> dict[str, list[str]]:
    """docs/python.md's column lists of ``depthlens.<verb>``: ``columns`` and, for ``score``, ``tokens``."""
    section = DOC.read_text(encoding="utf-8").split(f"## `depthlens.{verb}(", 1)[1].split("\n## ", 1)[0]
    lists = {}
    for line in section.splitlines():
        for label, key in (("columns: ", "columns"), ("with `tokens=True`, also: ", "tokens")):
            if line.startswith(label):
                lists[key] = re.findall(r"`([^`]+)`", line[len(label) :])
    return lists


def test_the_python_doc_lists_the_columns_the_calls_return(pooled, online_run, tiny_chat):
    _, table, out = pooled
    assert doc_columns("generate")["columns"] == table.column_names
    assert depthlens.responses(out, tokenizer=pooled[0].tokenizer).column_names == table.column_names
    assert doc_columns("think_at_n")["columns"] == depthlens.think_at_n(table, trials=2).column_names
    assert doc_columns("online")["columns"] == online_run[0].column_names
    records = [{"id": "a", "prompt": "1 2", "completion": "3 4"}]
    listed = doc_columns("score")
    assert listed["columns"] == depthlens.score(tiny_chat, records).column_names
    assert (
        listed["columns"] + listed["tokens"] == depthlens.score(tiny_chat, records, tokens=True).column_names
    )


def test_the_readme_wrap_snippet_runs_as_it_is():
    """The README's `depthlens.wrap` example builds its transformers model from a config: no hub, no download."""
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    (snippet,) = [b for b in blocks if "depthlens.wrap(AutoModelForCausalLM" in b]
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)
    scores = scope["scores"]
    assert scores.num_rows == 1 and len(scores.column("settling_depth").to_pylist()[0]) == 3
    assert 0 <= scores.column("dtr").to_pylist()[0] <= 1


@pytest.mark.integration
@pytest.mark.skipif(not vllm_available(), reason="needs the vllm extra: pip install 'depthlens[vllm]'")
def test_generate_on_the_vllm_backend(real_model):
    """`backend="vllm"` samples in a vLLM engine (the tests' float32 engine settings): the same columns and depth."""
    pool = depthlens.generate(
        real_model, TASK, pool=2, batch_size=2, backend="vllm", dtype="float32", max_model_len=512, **SMALL
    )
    assert pool.column_names == doc_columns("generate")["columns"] and pool.num_rows == 2 * 2
    manifest = json.loads(pool.schema.metadata[b"depthlens"])["manifest"]
    assert manifest["engine"]["backend"] == "vllm"
    for row in pool.to_pylist():
        c = settling_depth(torch.tensor(row["divergence"]), DTRConfig().g)
        assert row["settling_depth"] == c.tolist() and len(c) == min(row["token_count"], 50)
