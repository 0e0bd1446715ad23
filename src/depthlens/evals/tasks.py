"""Question sets with reference answers, the paper's prompts, and grading (docs/definitions.md §5).

A task name is one of:
- ``reasoning_gym:<dataset>`` — generated offline by reasoning-gym, seeded; graded by its own scorer;
- ``aime2024``, ``aime2025``, ``hmmt_feb2025``, ``gpqa_diamond`` — Hugging Face datasets (need the hub and the
  ``datasets`` package), or the same rows from a local JSONL given with ``data=``;
- a path to a ``.jsonl`` file with ``question``, ``answer`` and optional ``choices`` (list of strings) per line.
Adding a hub benchmark is one ``HUB_TASKS`` row.

Each task declares its answer type (``config.AnswerType``): a row of ``ANSWER_TYPES`` for the reasoning-gym
families checked by hand, else inferred from the generated reference answers (``infer_answer_type``); hub
tasks by their row; multiple choice is ``letter``. ``--answer-type`` overrides it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from depthlens.config import AnswerConfig, AnswerType
from depthlens.evals.answers import ExtractionConfig

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
GPQA_INSTRUCTION = (
    "You will be given a multiple choice question with different choices such as (A), (B), (C), (D). Think step "
    "by step before giving a final answer to this question. Always finish your answer with 'The final answer is "
    "\\boxed{(X)}.', where X is the correct answer choice. If none of the options match, choose the closest "
    "option as the final answer."
)
LETTERS = "ABCDEFGHIJ"

ANSWER_TYPES: dict[str, AnswerType] = {
    # reasoning-gym families whose answers were read by hand (their generators and score_answer).
    "basic_arithmetic": "number",
    "chain_sum": "number",
    "products": "number",
    "gcd": "number",
    "lcm": "number",
    "count_primes": "number",
    "leg_counting": "number",
    "letter_counting": "number",
    "fraction_simplification": "expression",
    "prime_factorization": "expression",
    "spell_backward": "string",
    "family_relationships": "string",
    "color_cube_rotation": "string",
    "caesar_cipher": "string",
    "letter_jumble": "string",
    "sentence_reordering": "string",
    "shortest_path": "string",
    "word_sorting": "list",
    "number_sorting": "list",
    "number_filtering": "list",
    "word_ladder": "list",
}


def infer_answer_type(answers: list[str]) -> AnswerType:
    """The type every reference answer fits: a letter, a number, a list, an expression, else a string.

    Used for reasoning-gym families without an ``ANSWER_TYPES`` row and for JSONL tasks without choices.
    """

    def number(a: str) -> bool:
        return re.fullmatch(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?", a.strip()) is not None

    def expression(a: str) -> bool:
        return number(a) or re.search(r"\\[a-z]+|\^|\d\s*[×*/+]\s*\d", a) is not None

    def listing(a: str) -> bool:
        return a.strip().startswith("[") or ", " in a or (a.count(",") >= 1 and " " not in a)

    tests: tuple[tuple[AnswerType, Callable[[str], bool]], ...] = (
        ("letter", lambda a: a.strip() in LETTERS),
        ("number", number),
    )
    for kind, test in tests:
        if answers and all(test(a) for a in answers):
            return kind
    if answers and all(listing(a) for a in answers):
        return "list"
    if answers and all(expression(a) for a in answers):
        return "expression"
    return "string"


@dataclasses.dataclass(frozen=True)
class Question:
    id: str
    question: str
    answer: str  # the reference answer (a letter for multiple choice)
    choices: tuple[str, ...] = ()
    scorer: Callable[[str], float] | None = dataclasses.field(default=None, compare=False, repr=False)
    answer_type: AnswerType = "number"
    reference_issue: str | None = dataclasses.field(default=None, compare=False)  # why the answer is wrong

    @property
    def user_message(self) -> str:
        """The paper's prompt (Appendix D): the question, then the instruction."""
        if self.choices:
            options = "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(self.choices))
            return f"{GPQA_INSTRUCTION}\n\n{self.question}\n\n{options}"
        return f"{self.question}\n\n{MATH_INSTRUCTION}"

    def messages(self, prompt_style: str = "paper") -> list[dict[str, str]]:
        """The chat as the model is prompted: the paper's user message, or (``native``) reasoning-gym's own
        system prompt, which asks for ``<answer>`` tags, before the bare question."""
        if prompt_style == "native":
            from reasoning_gym.utils import SYSTEM_PROMPTS

            return [
                {"role": "system", "content": SYSTEM_PROMPTS["default"]},
                {"role": "user", "content": self.question},
            ]
        return [{"role": "user", "content": self.user_message}]

    def extraction(self, rules: AnswerConfig = AnswerConfig()) -> ExtractionConfig:
        """How this question's answers are read under ``rules`` (its type unless they override it)."""
        kind = "letter" if self.choices else (rules.answer_type or self.answer_type)
        return ExtractionConfig(kind, rules.fallback, rules.prompt_style == "native", len(self.choices))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "choices": list(self.choices),
            "answer_type": self.answer_type,
        }


@dataclasses.dataclass(frozen=True)
class HubTask:
    """A benchmark on the Hugging Face hub: where it is and which columns hold what."""

    dataset: str
    split: str
    question: str
    answer: str
    config: str | None = None
    incorrect: tuple[
        str, ...
    ] = ()  # multiple choice: the wrong options' columns (shuffled in with the answer)
    answer_type: AnswerType = "number"


HUB_TASKS: dict[str, HubTask] = {
    "aime2024": HubTask("HuggingFaceH4/aime_2024", "train", "problem", "answer"),
    "aime2025": HubTask("MathArena/aime_2025", "train", "problem", "answer"),
    "hmmt_feb2025": HubTask(
        "MathArena/hmmt_feb_2025", "train", "problem", "answer", answer_type="expression"
    ),
    "gpqa_diamond": HubTask(
        "Idavidrein/gpqa",
        "train",
        "Question",
        "Correct Answer",
        config="gpqa_diamond",
        incorrect=("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"),
        answer_type="letter",
    ),
}
