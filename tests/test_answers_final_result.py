"""The final-result fallback (definitions.md §5) on answers a small model writes: SmolLM2-135M-Instruct states a
result in its own words or ends on an equation, and never writes ``\\boxed{}``.

tests/data/answers_final_result.jsonl holds real responses — each row's ``source`` names the store or the
``depthlens generate`` command it came from, and ``why`` what the row tests — read right, read wrong, and ones
that must stay unanswered (cut at the token cap, only restating the question, trailing off mid-equation: the last
three are real texts cut short, said so in their source). No model runs: the rows hold the stored text.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from depthlens.config import AnswerConfig
from depthlens.evals.answers import NUMERIC, ExtractionConfig, extract_answer
from depthlens.evals.grading import grade
from depthlens.evals.tasks import Question

DATA = Path(__file__).parent / "data"
ROWS = [
    json.loads(line)
    for line in (DATA / "answers_final_result.jsonl").read_text(encoding="utf-8").splitlines()
    if line
]
FALLBACK = AnswerConfig(fallback="final-result")


def _question(row: dict) -> Question:
    return Question(row["id"], row["question"], row["reference"])


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_real_response_under_both_rules(row):
    got = grade(_question(row), row["text"], row["finish"], FALLBACK)
    assert (got.answer, got.source or "none", got.status) == (
        row["answer"],
        row["answer_source"],
        row["grade"],
    )
    strict = grade(_question(row), row["text"], row["finish"], AnswerConfig())
    assert strict.status == row["grade_strict"]


def test_the_table_covers_right_wrong_and_unanswered():
    real = [r for r in ROWS if not r["source"].startswith("derived")]
    assert len(real) >= 15
    grades = Counter(r["grade"] for r in ROWS)
    assert grades["correct"] >= 5 and grades["wrong"] >= 5 and grades["no_answer"] >= 5
    assert {r["answer_source"] for r in ROWS} >= {"statement", "equation", "phrase", "none"}
    assert {r["finish"] for r in ROWS} == {"eos", "length"}
    # What the strict rules left unanswered and the fallback reads.
    assert sum(r["grade_strict"] == "no_answer" and r["grade"] != "no_answer" for r in ROWS) >= 15


@pytest.mark.parametrize(
    ("text", "question", "answer"),
    [
        ("The final answer within the specified format is 4.", "", ("4", "statement")),
        ("So, x is 7.", "", ("7", "statement")),
        ("Therefore the result equals -3, as shown.", "", ("-3", "statement")),
        ("So, we have 3 steps: add, carry, write.", "", None),  # a count, not a result
        ("So, 0 / 4 is simply added to itself.", "", None),
        ("1. 2 + 2 = 4\n2. 4 + 3 = 7", "", ("7", "equation")),  # the final equation, not the first
        ("$3 + 4 = 7$", "", ("7", "equation")),
        ("\\[ 3 + 4 = 7 \\]", "", ("7", "equation")),
        ("3 + 4 = 7 + 1", "", None),  # goes on past its number
        ("3 + 4 =", "", None),  # trails off
        ("We know 2 * x = 8.", "Solve for x: 2 * x = 8.", None),  # the question's own equation, restated
        ("2 * x = 8, so x = 4", "Solve for x: 2 * x = 8.", ("4", "equation")),
        ("a >= 3 and b == 4", "", None),  # comparisons are not equations
    ],
)
def test_final_result_rule(text, question, answer):
    got = extract_answer(text, ExtractionConfig("number", "final-result"), True, question)
    assert (None if got is None else (got.text, got.source)) == answer
    assert extract_answer(text, ExtractionConfig("number", "final-result"), False, question) is None


def test_fallback_reaches_only_finished_numeric_responses_the_strict_rules_leave():
    """On the other real-output table (three models, six families, both prompt styles) the fallback changes
    nothing the strict rules read, and nothing cut at the token cap or of a text or letter task."""
    rows = [
        json.loads(line)
        for line in (DATA / "answers_real.jsonl").read_text(encoding="utf-8").splitlines()
        if line
    ]
    for row in rows:
        config = ExtractionConfig(row["answer_type"], "none", row["prompt_style"] == "native")
        finished = row["finish"] == "eos"
        plain = extract_answer(row["text"], config, finished)
        fallback = extract_answer(
            row["text"], ExtractionConfig(config.answer_type, "final-result", config.tags), finished
        )
        if not finished or config.answer_type not in NUMERIC or plain is not None:
            assert fallback == plain, row["id"]
        else:
            assert fallback is None or fallback.source in ("statement", "equation"), row["id"]
