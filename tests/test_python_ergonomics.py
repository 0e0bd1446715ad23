"""What a Python user handles first (issue 52, item 4 and the figures of item 6): per-token matrices as (T, L)
arrays, helpers that take a ``str`` path, a one-line model repr, a spread of equal accuracies printed as 0, and the
figures' axes and colour key."""

from __future__ import annotations

import numpy as np
import pytest

import depthlens
from depthlens.models.load import wrap
from depthlens.stores.arrow import to_table
from depthlens.viz import study
from depthlens.viz.heatmap import draw_divergence_heatmap, write_heatmap_html
from depthlens.voting.trials import _std
from tests.conftest import tiny_model

RECORDS = [
    {"id": "a", "prompt_ids": [3, 4, 5], "completion_ids": [6, 7, 8, 9]},
    {"id": "b", "prompt_ids": [3], "completion_ids": [10, 11]},
]


def test_a_verbs_divergence_comes_back_as_a_t_by_l_array(tiny_llama):
    table = depthlens.score(tiny_llama, RECORDS, tokens=True)
    frame = depthlens.to_pandas(table)
    for i, record in enumerate(RECORDS):
        cell = frame.divergence[i]
        assert isinstance(cell, np.ndarray) and cell.shape == (
            len(record["completion_ids"]),
            tiny_llama.n_layers,
        )
        np.testing.assert_array_equal(
            cell, np.asarray(table.column("divergence")[i].as_py(), dtype=np.float32)
        )
    assert frame.settling_depth[0].shape == (4,)  # a per-token list stays 1-D
    assert type(table.to_pandas().divergence[0][0]) is np.ndarray  # the table itself is pyarrow's, untouched


def test_matrices_follow_slices_chunks_and_records_without_one():
    rows = [
        {"id": "a", "divergence": [[0.1, 0.2], [0.3, 0.4]]},
        {"id": "b", "divergence": [[0.5, 0.6]]},
        {"id": "c"},
    ]
    table = to_table(rows)
    import pyarrow as pa

    twice = pa.concat_tables([table, table.slice(1, 2)])
    shapes = [m.shape for m in depthlens.matrices(twice, "divergence")]
    assert shapes == [(2, 2), (1, 2), (0, 2), (1, 2), (0, 2)]
    np.testing.assert_allclose(depthlens.matrices(twice, "divergence")[3], [[0.5, 0.6]], rtol=1e-6)
    with pytest.raises(TypeError, match="'id' is string, not a \\[T × L\\] matrix"):
        depthlens.matrices(table, "id")


def test_every_figure_helper_takes_a_str_path(tmp_path):
    record = {
        "id": "r",
        "tokens": ["a", "b"],
        "divergence": [[0.9, 0.0], [0.5, 0.0]],
        "settling_depth": [2, 1],
        "deep": [True, False],
        "dtr": 0.5,
    }
    draw_divergence_heatmap(record, str(tmp_path / "x.png"))
    page = write_heatmap_html(record, str(tmp_path / "sub" / "x.html"))
    assert (tmp_path / "x.png").stat().st_size > 1000 and page.exists()
    assert (
        "divergence (bits): 0" in page.read_text() and "linear-gradient" in page.read_text()
    )  # the colour key


def test_figure_1_shows_a_metric_that_is_zero_everywhere_as_zero(monkeypatch, tmp_path):
    drawn = []
    monkeypatch.setattr(study, "_save", lambda fig, path: drawn.append(fig) or path)
    points = [{"bin": b, "metric": 0.0, "accuracy": 0.4, "accuracy_se": 0.1, "questions": 3} for b in (1, 2)]
    study.draw_metric_bins({"dtr": points}, {"dtr": "DTR"}, str(tmp_path / "bins.png"))
    ax = drawn[0].axes[0]
    assert list(ax.get_xticks()) == [0.0] and [t.get_text() for t in ax.get_xticklabels()] == ["0"]
    assert any("every bin at 0" in t.get_text() for t in ax.texts)


def test_a_loaded_model_prints_in_one_line():
    text = repr(wrap(tiny_model("llama"), name="tiny"))
    assert "\n" not in text and text.startswith("LoadedModel('tiny': llama, L=")
    assert "float32 on cpu, weights none)" in text


def test_equal_accuracies_have_a_spread_of_exactly_zero():
    assert np.std([0.7] * 3, ddof=1) > 0  # what numpy alone leaves
    assert _std([0.7] * 3) == 0.0 and _std([1 / 3] * 8) == 0.0
    assert _std([0.1, 0.2, 0.3]) == pytest.approx(0.1)


# ---- issue 57: what a notebook tripped on ---------------------------------------------------------------------

TASK = "reasoning_gym:chain_sum"
SMALL = {"questions": 2, "max_new_tokens": 10, "task_config": "min_terms=2,max_terms=2,max_digits=1"}


@pytest.fixture(scope="module")
def pool_and_store(tmp_path_factory):
    from tests.conftest import CharTokenizer

    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    out = tmp_path_factory.mktemp("pool") / "store"
    pool = depthlens.generate(lm, TASK, pool=4, batch_size=4, out=out, progress=False, **SMALL)
    return lm, pool, out


def test_a_frame_of_to_pandas_goes_back_to_arrow_and_votes(pool_and_store):
    """``depthlens.to_pandas`` → filter → ``from_pandas`` (or straight into ``think_at_n``): the (T, L) cells go
    back to their ``[T × L]`` columns and the pool's manifest comes along in the frame's attrs."""
    import pyarrow as pa

    _, pool, _ = pool_and_store
    frame = depthlens.to_pandas(pool)
    with pytest.raises(pa.ArrowInvalid):  # pyarrow's own conversion cannot take 2-D cells: from_pandas can
        pa.Table.from_pandas(frame)
    back = depthlens.from_pandas(frame)
    assert back.to_pylist() == pool.to_pylist()
    assert back.schema.field("divergence").type == pool.schema.field("divergence").type
    assert back.schema.metadata[b"depthlens"] == pool.schema.metadata[b"depthlens"]
    first = frame.question_id.iloc[0]
    kept = frame[frame.question_id == first]  # a notebook's filter: one question's pool
    assert kept.attrs["depthlens"]["manifest"]["pool"] == 4
    voted = depthlens.think_at_n(kept, n=2, trials=2, methods=["cons@n", "think@n"], progress=False)
    assert {r["questions"] for r in voted.to_pylist()[:2]} == {1}


def test_records_of_the_wrong_kind_are_named_with_what_to_pass(tiny_llama):
    import pandas as pd

    records = [{"id": "a", "prompt_ids": [3, 4], "completion_ids": [5, 6]}]
    for given, instead in (
        (
            pd.DataFrame(records),
            r"got a pandas DataFrame; pass its rows as dicts: records\.to_dict\('records'\)",
        ),
        (records[0], r"got one dict; pass a list of records, even of one: \[record\]"),
        ("runs/in.jsonl", r"got a str; pass a list of dicts \(a JSONL file's lines"),
        ([records[0], "x"], r"records\[1\] is a str; each record is a dict"),
    ):
        with pytest.raises(depthlens.DepthlensError, match=r"^depthlens\.score\(records=…\): " + instead):
            depthlens.score(tiny_llama, given, progress=False)
    with pytest.raises(
        depthlens.DepthlensError,
        match=r"records\[0\] and records\[1\] have the id 'a'; give each record its own",
    ):
        depthlens.score(tiny_llama, records * 2, progress=False)


def test_token_ids_as_numpy_or_torch_are_taken(tiny_llama):
    import torch

    listed = [{"id": "a", "prompt_ids": [3, 4], "completion_ids": [5, 6, 7]}]
    arrays = [{"id": "a", "prompt_ids": np.array([3, 4]), "completion_ids": torch.tensor([5, 6, 7])}]
    scalars = [{"id": "a", "prompt_ids": [np.int64(3), 4], "completion_ids": [5, np.int32(6), 7]}]
    want = depthlens.score(tiny_llama, listed, progress=False).to_pylist()
    assert depthlens.score(tiny_llama, arrays, progress=False).to_pylist() == want
    assert depthlens.score(tiny_llama, scalars, batch_size=np.int64(1), progress=False).to_pylist() == want


def test_score_keeps_a_store_whose_manifest_records_the_call(tiny_llama, tmp_path):
    """``out=`` on ``score``: the score store ``depthlens score --out`` writes, its provenance the verb and its
    settings (not ipykernel's launch command); ``generate``'s store records its call likewise."""
    from depthlens.stores.parquet import store_manifest

    records = [
        {"id": "a", "prompt_ids": [3, 4], "completion_ids": [5, 6, 7]},
        {"id": "b", "prompt_ids": [3], "completion_ids": [8]},
    ]
    kept = depthlens.score(tiny_llama, records, tokens=True, g=0.6, out=tmp_path / "scores", progress=False)
    memory = depthlens.score(tiny_llama, records, tokens=True, g=0.6, progress=False)
    assert kept.column("id").to_pylist() == ["a", "b"]
    np.testing.assert_allclose(kept.column("dtr").to_pylist(), memory.column("dtr").to_pylist(), atol=1e-6)
    manifest = store_manifest(tmp_path / "scores")
    assert manifest["command"] == (
        "depthlens.score(<model 'LlamaForCausalLM'>, [{'id': 'a', 'prompt_ids': [3, 4], 'completion_ids': [5, 6, "
        "7]}, {'id': 'b', 'prompt_ids': [3], 'completion_ids': [8]}], tokens=True, g=0.6, out="
        f"{str(tmp_path / 'scores')!r}, progress=False)"
    )
    assert manifest["input"] == "records given in Python" and manifest["dtr"]["g"] == 0.6


def test_a_pool_stores_its_call(pool_and_store):
    from depthlens.stores.samples import read_manifest

    _, _, out = pool_and_store
    assert read_manifest(out)["command"] == (
        f"depthlens.generate(<model 'tiny-llama'>, 'reasoning_gym:chain_sum', pool=4, batch_size=4, out={str(out)!r}, "
        "progress=False, questions=2, max_new_tokens=10, task_config='min_terms=2,max_terms=2,max_digits=1')"
    )


def test_a_vote_table_carries_its_notes_and_its_control(pool_and_store):
    """``think_at_n``'s table: the summary rows, then Think@n − random@n (its control) as the last row; its notes
    in the table and in every DataFrame made of it — among them why a spread is 0.0 where pool = n."""
    _, pool, _ = pool_and_store
    voted = depthlens.think_at_n(pool, n=4, trials=3, progress=False)
    last = voted.to_pylist()[-1]
    assert (last["method"], last["vs"]) == ("think@n", "random@n") and last["diff"] is not None
    notes = depthlens.notes(voted)
    assert notes == voted.to_pandas().attrs["notes"] == depthlens.notes(depthlens.to_pandas(voted))
    assert notes[0].startswith("answers (")  # how the answers were read, first
    assert any("accuracy_std and cost_std are 0.0" in n for n in notes)  # pool = n = 4
    assert any(n.startswith("the last row is the study's primary contrast") for n in notes)
    frame = voted.to_pandas()
    assert set(frame[frame.method != "think@n"].accuracy_std) == {0.0}


def test_a_verbs_own_keywords_are_checked_and_a_tasks_settings_go_with_its_name():
    from depthlens.config import TaskSpec

    with pytest.raises(
        depthlens.DepthlensError, match=r"^depthlens\.score\(progress='yes'\): must be bool or "
    ):
        depthlens.score(None, [], progress="yes")
    with pytest.raises(
        depthlens.DepthlensError, match=r"^depthlens\.generate\(questions=…\): a task's settings go"
    ):
        depthlens.generate(
            None, TaskSpec(), questions=3
        )  # once dropped silently: the TaskSpec's own were used
