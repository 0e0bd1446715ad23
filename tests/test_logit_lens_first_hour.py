"""A logit-lens user's first hour (issue 52, as a user): each layer's top-k against a plain transformers logit lens
(examples/logit_lens_first_hour.py's core), and the rough edges met on the way — a misspelt keyword, the top-k
without ``tokens``, the top-k as arrays, a stored pool with the top-k in the explorer, a heatmap from a DataFrame
row."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import depthlens
from depthlens.errors import InputError
from depthlens.view.store import open_store
from tests.test_api import SMALL, TASK

ROOT = Path(__file__).resolve().parents[1]
RECORDS = [{"id": "a", "prompt": "1 2", "completion": "3 4 5"}]


def _example():
    spec = importlib.util.spec_from_file_location(
        "first_hour", ROOT / "examples" / "logit_lens_first_hour.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_layers_top_k_equals_a_plain_transformers_logit_lens(tiny_llama):
    """The example's comparison on a tiny model: ids equal up to ties, probabilities within 1e-4; and it sees a
    wrong answer (the plain lens one position off) as one."""
    example = _example()
    prompt, completion = [1, 5, 9, 3], [17, 4, 42, 8, 8]
    result = example.compare(tiny_llama, prompt, completion, k=4)
    assert result["ids"].shape == (len(completion), tiny_llama.n_layers, 4)
    assert result["other"] == 0 and result["max_prob_diff"] <= 1e-4
    shifted, _, _ = example.plain_logit_lens(
        tiny_llama.model, tiny_llama.parts.final_norm, prompt[:-1], [prompt[-1], *completion[:-1]], 4
    )
    assert (shifted != result["ids"]).any()  # one position off is told apart


def test_a_misspelt_keyword_is_told_the_verbs_own_name(tiny_chat):
    with pytest.raises(
        InputError, match=r"depthlens\.score\(progres=…\): no such setting; did you mean progress\?"
    ):
        depthlens.score(tiny_chat, RECORDS, tokens=True, progres=False)
    with pytest.raises(InputError, match=r"did you mean layer_top_k\b[^?]*\? \(known: .*progress.*tokens"):
        depthlens.score(tiny_chat, RECORDS, tokens=True, layer_top_kk=2)
    with pytest.raises(InputError, match=r"depthlens\.generate\(progres=…\): .*did you mean progress\?"):
        depthlens.generate(tiny_chat, TASK, progres=False)
    scored = depthlens.score(tiny_chat, RECORDS, prefix=2, progress=False)  # ℓ_prefix's keyword stays known
    assert scored.column("dtr_prefix").to_pylist()[0] is not None


def test_the_top_k_without_tokens_names_the_keyword_as_python_sets_it(tiny_chat):
    with pytest.raises(InputError, match=r"^depthlens\.score\(layer_top_k=3\): .*add tokens=True$"):
        depthlens.score(tiny_chat, RECORDS, layer_top_k=3, progress=False)


def test_the_top_k_comes_back_as_arrays(tiny_chat):
    table = depthlens.score(tiny_chat, RECORDS, tokens=True, layer_top_k=3, progress=False)
    (row,) = table.to_pylist()
    shape = (len(row["token_ids"]), tiny_chat.n_layers, 3)
    frame = depthlens.to_pandas(table)
    labels = frame.layer_top_tokens[0]
    assert labels.shape == shape and labels.dtype.kind == "U" and labels.tolist() == row["layer_top_tokens"]
    ids = depthlens.matrices(table, "layer_top_ids")[0]
    assert ids.shape == shape and ids.tolist() == row["layer_top_ids"]


def test_a_pool_with_the_top_k_opens_in_the_explorer_undamaged(tiny_chat, tmp_path):
    """`depthlens view` on a store `generate(layer_top_k=…)` wrote: no notice when it opens (its light check did
    not read the top-k) nor when a response is opened (the range check read a [T][L][K] cell as numbers)."""
    out = tmp_path / "pool"
    table = depthlens.generate(
        tiny_chat, TASK, pool=2, layer_top_k=2, readout_tokens=4, out=out, progress=False, **SMALL
    )
    store = open_store(out)
    assert store.notices == []
    assert table.num_rows == len(store.records)
    # as the response page reads it: the per-token columns it draws, not the top-k
    store.read(0, ["text", "token_ids", "divergence", "settling_depth", "deep"])
    assert store.notices == []
    whole = store.read(0)
    assert np.asarray(whole["layer_top_ids"]).shape[1:] == (tiny_chat.n_layers, 2)


def test_the_heatmap_draws_from_a_dataframe_row(tiny_chat, tmp_path):
    from depthlens.viz import heatmap

    assert depthlens.draw_divergence_heatmap is heatmap.draw_divergence_heatmap  # at the top, as to_pandas
    table = depthlens.score(tiny_chat, RECORDS, tokens=True, layer_top_k=2, progress=False)
    row = depthlens.to_pandas(table).iloc[0]
    depthlens.draw_divergence_heatmap(row, str(tmp_path / "h.png"))
    depthlens.draw_logit_lens(row, str(tmp_path / "l.png"))
    assert (tmp_path / "h.png").stat().st_size > 1000 and (tmp_path / "l.png").stat().st_size > 1000
