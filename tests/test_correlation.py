"""The correlation study (definitions.md §4): statistics hand-checked, stores read, sweeps, figures and the report."""

from __future__ import annotations

import itertools
import json
import math
import shutil

import numpy as np
import pytest
import torch

from depthlens.config import (
    CorrelationConfig,
    DTRConfig,
    GenerateRun,
    ReadoutConfig,
    SamplingConfig,
    StoreSpec,
    TaskSpec,
)
from depthlens.errors import InputError, StoreError
from depthlens.evals.tasks import Question
from depthlens.metrics.dtr import deep_flags, deep_threshold, matched_threshold, settling_depth
from depthlens.stats.correlation import (
    average_ranks,
    binned_correlation,
    pearson,
    point_biserial,
    quantile_bins,
    spearman,
)
from depthlens.stats.resampling import bootstrap_ci
from depthlens.stores.samples import SAMPLES
from depthlens.studies.correlation import METRIC_NAMES, correlate, store_correlations
from depthlens.studies.generate import generate
from depthlens.studies.stored import load_store
from depthlens.studies.sweeps import sweep
from depthlens.studies.tables import table_one
from tests.test_cli import run

# --- statistics ---------------------------------------------------------------------------------------------


def test_ranks_and_rank_correlations_handle_ties():
    assert average_ranks(np.array([3, 1, 2, 2, 5, 1])).tolist() == [5.0, 1.5, 3.5, 3.5, 6.0, 1.5]
    x = np.array([1.0, 2.0, 2.0, 4.0, 7.0])
    y = np.array([0.0, 1.0, 0.0, 1.0, 1.0])
    assert spearman(x, y) == pytest.approx(float(np.corrcoef(average_ranks(x), average_ranks(y))[0, 1]))
    assert point_biserial(x, y) == pytest.approx(float(np.corrcoef(x, y)[0, 1]))
    assert pearson([0.1] * 3, [1, 2, 3]) is None  # constant (its float mean is not exactly 0.1)
    assert spearman(np.array([1.0, 2.0]), np.array([1.0, 0.0])) is None  # too few points


def test_binned_correlation_by_hand():
    values = np.arange(1.0, 11.0)
    correct = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1], dtype=float)
    # bins (1,2) (3,4) (5,6) (7,8) (9,10): accuracy 0, 0, ½, 1, 1 against means 1.5 … 9.5
    expected = float(np.corrcoef([1.5, 3.5, 5.5, 7.5, 9.5], [0, 0, 0.5, 1, 1])[0, 1])
    assert binned_correlation(values, correct, 5, np.random.default_rng(0)) == pytest.approx(expected)
    assert binned_correlation(values[:4], correct[:4], 5, np.random.default_rng(0)) is None  # fewer than bins
    assert binned_correlation(values, np.ones(10), 5, np.random.default_rng(0)) is None  # accuracy constant


def test_quantile_bins_break_ties_at_random_and_stay_balanced():
    values = np.zeros(8)
    a = quantile_bins(values, 5, np.random.default_rng(1))
    b = quantile_bins(values, 5, np.random.default_rng(2))
    assert sorted(len(g) for g in a) == [1, 1, 2, 2, 2]
    assert sorted(np.concatenate(a).tolist()) == list(range(8))
    assert [g.tolist() for g in a] != [g.tolist() for g in b]
    ordered = quantile_bins(np.array([5.0, 1.0, 3.0, 2.0, 4.0, 0.0]), 3, np.random.default_rng(0))
    assert [sorted(g.tolist()) for g in ordered] == [[1, 5], [2, 3], [0, 4]]


def test_bootstrap_resamples_questions():
    clusters = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]
    data = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    lo, hi = bootstrap_ci(lambda idx: float(data[idx].mean()), clusters, 500, np.random.default_rng(0))
    assert 1.5 <= lo < 3.5 < hi <= 5.5
    assert bootstrap_ci(lambda idx: None, clusters, 50, np.random.default_rng(0)) == (None, None)


def _groups(rng, questions=12, per=8, signal=1.0):
    """Questions with mixed outcomes whose metric tracks correctness by ``signal``."""
    out = []
    for _ in range(questions):
        correct = (rng.random(per) < 0.5).astype(float)
        correct[:2] = [0.0, 1.0]  # both outcomes present
        out.append((signal * correct + rng.normal(0, 0.3, per), correct))
    return out


def test_correlate_finds_a_planted_signal_and_explains_missing_ones():
    cfg = CorrelationConfig(seeds=5, bootstrap=200)
    good = correlate("m", _groups(np.random.default_rng(0)), cfg)
    assert good.binned_r > 0.8 and good.point_biserial > 0.7 and good.spearman > 0.6
    assert good.point_biserial_ci[0] < good.point_biserial < good.point_biserial_ci[1]
    assert good.questions_used == 12 and good.responses == 96 and not good.note
    noise = correlate("m", _groups(np.random.default_rng(1), signal=0.0), cfg)
    assert noise.point_biserial_ci[0] < 0 < noise.point_biserial_ci[1]

    few = correlate("m", _groups(np.random.default_rng(0), questions=2), cfg)
    assert few.binned_r is None and few.point_biserial is None and "too few responses (16 < 20)" in few.note
    right = [(v, np.ones_like(c)) for v, c in _groups(np.random.default_rng(0))]
    assert "every response is right" in correlate("m", right, cfg).note
    lonely = [(v, np.zeros_like(c)) for v, c in _groups(np.random.default_rng(0))]
    lonely[0][1][0] = 1.0
    assert "only 1 right of 96 responses" in correlate("m", lonely, cfg).note
    flat = [(np.zeros_like(v), c) for v, c in _groups(np.random.default_rng(0))]
    assert "constant" in correlate("m", flat, cfg).note
    mixed_few = _groups(np.random.default_rng(0), questions=2) + [
        (np.arange(8.0), np.zeros(8)) for _ in range(3)
    ]
    partial = correlate("m", mixed_few, cfg)
    assert partial.binned_r is None and partial.point_biserial is not None and "2 have them" in partial.note


def test_matched_threshold_flags_as_many_deep_tokens():
    """For a kind that is a monotone function of JSD, the matched threshold reproduces JSD's deep flags."""
    jsd = torch.rand(200, 12)
    jsd[:, -1] = 0
    other = torch.exp(3 * jsd) - 1  # increasing, other units
    deep_from = deep_threshold(12, 0.85)
    g_other = matched_threshold(jsd, 0.5, other, deep_from)
    a = deep_flags(settling_depth(jsd, 0.5), 12, 0.85)
    b = deep_flags(settling_depth(other, g_other), 12, 0.85)
    assert float(a.float().mean()) == pytest.approx(float(b.float().mean()), abs=0.01)
    assert float((a == b).float().mean()) > 0.98


# --- stores, sweeps, report ---------------------------------------------------------------------------------

QUESTIONS = [Question(f"q{i}", f"{i} {i}", str(2 * i)) for i in range(3)]


@pytest.fixture
def store(tmp_path, tiny_chat):
    out = tmp_path / "s"
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=10, readout_tokens=None)
    generate(
        tiny_chat,
        GenerateRun(
            StoreSpec(out, format="jsonl"),
            pool=8,
            seed=1,
            sampling=sampling,
            batch_size=8,
            readout=ReadoutConfig(also=("kl", "cosine")),
            task=TaskSpec(name="tiny"),
        ),
        QUESTIONS,
    )
    # The tiny model is never right; mark a planted pattern of right answers so the statistics have work (a JSONL
    # store, whose lines are easy to edit; tests/test_parquet_store.py checks the formats read alike).
    lines = [json.loads(x) for x in (out / SAMPLES).read_text().splitlines()]
    for r in lines:
        r["correct"] = r["sample"] % 3 == 0
    (out / SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in lines))
    return out


def test_store_metrics_match_the_generation_pass(store):
    s = load_store(store)
    assert len(s.responses) == 24 and s.kinds == ("jsd", "kl", "cosine") and s.task == "tiny"
    rows, profiles = store_correlations(
        s, CorrelationConfig(seeds=3, bootstrap=50, min_responses=10, min_questions=2)
    )
    assert [r["metric"] for r in rows] == list(METRIC_NAMES)
    stored = [json.loads(x)["dtr"] for x in (store / SAMPLES).read_text().splitlines()]
    from depthlens.studies.correlation import dtr_settings

    settings = dtr_settings(s, DTRConfig())
    assert [settings.ratio(r, "jsd") for r in s.responses] == pytest.approx(stored)
    by = {r["metric"]: r for r in rows}
    assert by["token_count"]["point_biserial"] == pytest.approx(-by["reverse_token_count"]["point_biserial"])
    assert by["dtr"]["g"] == 0.5 and by["dtr_kl"]["g"] > 0 and all(len(p) == 5 for p in profiles.values())
    text = table_one(rows)
    assert "| DTR (JSD) |" in text and "24 responses, 3 questions" in text


def test_sweeps_cover_every_setting(store):
    rows = sweep(
        load_store(store), CorrelationConfig(seeds=2, bootstrap=20, min_responses=10, min_questions=2)
    )
    params = {r["param"] for r in rows}
    assert params == {"g", "rho", "prefix", "divergence", "deep_rule"}
    g_rows = [r for r in rows if r["param"] == "g"]
    assert all(
        a["mean_dtr"] >= b["mean_dtr"] for a, b in itertools.pairwise(g_rows)
    )  # larger g settles sooner
    rho_rows = [r for r in rows if r["param"] == "rho"]
    assert all(a["mean_dtr"] >= b["mean_dtr"] for a, b in itertools.pairwise(rho_rows))


def test_bad_stores_and_prefix_only_stores(store, tmp_path, tiny_chat):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in (SAMPLES, f"{SAMPLES}.manifest.json", "questions.jsonl"):
        (broken / name).write_bytes((store / name).read_bytes())
    lines = (broken / SAMPLES).read_text().splitlines()
    first = json.loads(lines[0])
    del first["divergence_kl"]
    (broken / SAMPLES).write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(StoreError, match=r":1: missing field\(s\) \['divergence_kl'\]"):
        load_store(broken)
    meta = broken / f"{SAMPLES}.manifest.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "store_version": 0}))
    with pytest.raises(StoreError, match="version-0 store"):
        load_store(broken)

    prefix = tmp_path / "prefix"
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=10, readout_tokens=4)
    generate(tiny_chat, GenerateRun(StoreSpec(prefix), pool=2, sampling=sampling), QUESTIONS[:1])
    with pytest.raises(InputError, match=r"only the first 4 tokens .* readout_tokens all"):
        store_correlations(load_store(prefix))


def test_report_and_correlate_cli(store, monkeypatch, capsys, tmp_path):
    from depthlens.viz.report import build_report

    cfg = CorrelationConfig(seeds=2, bootstrap=20, min_responses=10, min_questions=2)
    md = build_report(store, cfg)
    text = md.read_text()
    for part in (
        "How this was made",
        "Table 1",
        "Table 2",
        "fig1-bins",
        "fig2-heatmap",
        "fig3-token",
        "fig4-sweeps",
        "fig5-cost",
        "Interactive version",
    ):
        assert part in text
    figures = [text.index(f"**Figure {n}**") for n in range(1, 6)]
    assert figures == sorted(figures)  # the page shows Figures 1 to 5 in order
    assert "Model `" in text and "forward pass in float32" in text  # the precision the store records
    out = md.parent
    html = (out / "report.html").read_text()
    assert "<table>" in html and "<img" in html
    heat = next(out.glob("fig2-heatmap-*.html")).read_text()
    n_layers = json.loads((store / f"{SAMPLES}.manifest.json").read_text())["n_layers"]
    assert heat.count("<tr>") == 1 + n_layers and "settles here" in heat  # token row + one row per layer
    assert all(p.stat().st_size > 1000 for p in out.glob("*.png"))

    code, stdout, err = run(
        monkeypatch,
        capsys,
        "correlate",
        store,
        "--out",
        tmp_path / "c",
        "--seeds",
        "2",
        "--bootstrap",
        "20",
        "--no-sweeps",
    )
    assert code in (0, None), err
    assert "DTR (JSD)" in stdout and (tmp_path / "c" / "correlation.csv").exists()
    rows = {r["metric"]: r for r in json.loads((tmp_path / "c" / "correlation.json").read_text())["rows"]}
    assert rows["log_prob"]["binned_r"] is not None and rows["log_prob"]["responses"] == 24
    assert (
        rows["dtr"]["binned_r"] is None or not rows["dtr"]["note"]
    )  # a constant DTR says so instead of an r
    code, _, err = run(monkeypatch, capsys, "report", tmp_path / "nothing-here")
    assert code == 2 and "not a directory" in err


def test_report_covers_finished_stores_and_names_the_others(store, monkeypatch, capsys, tmp_path):
    """A store still being written (its lock held by another process) and a damaged one are named, with why;
    the finished one is reported; with no finished store left, the command fails and names them all."""
    import subprocess
    import sys
    import textwrap

    run_dir = tmp_path / "run"
    for name in ("done", "writing", "damaged"):
        shutil.copytree(store, run_dir / name)
    lines = (run_dir / "damaged" / SAMPLES).read_text().splitlines()
    (run_dir / "damaged" / SAMPLES).write_text("\n".join([lines[0][: len(lines[0]) // 2], *lines[1:]]) + "\n")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import sys, time
                from pathlib import Path
                from depthlens.stores.lock import store_lock
                with store_lock(Path({str(run_dir / "writing" / SAMPLES)!r})):
                    print("held", flush=True)
                    sys.stdin.read()
            """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, _, err = run(monkeypatch, capsys, "report", run_dir, "--seeds", "2", "--bootstrap", "20")
        assert code in (0, None), err
        text = (run_dir / "report" / "report.md").read_text()
        skipped = text[text.index("## Stores not in this report") :]
        assert f"`{run_dir / 'writing'}`: still being written by pid {holder.pid}" in skipped
        assert f"`{run_dir / 'damaged'}`: " in skipped and ":1:" in skipped  # the damaged line, named
        assert f"`{run_dir / 'done'}`" in text and f"`{run_dir / 'done'}`" not in skipped
        warned = " ".join(err.split())
        assert "not in the report:" in warned and "still being written" in warned
    finally:
        holder.communicate("")
    for name in ("done", "writing"):
        shutil.rmtree(run_dir / name)
    shutil.copytree(run_dir / "damaged", run_dir / "damaged-too")
    code, _, err = run(monkeypatch, capsys, "report", run_dir)
    assert code == 2 and "could be reported" in err and "damaged-too" in err
    shutil.rmtree(run_dir / "damaged-too")  # one store: its reader's own error, no preamble
    code, _, err = run(monkeypatch, capsys, "report", run_dir)
    assert code == 2 and "could be reported" not in err and ":1:" in err


def test_nan_free_outputs(store):
    rows, _ = store_correlations(
        load_store(store), CorrelationConfig(seeds=2, bootstrap=20, min_responses=10, min_questions=2)
    )
    for row in rows:
        for value in row.values():
            assert not (isinstance(value, float) and math.isnan(value))


@pytest.mark.integration
def test_heatmap_command_on_the_default_model(real_model, monkeypatch, capsys, tmp_path):
    code, out, err = run(
        monkeypatch,
        capsys,
        "heatmap",
        "--chat",
        "--prompt",
        "What is 3 + 4?",
        "--completion",
        "3 + 4 = 7.",
        "--out",
        tmp_path,
    )
    assert code in (0, None), err
    assert "DTR" in out and "of 30 layers" in out
    record = json.loads((tmp_path / "record.json").read_text())
    assert len(record["tokens"]) == len(record["divergence"]) == len(record["settling_depth"])
    html = (tmp_path / "heatmap.html").read_text()
    assert html.count("<tr>") == 31 and "settles here" in html
    assert (tmp_path / "heatmap.png").stat().st_size > 5000 and (tmp_path / "token.png").stat().st_size > 5000
    code, _, err = run(
        monkeypatch, capsys, "heatmap", "--completion", "x", "--token", "99", "--out", tmp_path
    )
    assert code == 2 and "--token 99" in err
