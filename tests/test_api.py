"""The Python API (docs/python.md): each verb's table holds what the CLI's code path computes — the stores' records,
``thinkn --from``'s summary, the online store's decisions — and a response's depth is the same in the API table,
the sample store and the score store (issue 42, items 1 and 2's read side)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import depthlens
from depthlens.config import DTRConfig, ScoreRun, StoreSpec, VotingConfig
from depthlens.errors import InputError
from depthlens.metrics.dtr import deep_flags, settling_depth
from depthlens.models.tokens import token_texts
from depthlens.sampling.choose import vllm_available
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.samples import read_responses
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
        assert row["token_count"] == record["n_tokens"] == len(row["token_ids"])
        assert row["dtr"] == record["dtr_readout"]
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
    voting = VotingConfig(n=4, prefix=5, trials=4)
    from_table = depthlens.think_at_n(table, n=4, prefix=5, trials=4).to_pylist()
    from_store = depthlens.think_at_n(out, n=4, prefix=5, trials=4).to_pylist()
    written = summarise(out, voting, overwrite=True)
    from depthlens.studies.thinkn import summary_rows

    expected = summary_rows(written)
    assert [r["method"] for r in from_table] == [r["method"] for r in expected]
    for got, other, want in zip(from_table, from_store, expected, strict=True):
        assert set(got) == set(want)
        assert all(same(got[k], want[k]) and same(other[k], want[k]) for k in want), got["method"]
    import pyarrow as pa

    bare = pa.Table.from_pandas(table.to_pandas())  # through pandas: the manifest it carried is lost
    assert bare.schema.metadata.get(b"depthlens") is None
    assert depthlens.think_at_n(bare, n=4, prefix=5, trials=4).to_pylist() == from_table
    default_n = depthlens.think_at_n(table, methods=["think@n", "cons@n"], trials=2).to_pylist()
    assert {r["method"] for r in default_n} == {"cons@n", "think@n"}
    assert all(r["questions"] == 2 for r in default_n)  # n = the pool of 4, not VotingConfig.n (16)


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
        InputError, match=r"depthlens.generate\(temprature=…\): no such setting; known: .*temperature"
    ):
        depthlens.generate(tiny_chat, TASK, temprature=0.5)


def test_same_response_in_table_sample_store_and_score_store(pooled, tmp_path):
    """Issue 42's "same in all four places", less the server: a response's token ids, token count and depth equal
    in the API table, the sample store and `depthlens score` over the sample store."""
    lm, table, out = pooled
    scores = tmp_path / "scores.jsonl"
    run_score(lm, ScoreRun(out / "samples", StoreSpec(scores), tokens=True, tcb=None))
    scored = {r["id"]: r for r in iter_jsonl(scores)}
    stored = {r["id"]: r for _, r in read_responses(out)}
    for row in table.to_pylist():
        s, rec = scored[row["id"]], stored[row["id"]]
        assert row["token_ids"] == rec["token_ids"] == s["token_ids"]
        assert row["token_count"] == rec["n_tokens"] == s["token_count"] == s["n_tokens"]
        assert float32_close(row["divergence"], s["divergence"], rounded=True)
        assert row["settling_depth"] == s["settling_depth"] and row["deep"] == s["deep"]
        assert float32_close(row["dtr"], s["dtr"]) and float32_close(rec["dtr_readout"], s["dtr"])
        assert float32_close(row["mean_settling_depth"], s["mean_settling_depth"])


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
    assert [r["method"] for r in rows] == ["cons@n", "think@n"]
    for r in rows:
        assert 0 <= float(r["accuracy_mean"]) <= 1 and float(r["cost_mean"]) > 0
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
