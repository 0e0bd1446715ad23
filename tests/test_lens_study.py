"""docs/findings.md §8 (studies.compact_lens): the lens study's table from the committed files alone.

A lens that reads every window as the store did must give back §6.4's own figures (table2.csv, the strict rule)
and a perfect control; a re-tokenized window is carried to the store's window; the committed lens-table.csv
re-derives from the committed lens-prefix-dtr-*.csv and compact-*.csv.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from depthlens.errors import InputError
from depthlens.studies.compact import read_compact
from depthlens.studies.compact_lens import LENS_TABLE, lens_table, model_rows, read_lens_rows, with_lens

STUDY = Path(__file__).parent.parent / "docs" / "data" / "findings"
CHAIN_SUM = STUDY / "compact-smollm2-135m-instruct-chain_sum.csv"


def _as_stored(rows: list[dict], name: str = "logit") -> list[dict]:
    """Lens rows that read each window exactly as the store did (its own deep count over its own window)."""
    out = []
    for r in rows:
        window = min(50, int(r["token_count"]))
        deep = round(r["dtr_prefix"] * window)
        out.append({"id": r["id"], "lens": name, "lens_name": name, "tokens_read": window, "deep": deep})
    return out


def _table_two(model: str, task: str) -> dict[str, str]:
    with (STUDY / "table2.csv").open(encoding="utf-8") as f:
        (row,) = [
            r for r in csv.DictReader(f) if (r["model"], r["task"], r["rule"]) == (model, task, "strict")
        ]
    return row


def test_a_lens_that_reads_as_the_store_did_gives_back_section_6s_figures():
    compact = read_compact(CHAIN_SUM)
    (row,) = model_rows(compact, _as_stored(compact))
    table_two = _table_two("smollm2-135m-instruct", "chain_sum")
    for column in ("think", "random", "cons", "think_minus_random", "think_minus_random_lo"):
        assert row[column] == pytest.approx(float(table_two[column]), abs=1e-12), column
    assert row["control_equal"] == 1.0 and row["control_r"] == pytest.approx(1.0)
    assert row["windows_retokenized"] == 0 and row["responses"] == len(compact) == 480


def test_stores_are_pooled_and_a_store_not_wholly_scored_is_left_out():
    compact = [
        r
        for task in ("basic_arithmetic", "chain_sum")
        for r in read_compact(STUDY / f"compact-smollm2-135m-instruct-{task}.csv")
    ]
    scored = _as_stored(compact, "tuned")
    rows = model_rows(compact, scored)
    assert [r["task"] for r in rows] == [
        "basic_arithmetic",
        "chain_sum",
        "pooled: basic_arithmetic + chain_sum",
    ]
    assert rows[-1]["questions"] == rows[0]["questions"] + rows[1]["questions"] == 60
    assert "control_equal" not in rows[-1]  # the control is the logit lens's
    partial = [
        s for s in scored if not s["id"].startswith("chain_sum-1#")
    ]  # one question of chain_sum unscored
    assert [r["task"] for r in model_rows(compact, partial)] == ["basic_arithmetic"]


def test_a_retokenized_window_is_carried_to_the_stores_window():
    compact = [{"id": "q#0", "token_count": 20, "dtr_prefix": 0.5, "dtr": 0.5}]
    rows, carried = with_lens(compact, {"q#0": {"tokens_read": 21, "deep": 10}})
    assert carried == 1 and rows[0]["dtr_prefix"] == 10 / 20  # round(10 × 20 / 21) = 10 of the store's 20
    rows, carried = with_lens(compact, {"q#0": {"tokens_read": 20, "deep": 7}})
    assert carried == 0 and rows[0]["dtr_prefix"] == rows[0]["dtr"] == 7 / 20
    long = [{"id": "q#1", "token_count": 180, "dtr_prefix": 0.1, "dtr": 0.3}]
    rows, _ = with_lens(long, {"q#1": {"tokens_read": 50, "deep": 5}})
    assert rows[0]["dtr_prefix"] == rows[0]["dtr"] == 0.1  # only the prefix was read: dtr is the prefix's


def test_a_response_not_scored_is_named():
    with pytest.raises(InputError, match=r"q#0: not scored under this lens"):
        with_lens([{"id": "q#0", "token_count": 5}], {})


COMMITTED = sorted(STUDY.glob("lens-prefix-dtr-*.csv"))


@pytest.mark.skipif(not COMMITTED, reason="no lens study committed yet")
def test_the_committed_lens_table_re_derives_from_the_committed_rows():
    with (STUDY / LENS_TABLE).open(encoding="utf-8") as f:
        written = list(csv.DictReader(f))
    derived = lens_table(STUDY)
    assert len(derived) == len(written)
    for old, new in zip(written, derived, strict=True):
        for key, cell in old.items():
            value = new.get(key)
            if isinstance(value, float):
                assert (cell == "nan" and math.isnan(value)) or float(cell) == pytest.approx(
                    value, rel=1e-5
                ), key
            else:
                assert cell == ("" if value is None else str(value)), key
    for path in COMMITTED:
        rows = read_lens_rows(path)
        assert all(0 <= r["deep"] <= r["tokens_read"] <= 50 for r in rows)
        assert all(
            r["dtr_prefix"] == pytest.approx(r["deep"] / r["tokens_read"], abs=1e-6)
            for r in rows
            if r["tokens_read"]
        )


@pytest.mark.skipif(not COMMITTED, reason="no lens study committed yet")
def test_the_committed_jsd_quantiles_are_ordered_and_zero_at_the_last_layer():
    for path in sorted(STUDY.glob("lens-jsd-*.csv")):
        with path.open(encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        for lens, task in {(r["lens_name"], r["task"]) for r in rows}:
            layers = [r for r in rows if (r["lens_name"], r["task"]) == (lens, task)]
            assert all(float(r["q25"]) <= float(r["median"]) <= float(r["q75"]) <= 1.0 for r in layers)
            assert float(layers[-1]["q75"]) == 0.0  # layer L is the model's own distribution
