"""Each layer's top-k on every front (issue 52 item 1): ``--layer-top-k`` on ``score``, ``generate`` and
``heatmap``, ``layer_top_k=`` in Python — one setting, checked once (``studies.resolve``), each front phrasing it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import depthlens
from depthlens.errors import InputError
from depthlens.models.tokens import layer_top_texts
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.samples import iter_samples, read_manifest
from tests.test_api import SMALL, TASK
from tests.test_cli import _input, run, tiny_dir  # noqa: F401  (tiny_dir: a fixture)

RECORDS = [{"id": "a", "prompt": "1 2", "completion": "3 4 5"}]


def test_score_command_keeps_each_layers_top_k(monkeypatch, capsys, tmp_path, tiny_dir):  # noqa: F811
    src, out = _input(tmp_path), tmp_path / "out.jsonl"
    args = ["score", "--model", tiny_dir, "--in", src, "--device", "cpu", "--no-tcb"]
    code, _, err = run(monkeypatch, capsys, *args, "--out", out, "--tokens", "--layer-top-k", "2")
    assert code in (0, None), err
    (record,) = iter_jsonl(out)
    assert np.asarray(record["layer_top_ids"]).shape == (4, 3, 2)
    assert json.loads((tmp_path / "out.jsonl.manifest.json").read_text())["readout"]["layer_top_k"] == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--layer-top-k", "2"],
            "error: --layer-top-k 2: each layer's top-k is kept per token: add --tokens",
        ),
        (["--tokens", "--layer-top-k", "101"], "error: --layer-top-k 101: must be in 1..100, or 0 for none"),
    ],
)
def test_score_command_refuses_a_layer_top_k_it_cannot_keep(monkeypatch, capsys, tmp_path, extra, message):
    src = _input(tmp_path)
    code, _, err = run(
        monkeypatch, capsys, "score", "--model", "x", "--in", src, "--out", tmp_path / "o", *extra
    )
    assert code == 2 and message in err, err


def test_a_vllm_run_takes_layer_top_k(tmp_path):
    """The vLLM engine's worker reads each layer's top-k too (tests/test_vllm_top_k.py): its runs take K."""
    from depthlens.config import EngineConfig, GenerateRun, ReadoutConfig, ScoreRun, StoreSpec

    readout, engine = ReadoutConfig(layer_top_k=2), EngineConfig(backend="vllm")
    run = ScoreRun(tmp_path / "in.jsonl", StoreSpec(tmp_path / "o"), readout, tokens=True, engine=engine)
    assert run.readout.layer_top_k == 2
    assert (
        GenerateRun(StoreSpec(tmp_path / "o"), pool=2, readout=readout, engine=engine).readout.layer_top_k
        == 2
    )


def test_python_score_returns_ids_probabilities_and_labels(tiny_chat):
    table = depthlens.score(tiny_chat, RECORDS, tokens=True, layer_top_k=3)
    (row,) = table.to_pylist()
    assert np.asarray(row["layer_top_ids"]).shape == (len(row["token_ids"]), tiny_chat.n_layers, 3)
    assert row["layer_top_tokens"] == layer_top_texts(tiny_chat.tokenizer, row["layer_top_ids"])
    frame = depthlens.to_pandas(table)
    assert frame["layer_top_probs"][0].shape == (len(row["token_ids"]), tiny_chat.n_layers, 3)
    assert "layer_top_ids" not in depthlens.score(tiny_chat, RECORDS, tokens=True).column_names
    with pytest.raises(
        InputError, match=r"^depthlens.score\(layer_top_k=3\): each layer's top-k is kept per token"
    ):
        depthlens.score(tiny_chat, RECORDS, layer_top_k=3)


def test_python_generate_and_responses_carry_the_top_k(tiny_chat, tmp_path):
    out = tmp_path / "pool"
    table = depthlens.generate(tiny_chat, TASK, pool=2, layer_top_k=2, readout_tokens=4, out=out, **SMALL)
    assert read_manifest(out)["readout"]["layer_top_k"] == 2
    for row, stored in zip(table.to_pylist(), iter_samples(out), strict=True):
        assert row["layer_top_ids"] == stored["layer_top_ids"] and "layer_top_tokens" not in stored
        assert np.asarray(row["layer_top_ids"]).shape == (min(4, row["token_count"]), tiny_chat.n_layers, 2)
        assert row["layer_top_tokens"] == layer_top_texts(tiny_chat.tokenizer, row["layer_top_ids"])
    assert depthlens.think_at_n(table, trials=2, n=2, prefix=4).num_rows  # a table with labels still votes


@pytest.mark.integration
def test_heatmap_draws_the_logit_lens_grid_on_the_default_model(real_model, monkeypatch, capsys, tmp_path):
    args = ["heatmap", "--prompt", "The capital of France is", "--completion", " Paris.", "--out", tmp_path]
    code, _, err = run(monkeypatch, capsys, *args, "--layer-top-k", "3")
    assert code in (0, None), err
    record = json.loads((tmp_path / "record.json").read_text())
    assert np.asarray(record["layer_top_tokens"]).shape == (len(record["tokens"]), 30, 3)
    assert (tmp_path / "logit_lens.png").stat().st_size > 5000
    assert "· top: " in (tmp_path / "heatmap.html").read_text()
    assert "logit_lens.png" in err
