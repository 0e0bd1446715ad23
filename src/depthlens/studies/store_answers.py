"""A store's answers: the rules that read them, each response's answer fields, and where they came from.

The rules: docs/definitions.md §5.

Shared by generation (``thinkn.generate_store``), the summaries and ``regrade``. A store written before the
answer rules has no ``answers`` entry in its manifest: it was prompted the paper's way and read by
``depthlens-answers-1`` (the last number of any text, cut-off text included).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from depthlens.config import AnswerConfig
from depthlens.studies.tasks import Question, grade
from depthlens.voting.answers import RULES, SOURCES

__all__ = ["ANSWER_FIELDS", "LEGACY_ANSWERS", "RULES", "AnswerSummary", "answer_fields", "store_answers"]

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
