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
