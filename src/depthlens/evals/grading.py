"""Grading: a response's answer read and judged against its question, the answer fields a store keeps, the rules
that read them, and where a store's answers came from (docs/definitions.md §5).

Shared by generation (``studies.generate``), the summaries and ``regrade``. A store written before the
answer rules has no ``answers`` entry in its manifest: it was prompted the paper's way and read by
``depthlens-answers-1`` (the last number of any text, cut-off text included).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from depthlens.config import AnswerConfig
from depthlens.evals.answers import (
    NUMERIC,
    RULES,
    SOURCES,
    Answer,
    answers_equivalent,
    extract_answer,
    vote_key,
)
from depthlens.evals.tasks import Question

__all__ = [
    "ANSWER_FIELDS",
    "LEGACY_ANSWERS",
    "RULES",
    "AnswerSummary",
    "Grade",
    "answer_fields",
    "grade",
    "store_answers",
]

log = logging.getLogger("depthlens.tasks")


@dataclasses.dataclass(frozen=True)
class Grade:
    answer: str | None
    source: str | None
    key: str | None  # vote key
    status: str  # correct | wrong | no_answer | unparsed
    task_score: float | None  # the task's own scorer, when it has one

    @property
    def correct(self) -> bool:
        return self.status == "correct"


def _task_score(question: Question, answer: str) -> float | None:
    if question.scorer is None:
        return None
    try:
        return float(question.scorer(answer))
    except Exception as exc:  # a third-party scorer: one bad answer must not stop the run
        log.warning("%s: the task's scorer failed on %r: %s", question.id, answer, exc)
        return 0.0


def grade(
    question: Question,
    response: str,
    finish: str = "eos",
    rules: AnswerConfig = AnswerConfig(),
    timeout_s: int = 5,
) -> Grade:
    """Extract the final answer of ``response`` (``finish``: ``eos``, or ``length`` when cut at the token cap)
    and grade it against ``question`` under ``rules``.

    - letter tasks: the letter must be the reference's;
    - ``native`` prompt style (reasoning-gym): the dataset's ``score_answer`` with its entry decides, full
      credit = correct (the task's authors' rule);
    - ``paper`` style: full credit from the task's scorer, or else the same answer as the reference — by
      Math-Verify for numeric types (so "\\boxed{-4.0}" is right for "-4"; an answer it cannot parse is wrong,
      status ``unparsed``), by vote key (spacing, case of ``\\text`` wrappers aside) for strings and lists.
    """
    config = question.extraction(rules)
    found: Answer | None = extract_answer(response, config, finish != "length", question.question)
    if found is None:
        return Grade(None, None, None, "no_answer", 0.0 if question.scorer else None)
    key = vote_key(found.text)
    if config.answer_type == "letter":
        return Grade(
            found.text, found.source, key, "correct" if found.text == question.answer else "wrong", None
        )
    score = _task_score(question, found.text)
    # Full credit is exactly 1: spell_backward's partial credit for a right prefix sums to 1.0000000000000002.
    if score is not None and (score == 1.0 or rules.prompt_style == "native"):
        return Grade(found.text, found.source, key, "correct" if score == 1.0 else "wrong", score)
    if config.answer_type not in NUMERIC:
        return Grade(
            found.text, found.source, key, "correct" if key == vote_key(question.answer) else "wrong", score
        )
    verdict = answers_equivalent(found.text, question.answer, timeout_s)
    if verdict is None:
        log.warning(
            "%s: Math-Verify could not compare %r with %r; counted as wrong",
            question.id,
            found.text,
            question.answer,
        )
        return Grade(found.text, found.source, key, "unparsed", score)
    return Grade(found.text, found.source, key, "correct" if verdict else "wrong", score)


ANSWER_FIELDS = (
    "question_id",
    "finish",
    "answer",
    "answer_source",
    "vote_key",
    "grade",
    "correct",
    "task_score",
)


LEGACY_ANSWERS = {
    "prompt_style": "paper",
    "answer_type": None,
    "fallback": "last-number",
    "rules": "depthlens-answers-1",
}
"""What a store written before the answer rules (no ``answers`` in its manifest) was prompted and read with."""


def store_answers(manifest: dict[str, Any]) -> tuple[AnswerConfig, str]:
    """A store's answer settings and the rules that graded it (old stores: paper prompts, the old rules)."""
    entry = {**LEGACY_ANSWERS, **manifest.get("answers", {})}
    rules = str(entry.pop("rules"))
    return AnswerConfig.from_dict(entry), rules


def answer_fields(
    question: Question, text: str, finish: str, rules: AnswerConfig, timeout_s: int = 5
) -> dict[str, Any]:
    """The stored answer of one response: extracted and graded under ``rules`` (also what ``regrade`` rewrites)."""
    graded = grade(question, text, finish, rules, timeout_s)
    return {
        "answer": graded.answer,
        "answer_source": graded.source or "none",
        "vote_key": graded.key,
        "grade": graded.status,
        "correct": graded.correct,
        "task_score": graded.task_score,
    }


@dataclasses.dataclass(frozen=True)
class AnswerSummary:
    """How a store's answers were read: per source (``none`` = no answer), truncated, questions unanswered."""

    rules: str  # the rules that graded the store (``depthlens-answers-1`` = before answer rules)
    prompt_style: str
    fallback: str
    sources: dict[str, int]
    truncated: int  # responses cut at the token cap
    unparsed: int  # answers Math-Verify could not compare (counted wrong)
    unanswered_questions: list[str]  # no response of the pool answered: wrong under every method

    @classmethod
    def of(cls, manifest: dict[str, Any], records: Sequence[dict[str, Any]]) -> AnswerSummary:
        settings, rules = store_answers(manifest)
        sources = Counter({s: 0 for s in SOURCES})
        answered: dict[str, bool] = {}
        for r in records:
            # Stores of the old rules named the last-number fallback "number".
            source = {"number": "last-number", None: "none"}.get(
                r.get("answer_source"), r.get("answer_source")
            )
            sources[str(source)] += 1
            qid = str(r["question_id"])
            answered[qid] = answered.get(qid, False) or r.get("vote_key") is not None
        return cls(
            rules,
            settings.prompt_style,
            settings.fallback,
            dict(sources),
            sum(r.get("finish") == "length" for r in records),
            sum(r.get("grade") == "unparsed" for r in records),
            sorted(q for q, yes in answered.items() if not yes),
        )

    def line(self) -> str:
        """One line for a table's notes: where the answers came from."""
        counts = ", ".join(f"{k} {v}" for k, v in self.sources.items() if v)
        return (
            f"answers ({self.rules}, {self.prompt_style} prompts, fallback {self.fallback}): {counts}; "
            f"{self.truncated} truncated, {self.unparsed} unparsed"
            + (
                f"; {len(self.unanswered_questions)} question(s) with no answer at all"
                if self.unanswered_questions
                else ""
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
