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


def _number(cell: str) -> float | None:
    return None if cell == "" else float(cell)


def _flat(row: dict) -> dict:
    """A re-derived row under Table 1's column names (its intervals as _lo / _hi)."""
    out = dict(row)
    for name in ("binned_r", "spearman", "point_biserial"):
        interval = out.pop(f"{name}_ci" if name != "binned_r" else "binned_r_ci")
        out[f"{name}_lo"], out[f"{name}_hi"] = interval
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
    assert derived.keys() == {"dtr", "token_count", "reverse_token_count"} <= written.keys()
    for metric, row in derived.items():
        want = written[metric]
        assert (row["model"], row["task"]) == (want["model"], want["task"])
        # token counts are integers, exact in the table; DTR is kept to 6 decimals there
        tolerance = 0.0 if "token_count" in metric else 1e-5
        for key in STATISTICS:
            expected = _number(want[key])
            if expected is None:
                assert row[key] is None, (metric, key)
            else:
                assert row[key] == pytest.approx(expected, abs=tolerance, rel=tolerance), (metric, key)
    assert derived["token_count"]["point_biserial"] is not None and derived["dtr"]["r_within"] is not None


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
