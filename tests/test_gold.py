"""Reference answers checked before a question is asked: reasoning-gym entries whose stated answer their own
arithmetic contradicts are skipped (studies.gold). Entries below are real reasoning-gym 0.1.25 output."""

from __future__ import annotations

import logging
from fractions import Fraction

import pytest

from depthlens.config import GenerateRun, SamplingConfig, StoreSpec, TaskSpec
from depthlens.evals.gold import expression_value, reference_disagrees
from depthlens.evals.loading import load_task
from depthlens.studies.generate import generate
from depthlens.studies.regrade import regrade_store
from tests.test_cli import run

# The correlation study's basic_arithmetic settings (examples/correlation_study.sh).
BASIC = {"min_terms": 2, "max_terms": 2, "max_digits": 1, "allow_parentheses": False, "allow_negation": False}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4 / 1", Fraction(4)),
        ("5 / 9", Fraction(5, 9)),
        ("15 - 43 - 75", Fraction(-103)),
        ("-3 + 4 * 2", Fraction(5)),
        ("(2 + 3) * (4 - 6) / 5", Fraction(-2)),
        ("1.5 + 2", Fraction(7, 2)),
        ("7 × 3 − 1", Fraction(20)),
        ("2 ** 3", None),  # powers are not checked
        ("x + 1", None),
        ("1 / 0", None),
        ("__import__('os').getcwd()", None),  # never evaluated: only numbers and + - * / are walked
        ("3 +", None),
        ("(" * 5000 + "1" + ")" * 5000, None),  # nesting deeper than the parser or the walk allows
        ("-" * 5000 + "1", None),
    ],
)
def test_expression_value(text, value):
    assert expression_value(text) == value


@pytest.mark.parametrize(
    ("expression", "answer", "why"),
    [
        ("0 / 4", "0", None),
        ("4 / 1", "2", "4 / 1 is 4, but the stated answer is 2"),
        ("5 / 9", "10", "5 / 9 is 5/9 ≈ 0.5556, but the stated answer is 10"),
        ("1 - 5", "-4", None),
        ("1 - 5", "−4", None),  # a Unicode minus in the answer
        ("10 + 8", "18", None),
        ("2 ** 3", "8", None),  # unchecked expression
        ("4 + 4", "eight", None),  # a non-numeric answer is not checked
    ],
)
def test_reference_disagrees(expression, answer, why):
    assert reference_disagrees({"expression": expression}, answer) == why


def test_entries_without_an_expression_are_not_checked():
    assert reference_disagrees({}, "3") is None
    assert reference_disagrees({"expression": 12}, "3") is None


def test_basic_arithmetic_questions_with_wrong_references_are_skipped(caplog):
    with caplog.at_level(logging.WARNING, logger="depthlens.tasks"):
        questions = load_task("reasoning_gym:basic_arithmetic", 16, 0, config=BASIC)
    ids = [int(q.id.rsplit("-", 1)[1]) for q in questions]
    assert len(questions) == 16
    assert ids == [0, 2, *range(5, 16), 17, 18, 20]  # 1, 3, 4, 16, 19 state wrong answers
    assert all(q.reference_issue is None for q in questions)
    assert all(
        expression_value(q.question.removeprefix("Calculate ").rstrip(".")) == Fraction(q.answer)
        for q in questions
    )
    [message] = [r.getMessage() for r in caplog.records]
    assert "5 generated question(s)" in message and "basic_arithmetic-1: 4 / 1 is 4" in message


def test_unchecked_questions_carry_the_reason():
    questions = load_task("reasoning_gym:basic_arithmetic", 5, 0, config=BASIC, check_references=False)
    assert [q.id for q in questions if q.reference_issue] == [
        "basic_arithmetic-1",
        "basic_arithmetic-3",
        "basic_arithmetic-4",
    ]


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("chain_sum", {"min_terms": 2, "max_terms": 3, "max_digits": 1}),
        ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
        ("basic_arithmetic", {"min_terms": 2, "max_terms": 4, "max_digits": 2}),  # with parentheses: sound
    ],
)
def test_sound_generators_lose_no_question(name, config):
    questions = load_task(f"reasoning_gym:{name}", 60, 0, config=config)
    assert [q.id for q in questions] == [f"{name}-{i}" for i in range(60)]


def test_regrade_names_the_wrong_references_of_an_old_store(monkeypatch, capsys, tiny_chat, tmp_path):
    """A store written before the check holds questions with wrong references: regrade grades them as stored
    and says which they are; a store written now has none and regrades to the same questions."""
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=4, readout_tokens=None)
    config = ",".join(f"{k}={v}".lower() for k, v in BASIC.items())  # as --task-config is stored
    task = TaskSpec("reasoning_gym:basic_arithmetic", questions=3, task_seed=0, task_config=config)
    old = tmp_path / "old"
    unchecked = load_task("reasoning_gym:basic_arithmetic", 3, 0, config=BASIC, check_references=False)
    generate(tiny_chat, GenerateRun(StoreSpec(old), pool=1, sampling=sampling, task=task), unchecked)
    assert regrade_store(old).wrong_references == {
        "basic_arithmetic-1": "4 / 1 is 4, but the stated answer is 2"
    }
    code, _, err = run(monkeypatch, capsys, "regrade", old)
    assert code in (0, None), err
    assert "1 question(s) carry a reference answer their own arithmetic contradicts" in err
    assert "(e.g. basic_arithmetic-1: 4 / 1 is 4, but the stated answer is 2)" in err

    new = tmp_path / "new"
    checked = load_task("reasoning_gym:basic_arithmetic", 3, 0, config=BASIC)
    generate(tiny_chat, GenerateRun(StoreSpec(new), pool=1, sampling=sampling, task=task), checked)
    report = regrade_store(new)
    assert report.wrong_references == {} and report.responses == 3
