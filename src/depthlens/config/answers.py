"""How a store's responses are prompted, and how their answers are read and graded (docs/definitions.md §5)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from depthlens.config.base import Config, check_choice

AnswerType = Literal["number", "expression", "string", "list", "letter"]
"""What a task's answers are: ``number`` and ``expression`` are compared by Math-Verify, ``string`` and ``list``
as text (never a bare number read from the reasoning), ``letter`` a multiple-choice option."""

Fallback = Literal["none", "last-number", "final-result"]
"""``none``: a response states its answer (box, final-answer phrase, answer tags) or has none; ``last-number``:
a numeric task's response that ended by itself may also answer with the last number of its text;
``final-result``: it may answer with a result stated in its own words ("the final answer … is 4", "so, x is 7")
or else the number ending its last equation ("10 + 8 = 18") — docs/definitions.md §5."""

PromptStyle = Literal["paper", "native"]
"""``paper``: the paper's prompts (Appendix D, ``\\boxed{}``); ``native``: reasoning-gym's own system prompt
with ``<answer>`` tags, graded by the dataset's ``score_answer``."""


@dataclasses.dataclass(frozen=True)
class AnswerConfig(Config):
    """How a store's responses are prompted, and how their answers are read and graded (docs/definitions.md §5).

    Attributes:
        prompt_style: see ``PromptStyle``; recorded in the store (stores without it are ``paper``).
        answer_type: None = the task's own type (a registry row, or inferred from its reference answers).
        fallback: see ``Fallback``; ``none`` by default, so every answer is one the response stated.
    """

    prompt_style: PromptStyle = "paper"
    answer_type: AnswerType | None = None
    fallback: Fallback = "none"

    def __post_init__(self) -> None:
        check_choice("AnswerConfig", "prompt_style", self.prompt_style, PromptStyle)
        if self.answer_type is not None:
            check_choice("AnswerConfig", "answer_type", self.answer_type, AnswerType)
        check_choice("AnswerConfig", "fallback", self.fallback, Fallback)
