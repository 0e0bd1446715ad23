"""Statistics on scipy.stats: agreement with the hand-written code they replaced (kept here as the reference), the
false-discovery control, the paired test of Think@n methods against Cons@n and its power."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from depthlens.config import (
    CorrelationConfig,
    GenerateRun,
    ReadoutConfig,
    SamplingConfig,
    StoreSpec,
    TaskSpec,
    VotingConfig,
)
from depthlens.evals.tasks import Question
from depthlens.stats.correlation import pearson, point_biserial, spearman
from depthlens.stats.fdr import add_fdr, fdr_adjust
from depthlens.stats.paired import paired_power, paired_test, questions_needed
from depthlens.stats.resampling import bootstrap_ci, cluster_correlation_bootstrap, mean_bootstrap
from depthlens.stores.samples import SAMPLES
from depthlens.studies.correlation import (
    METRICS,
    TABLE_ONE_P,
    dtr_settings,
    metric_values,
    store_correlations,
)
from depthlens.studies.generate import generate
from depthlens.studies.stored import load_store
from depthlens.studies.tables import paired_cells
from depthlens.studies.thinkn import compare_methods, load_pools
from depthlens.voting.trials import run_trials, trial_outcomes
from tests.test_cli import run

# --- the hand-written statistics of metrics/stats.py before scipy (commit 795c72f), as the reference ---------


def old_pearson(x, y):
    xs, ys = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if xs.size < 3 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return None
    xc, yc = xs - xs.mean(), ys - ys.mean()
    return float(np.clip((xc * yc).sum() / float(np.sqrt((xc * xc).sum() * (yc * yc).sum())), -1.0, 1.0))


def old_ranks(x):
    _, inverse, counts = np.unique(
        np.asarray(x, dtype=np.float64).ravel(), return_inverse=True, return_counts=True
    )
    return ((np.cumsum(counts) - counts + 1) + (counts - 1) / 2.0)[inverse]


def old_spearman(x, y):
    xs, ys = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    return None if xs.size < 3 else old_pearson(old_ranks(xs), old_ranks(ys))


def old_bootstrap_ci(statistic, clusters, resamples, rng, level=0.95):
    draws = []
    for _ in range(resamples):
        picks = rng.integers(0, len(clusters), len(clusters))
        value = statistic(np.concatenate([clusters[i] for i in picks]))
        if value is not None:
            draws.append(value)
    if len(draws) < resamples / 2:
        return None, None
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(np.asarray(draws), [tail, 1.0 - tail])
    return float(low), float(high)


QUESTIONS = [Question(f"q{i}", f"{i} {i}", str(2 * i)) for i in range(6)]


@pytest.fixture
def study(tmp_path, tiny_chat):
    """A stored study as the correlation tests build one: the tiny model's responses with a planted pattern of
    right answers (it is never right by itself)."""
    out = tmp_path / "s"
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=12, readout_tokens=None)
    generate(
        tiny_chat,
        GenerateRun(
            StoreSpec(out, format="jsonl"),
            pool=8,
            seed=2,
            sampling=sampling,
            batch_size=8,
            readout=ReadoutConfig(also=("kl", "cosine")),
            task=TaskSpec(name="tiny"),
        ),
        QUESTIONS,
    )
    lines = [json.loads(x) for x in (out / SAMPLES).read_text().splitlines()]
    for r in lines:
        r["correct"] = (r["sample"] + int(r["question_id"][1:])) % 3 == 0
    (out / SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in lines))
    return out


# Tolerance: the same float64 values in, summed in another order (scipy normalises before its products, the
# vectorized bootstrap sums centred per-question sums); over ≤ 50 responses of magnitude ≤ 1e2 the rounding
# stays below 1e-12 — 1e-9 leaves room and still tells any real difference (which would be ≥ 1e-3).
TOL = 1e-9


def test_scipy_statistics_equal_the_hand_written_ones_on_a_stored_study(study):
    s = load_store(study)
    settings = dtr_settings(s, __import__("depthlens.config", fromlist=["DTRConfig"]).DTRConfig())
    compared = 0
    for metric in METRICS:
        groups = metric_values(s, metric, settings)
        values = np.concatenate([v for v, _ in groups])
        correct = np.concatenate([c for _, c in groups])
        for new, old in ((pearson, old_pearson), (spearman, old_spearman), (point_biserial, old_pearson)):
            a, b = new(values, correct), old(values, correct)
            assert (a is None) == (b is None)
            if a is not None:
                assert a == pytest.approx(b, abs=TOL)
                compared += 1
        clusters, start = [], 0
        for v, _ in groups:
            clusters.append(np.arange(start, start + v.size))
            start += v.size
        # The same generator draws the same question indices in scipy.stats.bootstrap as in the old loop, so the
        # intervals agree to rounding: the per-call form, and the vectorized ones correlate() uses.
        for kind, old_stat in (("pearson", old_pearson), ("spearman", old_spearman)):

            def stat(i, f=old_stat, v=values, c=correct):
                return f(v[i], c[i])

            old_ci = old_bootstrap_ci(stat, clusters, 300, np.random.default_rng(7))
            new_ci = bootstrap_ci(stat, clusters, 300, np.random.default_rng(7))
            fast = cluster_correlation_bootstrap(groups, kind, 300, np.random.default_rng(7))
            assert new_ci == pytest.approx(old_ci, abs=TOL)
            assert (fast.low, fast.high) == pytest.approx(old_ci, abs=TOL)
    assert (
        compared >= 18
    )  # at least the six baselines have a defined r on this store (the DTRs may be constant)


def test_correlate_reports_question_level_p_values_and_the_table_their_adjustment(study):
    rows, _ = store_correlations(
        load_store(study), CorrelationConfig(seeds=3, bootstrap=400, min_responses=10, min_questions=2)
    )
    add_fdr(rows, TABLE_ONE_P)
    tested = [r for r in rows if r["point_biserial_p"] is not None]
    assert tested
    for r in tested:
        lo, hi, p = r["point_biserial_lo"], r["point_biserial_hi"], r["point_biserial_p"]
        assert 0 < p <= 1 and r["point_biserial_p_bh"] >= p
        # p < 0.05 exactly when the 95 % interval excludes 0 (both read off the same resamples; ± one draw)
        if lo > 0 or hi < 0:
            assert p <= 0.05 + 2 / 401
        else:
            assert p >= 0.05 - 2 / 401
        assert r["point_biserial_p_iid"] == pytest.approx(
            stats.pearsonr(*_pooled(study, r["metric"])).pvalue, rel=1e-9
        )


def _pooled(store, name):
    s = load_store(store)
    from depthlens.config import DTRConfig

    metric = next(m for m in METRICS if m.name == name)
    groups = metric_values(s, metric, dtr_settings(s, DTRConfig()))
    return np.concatenate([v for v, _ in groups]), np.concatenate([c for _, c in groups])


def test_benjamini_hochberg_by_hand():
    # sorted 0.01, 0.03, 0.04, 0.5 (m = 4): p·m/k = 0.04, 0.06, 0.0533, 0.5, then the running minimum from the top
    assert fdr_adjust([0.01, None, 0.04, 0.03, 0.5]) == pytest.approx([0.04, None, 0.16 / 3, 0.16 / 3, 0.5])
    assert fdr_adjust([None, None]) == [None, None]


def test_mean_bootstrap_interval_and_p():
    b = mean_bootstrap([0.2, 0.3, 0.25, 0.35, 0.3, 0.28], 2000, 0)
    assert 0.2 < b.low < 0.28 < b.high < 0.35 and b.p == pytest.approx(2 / 2001)  # every resample mean > 0


# --- paired comparisons and power ---------------------------------------------------------------------------


def test_paired_test_on_zero_one_outcomes_is_the_exact_mcnemar_test():
    a = np.array([1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0])
    b = np.array([0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 0])
    t = paired_test(a, b, 5000, 0)
    assert (t.wins, t.losses, t.questions, t.exact) == (7, 1, 12, True)
    assert t.p == pytest.approx(stats.binomtest(7, 8, 0.5).pvalue, abs=1e-12)  # 18/256
    assert t.difference == pytest.approx(6 / 12) and t.low <= 0.5 <= t.high
    same = paired_test(a, a)
    assert same.p == 1.0 and same.difference == 0 and same.wins == same.losses == 0
    one = paired_test([1.0, 0.5, 0.2], [1.0, 0.5, 0.0])  # a single question differs: both signs as extreme
    assert one.p == 1.0 and one.wins == 1 and one.exact


def test_paired_test_of_trial_means_weighs_the_size_of_each_win():
    rng = np.random.default_rng(3)
    base = rng.random(40)
    better = np.clip(base + 0.05 + rng.normal(0, 0.02, 40), 0, 1)
    t = paired_test(better, base, 4000, 1)
    assert not t.exact and t.p < 0.001 and 0.03 < t.low < t.difference < t.high < 0.07


def test_power_matches_the_textbook_paired_t_numbers():
    # Cohen's d = 0.5 needs 34 pairs for 80 % power at α = 0.05 (two-sided paired t-test); d = 0.2 needs 199.
    assert questions_needed(0.5, 1.0) == 34 and questions_needed(0.2, 1.0) == 199
    assert paired_power(0.5, 1.0, 34) == pytest.approx(0.808, abs=0.002)
    assert paired_power(0.5, 1.0, 33) < 0.8 and paired_power(0.02, 0.0, 30) is None
    # The normal approximation with the t's small-sample correction: n ≈ (z_α/2 + z_β)² (σ/Δ)² + a few
    n = questions_needed(0.02, 0.3)
    assert (1.96 + 0.8416) ** 2 * (0.3 / 0.02) ** 2 < n < (1.96 + 0.8416) ** 2 * (0.3 / 0.02) ** 2 + 5
    assert math.isclose(paired_power(0.02, 0.3, n), 0.8, abs_tol=0.01)


def test_trial_outcomes_pair_methods_on_the_same_questions(study):
    from depthlens.config import DTRConfig

    pools, _ = load_pools(study, DTRConfig(), 4)
    cfg = VotingConfig(n=4, trials=5, rank_prefix=4)
    outcomes = trial_outcomes(pools, cfg)
    assert outcomes.summaries() == run_trials(pools, cfg)
    assert outcomes.accuracy["cons@n"].shape == (5, 6)
    comparisons = {c.method: c for c in compare_methods(outcomes)}
    assert "cons@n" not in comparisons and set(comparisons) == set(outcomes.accuracy) - {"cons@n"}
    think = comparisons["think@n"]
    per_q = outcomes.accuracy["think@n"].mean(0) - outcomes.accuracy["cons@n"].mean(0)
    assert think.test.difference == pytest.approx(per_q.mean())
    summary = {s.method: s for s in outcomes.summaries()}
    assert think.test.difference == pytest.approx(
        summary["think@n"].accuracy_mean - summary["cons@n"].accuracy_mean
    )
    assert think.p_bh >= think.test.p and set(think.questions_for) == {"2.0", "3.3"}


def test_thinkn_from_a_store_prints_and_writes_the_paired_tests(study, monkeypatch, capsys):
    code, out, err = run(
        monkeypatch, capsys, "thinkn", "--from", study, "--n", "4", "--trials", "4", "--prefix", "4"
    )
    assert code == 0, err
    assert "Δ points [95 %]" in out and "think@n vs cons@n over 6 question" in err
    summary = json.loads((study / "thinkn-n4-eta0.5-l4.json").read_text())
    rows = {m["method"]: m for m in summary["methods"]}
    assert rows["cons@n"]["p"] is None and 0 < rows["think@n"]["p"] <= 1
    assert all(
        0 <= m["accuracy_lo"] <= m["accuracy_mean"] <= m["accuracy_hi"] <= 1 for m in summary["methods"]
    )
    header = (study / "thinkn-n4-eta0.5-l4.csv").read_text().splitlines()[0].split(",")
    assert {"diff", "diff_lo", "diff_hi", "p", "p_bh", "questions_for_gap2.0", "accuracy_lo"} <= set(header)


def test_report_table_two_has_online_replays_paired_tests_and_the_pooled_model(study, monkeypatch, capsys):
    from depthlens.viz.report import build_report

    common = ["--n", "4", "--trials", "3", "--prefix", "4"]
    assert run(monkeypatch, capsys, "thinkn", "--from", study, *common)[0] == 0
    for signal in ("dtr", "confidence"):
        code, _, err = run(
            monkeypatch,
            capsys,
            "thinkn",
            "--online",
            "--from",
            study,
            "--signal",
            signal,
            "--warmup",
            "2",
            "--max-n",
            "8",
            "--consensus",
            "0.8",
            "--deepconf-window",
            "4",
            *common,
        )
        assert code in (0, None), err
        assert (
            "Cons@n beside it: n = 4" in err
            and f"online {'think@n' if signal == 'dtr' else 'deepconf'}" in err
        )
    replay = json.loads((study / "online_replay-dtr.json").read_text())
    assert replay["cons_n"] == 4 and 0 < replay["paired"]["p"] <= 1
    assert len(replay["per_question"]["accuracy"]["online think@n"]) == 6
    md = build_report(study, CorrelationConfig(seeds=2, bootstrap=50, min_responses=10, min_questions=2))
    text = md.read_text()
    assert "online think@n (max n 8, β 0.8)" in text and "online deepconf (max n 8, β 0.8)" in text
    assert "Pooled over each model's stores" in text and "Δ vs Cons@n, points [95 %]" in text
    assert "p_BH" in text and "95 % interval vs the paper's +2.0 / +3.3" in text and "power +2.0" not in text
    # Think@n − random@n: the store's and the model's pooled, the same questions here (one store)
    control = [
        line for line in text.splitlines() if line.startswith(("| tiny-llama · tiny", "| tiny-llama ("))
    ]
    assert "Think@n − random@n, the control" in text and len(control) == 2
    stored = json.loads((study / "thinkn-n4-eta0.5-l4.json").read_text())["control"]
    assert stored["method"] == "think@n" and stored["vs"] == "random@n" and 0 < stored["p"] <= 1
    # Table 2's p_BH is over all its comparisons (18 offline methods + 2 online), not each summary's own family
    from depthlens.studies.tables import format_p

    summary = json.loads((study / "thinkn-n4-eta0.5-l4.json").read_text())
    tested = [m for m in summary["methods"] if m["p"] is not None]
    ps = [m["p"] for m in tested]
    ps += [
        json.loads((study / f"online_replay-{s}.json").read_text())["paired"]["p"]
        for s in ("dtr", "confidence")
    ]
    table_bh = fdr_adjust(ps)[[m["method"] for m in tested].index("think@n")]
    lines = text.splitlines()
    # Table 2: one table per store, its model and task said once above it
    first = lines.index("**tiny-llama · tiny**")
    row = next(line for line in lines[first:] if line.startswith("| think@n |"))
    header = next(line for line in lines[first:] if line.startswith("| method |"))
    control_at = next(i for i, line in enumerate(lines) if line.startswith("**Think@n − random@n"))
    assert not any(
        line.startswith("| tiny-llama · tiny |") for line in lines[:control_at]
    )  # the control's has
    cells = dict(zip(header.strip("|").split(" | "), row.strip("|").split(" | "), strict=True))
    assert cells["p_BH"].strip().rstrip("†") == format_p(table_bh)


def test_verdict_line_states_the_interval_against_the_gaps_and_power_only_to_plan():
    from depthlens.cli.paired_view import verdict_line as power_line
    from depthlens.studies.comparisons import paired_comparisons

    rng = np.random.default_rng(0)
    cons = rng.integers(0, 2, 30).astype(float)
    think = np.clip(cons + rng.choice([-1.0, 0.0, 0.0, 1.0], 30), 0, 1)
    (c,) = paired_comparisons({"cons@n": cons, "think@n": think}, resamples=2000)
    line = power_line([c])
    need = [questions_needed(e, c.test.sd) for e in (0.020, 0.033)]
    assert "over 30 questions" in line and f"80 % power needs {need[0]:,} / {need[1]:,} questions" in line
    assert (
        f"{c.power['2.0']:.2f} / {c.power['3.3']:.2f}" in line and c.power["2.0"] < 0.2
    )  # 30 questions: hopeless
    assert c.test.p >= 0.05 and "For planning, not a verdict" in line
    assert f"the 95 % interval {paired_cells(c.row()).gaps} (the paper's" in line
    flat = paired_comparisons({"cons@n": cons, "think@n": cons})
    assert "the same outcome on every question" in power_line(flat)
    # a significant difference: the interval against the gaps, no post-hoc power beside it
    wins = np.r_[np.ones(25), np.zeros(5)]
    (sure,) = paired_comparisons({"cons@n": np.zeros(30), "think@n": wins}, resamples=2000)
    line = power_line([sure])
    assert sure.test.p < 0.05 and "power" not in line and "the 95 % interval excludes +2.0, +3.3" in line


@pytest.mark.parametrize(
    ("low", "high", "cell"),
    [
        (-0.10, -0.03, "excludes +2.0, +3.3"),
        (0.0, 0.025, "includes +2.0; excludes +3.3"),
        (0.025, 0.05, "includes +3.3; excludes +2.0"),
        (-0.05, 0.05, "includes +2.0, +3.3"),
    ],
)
def test_the_interval_against_the_papers_gaps(low, high, cell):
    from depthlens.stats.paired import PairedTest
    from depthlens.studies.comparisons import gap_verdict

    test = PairedTest(30, (low + high) / 2, low, high, 0.5, 1, 1, 0.1, True)
    verdict = gap_verdict(test)
    assert verdict == {"2.0": not (low <= 0.02 <= high), "3.3": not (low <= 0.033 <= high)}
    row = {"diff": test.difference, "diff_lo": low, "diff_hi": high}
    assert paired_cells(row).gaps == cell  # from the interval alone (a row written before excludes_gap*)
    assert paired_cells({**row, **{f"excludes_gap{g}": v for g, v in verdict.items()}}).gaps == cell


def test_the_control_is_think_at_n_against_random_at_n_on_its_own():
    from depthlens.stats.paired import paired_test
    from depthlens.studies.comparisons import control_comparison

    rng = np.random.default_rng(3)
    per_q = {"think@n": rng.random(20), "random@n": rng.random(20), "cons@n": rng.random(20)}
    c = control_comparison(per_q, seed=0)
    expected = paired_test(per_q["think@n"], per_q["random@n"], rng=np.random.default_rng([0, 7_919]))
    assert (c.method, c.baseline, c.test, c.p_bh) == ("think@n", "random@n", expected, expected.p)
    assert control_comparison({"think@n": per_q["think@n"]}) is None  # random@n not voted


def test_correlate_prints_and_writes_the_adjusted_p_beside_the_intervals(
    study, monkeypatch, capsys, tmp_path
):
    code, out, err = run(
        monkeypatch,
        capsys,
        "correlate",
        study,
        "--out",
        tmp_path / "c",
        "--seeds",
        "2",
        "--bootstrap",
        "50",
        "--no-sweeps",
    )
    assert code in (0, None), err
    assert "p_BH" in out
    header = (tmp_path / "c" / "correlation.csv").read_text().splitlines()[0].split(",")
    assert {
        "point_biserial_p",
        "point_biserial_p_bh",
        "spearman_p_bh",
        "binned_r_lo",
        "binned_r_p_bh",
    } <= set(header)
    text = (tmp_path / "c" / "correlation.md").read_text()
    assert "Benjamini–Hochberg" in text and ", p_BH " in text
