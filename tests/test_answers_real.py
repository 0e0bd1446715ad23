"""Extraction and grading on responses the real models here produced (tests/data/answers_real.jsonl).

As Math-Verify tests its parser: a table of real outputs — small models on reasoning-gym families and a
multiple-choice task, both prompt styles, finished and cut at the token cap — each with the answer, source
and grade it must get. No model runs: the rows hold the stored text.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import pytest

from depthlens.config import AnswerConfig
from depthlens.evals.answers import NUMERIC, extract_answer
from depthlens.evals.grading import grade
from depthlens.evals.loading import load_task
from depthlens.evals.tasks import Question

DATA = Path(__file__).parent / "data"
ROWS = [
    json.loads(line)
    for line in (DATA / "answers_real.jsonl").read_text(encoding="utf-8").splitlines()
    if line
]


@functools.cache
def _questions(task: str, seed: int, data: str | None) -> dict[str, Question]:
    return {q.id: q for q in load_task(task, 2, seed, DATA / data if data else None)}


def _question(row: dict) -> Question:
    q = _questions(row["task"], row["task_seed"], row["data"])[row["question_id"]]
    assert q.answer == row["reference"]  # the task generates the question the model answered
    return q


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_real_response_is_read_and_graded(row):
    got = grade(_question(row), row["text"], row["finish"], AnswerConfig(prompt_style=row["prompt_style"]))
    assert (got.answer, got.source or "none", got.status) == (
        row["answer"],
        row["answer_source"],
        row["grade"],
    )


def test_the_table_covers_what_the_rules_distinguish():
    assert len(ROWS) >= 40
    families = {r["task"] for r in ROWS if r["task"].startswith("reasoning_gym:")}
    assert len(families) >= 6
    assert {r["answer_type"] for r in ROWS} >= {"number", "string", "list", "letter"}
    assert {r["finish"] for r in ROWS} == {"eos", "length"} and {r["prompt_style"] for r in ROWS} == {
        "paper",
        "native",
    }
    sources = Counter(r["answer_source"] for r in ROWS)
    assert sources["boxed"] and sources["none"] and sum(sources.values()) - sources["boxed"] - sources["none"]
    assert len({r["model"] for r in ROWS}) == 3


def test_last_number_fallback_reaches_only_finished_numeric_responses():
    for row in ROWS:
        q = _question(row)
        base = q.extraction(AnswerConfig(prompt_style=row["prompt_style"]))
        finished = row["finish"] == "eos"
        plain = extract_answer(row["text"], base, finished)
        fallback = extract_answer(
            row["text"], q.extraction(AnswerConfig(row["prompt_style"], None, "last-number")), finished
        )
        if not finished or base.answer_type not in NUMERIC or plain is not None:
            assert fallback == plain, row["id"]
        else:
            assert fallback is None or fallback.source == "last-number", row["id"]
