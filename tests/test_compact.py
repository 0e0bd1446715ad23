"""Compact per-response tables (studies.compact): a store's responses as a small CSV that re-derives Table 1
without the model or the store.

tests/data/compact_basic_arithmetic.csv is the compact table of a real SmolLM2-135M-Instruct store (48 responses)
and tests/data/compact_basic_arithmetic_table1.csv the DTR and token-count rows of the Table 1 `depthlens correlate`
wrote from that store, made by:

    depthlens generate --model smollm2-135m-instruct --task reasoning_gym:basic_arithmetic --task-config \
        min_terms=2,max_terms=2,max_digits=1,allow_parentheses=false,allow_negation=false --questions 8 --pool 6 \
        --max-new-tokens 96 --readout-tokens all --backend hf --device cpu --seed 3 --task-seed 0 --out S
    python examples/compact_table.py S OUT                  # → compact_basic_arithmetic.csv
    depthlens correlate S --out C --no-sweeps                # C/correlation.csv → its dtr / token-count rows

The committed study tables under docs/data are checked by the same code.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from depthlens.config import CorrelationConfig, GenerateRun, SamplingConfig, StoreSpec
from depthlens.errors import InputError
from depthlens.evals.tasks import Question
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.samples import SAMPLES
from depthlens.studies.compact import COLUMNS, compact_rows, read_compact, table_one_from_rows, write_compact
from depthlens.studies.generate import generate
from depthlens.studies.regrade import regrade_store

DATA = Path(__file__).parent / "data"
# Every statistic of a Table 1 row that depends on the responses (the others name the row or its settings).
STATISTICS = (
    "binned_r",
    "binned_r_sd",
    "binned_r_lo",
    "binned_r_hi",
    "binned_r_p",
    "questions_used",
    "spearman",
    "spearman_lo",
    "spearman_hi",
    "spearman_p",
    "point_biserial",
    "point_biserial_lo",
    "point_biserial_hi",
    "point_biserial_p",
    "r_within",
    "p_within_perm",
    "n_questions_within",
    "r_length_within",
    "responses",
    "questions",
    "accuracy",
)
# Length held fixed (definitions.md §4): in the committed study tables since issue 56, not in the older fixture.
LENGTH_FIXED = (
    "r_within_partial",
    "p_within_partial",
    "auc_length_matched",
    "auc_length_matched_lo",
    "auc_length_matched_hi",
    "auc_length_matched_p",
    "pairs_length_matched",
)


def _number(cell: str) -> float | None:
    return None if cell == "" else float(cell)


def _flat(row: dict) -> dict:
    """A re-derived row under Table 1's column names (its intervals as _lo / _hi)."""
    out = dict(row)
    for name in ("binned_r", "spearman", "point_biserial", "auc_length_matched"):
        out[f"{name}_lo"], out[f"{name}_hi"] = out.pop(f"{name}_ci")
    return out


STUDY = Path(__file__).parent.parent / "docs" / "data" / "findings"
# (compact table, the Table 1 `depthlens correlate` wrote from the same store): the fixture, and each committed study
# store of docs/findings.md §6.4 (examples/findings_study.sh; docs/data/README.md)
TABLES = [(DATA / "compact_basic_arithmetic.csv", DATA / "compact_basic_arithmetic_table1.csv")] + [
    (path, path.with_name(path.name.replace("compact-", "correlation-")))
    for path in sorted(STUDY.glob("compact-*.csv"))
]


@pytest.mark.parametrize("compact, table_one", TABLES, ids=[c.stem for c, _ in TABLES])
def test_table_one_is_re_derived_from_the_committed_rows(compact, table_one):
    rows = read_compact(compact)
    with table_one.open(encoding="utf-8") as f:
        written = {r["metric"]: r for r in csv.DictReader(f)}
    derived = {r["metric"]: _flat(r) for r in table_one_from_rows(rows, CorrelationConfig())}
    study = compact.parent == STUDY  # regenerated with length held fixed (examples/findings_tables.py)
    expected = {"dtr", "token_count", "reverse_token_count"} | ({"dtr_prefix"} if study else set())
    assert expected <= written.keys() and expected <= derived.keys()
    for metric in expected:
        row, want = derived[metric], written[metric]
        assert (row["model"], row["task"]) == (want["model"], want["task"])
        # token counts are integers, exact in the table; DTR is kept to 6 decimals there
        tolerance = 0.0 if "token_count" in metric else 1e-5
        for key in STATISTICS + (LENGTH_FIXED if study else ()):
            expected_value = _number(want[key])
            if expected_value is None:
                assert row[key] is None, (metric, key)
            else:
                assert row[key] == pytest.approx(expected_value, abs=tolerance, rel=tolerance), (metric, key)
    assert derived["token_count"]["point_biserial"] is not None and derived["dtr"]["r_within"] is not None
    if study:  # every within-question statistic with length held fixed is there for the depth measures
        assert all(written[m]["r_within_partial"] != "" for m in ("dtr", "dtr_prefix"))


def test_both_grades_in_the_table():
    rows = read_compact(DATA / "compact_basic_arithmetic.csv")
    assert all(r["correct_fallback"] or not r["correct"] for r in rows)  # the fallback only adds answers
    assert sum(r["correct_fallback"] for r in rows) > sum(r["correct"] for r in rows)
    under_fallback = table_one_from_rows(rows, CorrelationConfig(seeds=2, bootstrap=50), "correct_fallback")
    assert all(
        math.isclose(r["accuracy"], sum(x["correct_fallback"] for x in rows) / len(rows))
        for r in under_fallback
    )


QUESTIONS = [Question("q0", "1 + 2", "3"), Question("q1", "4 + 5", "9")]


def test_compact_rows_of_a_store_round_trip(tiny_chat, tmp_path):
    store = tmp_path / "s"
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=6, readout_tokens=None)
    generate(
        tiny_chat, GenerateRun(StoreSpec(store, format="jsonl"), pool=2, seed=1, sampling=sampling), QUESTIONS
    )
    records = list(iter_jsonl(store / SAMPLES))
    texts = ["1 + 2 = 3", "The answer is 3.", "4 + 5 = 8", 'say "4, 5"']
    for record, text in zip(records, texts, strict=True):
        record.update(text=text, finish="eos")
    (store / SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in records))
    regrade_store(store)

    rows = compact_rows(store)
    assert [(r["answer"], r["correct"], r["answer_fallback"], r["correct_fallback"]) for r in rows] == [
        (None, False, "3", True),
        ("3", True, "3", True),
        (None, False, "8", False),
        (None, False, None, False),
    ]
    assert rows[0]["model"] and rows[0]["question"] == "1 + 2" and rows[0]["rules"].endswith("final-result")
    assert all(
        0.0 <= r["dtr"] <= 1.0 and r["token_count"] == len(records[i]["token_ids"])
        for i, r in enumerate(rows)
    )
    for name in ("t.csv", "t.csv.gz"):
        back = read_compact(write_compact(rows, tmp_path / name))
        assert [list(r) for r in back] == [list(COLUMNS)] * len(rows)
        for got, want in zip(back, rows, strict=True):
            for key in COLUMNS:
                same = (
                    got[key] == pytest.approx(want[key], abs=1e-6)
                    if isinstance(want[key], float)
                    else got[key] == want[key]
                )
                assert same, key
    (tmp_path / "bad.csv").write_text("model,task\nm,t\n")
    with pytest.raises(InputError, match="no column"):
        read_compact(tmp_path / "bad.csv")


def test_compact_pools_vote_as_the_store(tiny_chat, tmp_path):
    """A pool rebuilt from compact rows votes exactly as the store's own pool: every method a compact table can
    vote, in the trials and over every draw."""
    from depthlens.config import DTRConfig, VotingConfig
    from depthlens.studies.compact import COMPACT_METHODS, compact_pools
    from depthlens.studies.thinkn import load_pools
    from depthlens.voting.exact import exact_outcomes
    from depthlens.voting.trials import trial_outcomes

    store = tmp_path / "s"
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=8, readout_tokens=None)
    questions = [Question(f"q{i}", f"{i} + 1", str(i + 1)) for i in range(3)]
    generate(
        tiny_chat, GenerateRun(StoreSpec(store, format="jsonl"), pool=6, seed=2, sampling=sampling), questions
    )
    records = list(iter_jsonl(store / SAMPLES))
    for i, record in enumerate(records):  # answers that tie and differ, some right
        record.update(text=f"The answer is {[2, 3, 4, 9][i % 4]}.", finish="eos")
    (store / SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in records))
    regrade_store(store)
    for prefix in (3, None):  # a prefix shorter than the responses, and the whole response
        voting = VotingConfig(n=4, eta=0.5, rank_prefix=prefix, trials=3)
        pools, _ = load_pools(store, DTRConfig(dtr_prefix_tokens=3), 4)
        rows = compact_rows(store)
        (rebuilt,) = compact_pools(rows, prefix=3).values()
        for a, b in (
            (
                trial_outcomes(pools, voting, COMPACT_METHODS),
                trial_outcomes(rebuilt, voting, COMPACT_METHODS),
            ),
            (
                exact_outcomes(pools, voting, COMPACT_METHODS),
                exact_outcomes(rebuilt, voting, COMPACT_METHODS),
            ),
        ):
            for m in COMPACT_METHODS:
                assert np.array_equal(a.accuracy[m], b.accuracy[m]), (prefix, m)


@pytest.fixture(scope="module")
def table_two_rows():
    """Table 2 re-derived from the committed compact rows, as examples/findings_tables.py writes it."""
    import runpy

    script = runpy.run_path(str(Path(__file__).parent.parent / "examples" / "findings_tables.py"))
    return script["table_two"](STUDY)


def test_table_two_is_re_derived_from_the_committed_rows(table_two_rows):
    with (STUDY / "table2.csv").open(encoding="utf-8") as f:
        written = list(csv.DictReader(f))
    assert len(written) == len(table_two_rows) == 9  # 4 stores strict, 3 final-result, 2 pooled
    for want, got in zip(written, table_two_rows, strict=True):
        assert got.keys() <= want.keys(), want["task"]  # a column another row has is empty in this one
        for key, cell in want.items():
            value = got.get(key)
            if isinstance(value, str) or value is None or isinstance(value, bool):
                assert cell == ("" if value is None else str(value)), (want["task"], key)
            else:
                assert float(cell) == pytest.approx(value, rel=1e-12, abs=1e-12), (
                    want["task"],
                    want["rule"],
                    key,
                )


def test_the_findings_figures_from_the_committed_rows(table_two_rows):
    """The figures docs/findings.md §6.4 quotes, as they come out of the committed rows."""
    row = {(r["model"].split("-")[0], r["task"].split(":")[0], r["rule"]): r for r in table_two_rows}
    qwen = row["qwen2.5", "chain_sum", "strict"]
    assert (qwen["draws_per_question"], qwen["draws_all"]) == (math.comb(16, 8), True)
    assert (
        100 * qwen["think_minus_random"] == pytest.approx(-7.0, abs=0.05)
        and qwen["think_minus_random_p"] < 0.05
    )
    assert qwen["think_minus_random_hi"] < 0 and qwen["cut_ties_think"] == pytest.approx(0.465, abs=0.001)
    pooled = row["smollm2", "pooled", "strict"]
    assert 100 * pooled["think_minus_random"] == pytest.approx(1.2, abs=0.05)
    assert pooled["think_minus_random_lo"] < 0 < pooled["think_minus_random_hi"]
    assert (
        100 * pooled["full_minus_random"] == pytest.approx(3.8, abs=0.05)
        and pooled["full_minus_random_lo"] > 0
    )
    smol = [r for k, r in row.items() if k[0] == "smollm2" and k[1] != "pooled" and k[2] == "strict"]
    assert all(0.23 <= r["cut_ties_think"] <= 0.27 for r in smol)
    # the power statement: +2 points at 80 % power over the measured spread of Think@n − random@n
    assert (pooled["think_minus_random_questions_for_2pt"], qwen["think_minus_random_questions_for_2pt"]) == (
        340,
        489,
    )


def test_the_independent_re_derivation_is_reproduced_under_its_cut_rule(monkeypatch):
    """Issue 56's independent re-derivation (its own code, exact over every draw) kept the earlier of responses tied at
    the η cut, as depthlens did then: under that rule the committed rows give its figures back — Qwen −6.6, p ≈ 0.02;
    SmolLM2 pooled +0.6 —; with the cut's ties uniform (now), Think@n moves by at most 0.8 points per store."""
    from depthlens.config import VotingConfig
    from depthlens.stats.paired import paired_test
    from depthlens.studies.compact import compact_pools, readout_of
    from depthlens.voting import methods
    from depthlens.voting.exact import exact_outcomes

    def earlier(rs, cfg, draws):  # the prefix DTR, a tie going to the earlier response of the draw
        dtr = np.array([r.prefix_dtr(cfg.rank_prefix) for r in rs])
        return dtr[draws] - 1e-9 * np.arange(draws.shape[1])

    monkeypatch.setitem(methods.RANKINGS, "earlier@n", methods.Ranking(earlier, "two-phase"))
    monkeypatch.setitem(methods.METHODS, "earlier@n", methods.METHODS["think@n"])
    by_model: dict[str, list[dict[str, np.ndarray]]] = {}
    for path in sorted(STUDY.glob("compact-*.csv")):
        rows = read_compact(path)
        (((model, _), pools),) = compact_pools(rows, 50, readout_of(rows)).items()
        exact = exact_outcomes(pools, VotingConfig(n=8), ["earlier@n", "think@n", "random@n"]).accuracy
        assert abs(exact["think@n"].mean() - exact["earlier@n"].mean()) <= 0.008
        by_model.setdefault(model.split("-")[0], []).append(exact)
    tests = {}
    for model, stores in by_model.items():
        joined = {m: np.concatenate([s[m] for s in stores]) for m in ("earlier@n", "random@n")}
        tests[model] = paired_test(joined["earlier@n"], joined["random@n"], 10_000, np.random.default_rng(0))
    assert (
        100 * tests["qwen2.5"].difference == pytest.approx(-6.6, abs=0.05)
        and 0.01 < tests["qwen2.5"].p < 0.03
    )
    assert tests["qwen2.5"].high < 0
    assert 100 * tests["smollm2"].difference == pytest.approx(0.6, abs=0.05)
    assert tests["smollm2"].low < 0 < tests["smollm2"].high
