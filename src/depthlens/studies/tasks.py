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
import json
import logging
import random
import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from depthlens.config import AnswerConfig, AnswerType
from depthlens.errors import InputError
from depthlens.studies.gold import reference_disagrees
from depthlens.voting.answers import (
    NUMERIC,
    Answer,
    ExtractionConfig,
    answers_equivalent,
    extract_answer,
    vote_key,
)

log = logging.getLogger("depthlens.tasks")

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

    for kind, test in (("letter", lambda a: a.strip() in LETTERS), ("number", number)):
        if answers and all(test(a) for a in answers):
            return kind  # type: ignore[return-value]
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
    found: Answer | None = extract_answer(response, config, finished=finish != "length")
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


def reasoning_gym_names() -> list[str]:
    import reasoning_gym

    return sorted(reasoning_gym.factory.DATASETS)


def known_tasks() -> list[str]:
    return [f"reasoning_gym:{n}" for n in reasoning_gym_names()] + list(HUB_TASKS)


def parse_task_config(text: str | None) -> dict[str, Any]:
    """``"min_terms=2,max_digits=2"`` → {"min_terms": 2, "max_digits": 2}; values parsed as JSON when they can be."""
    config: dict[str, Any] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--task-config {text!r}: expected key=value pairs separated by commas")
        try:
            config[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            config[key.strip()] = value.strip()
    return config


def _reasoning_gym(
    name: str, count: int, seed: int, config: dict[str, Any], check_references: bool = True
) -> list[Question]:
    import reasoning_gym

    if name not in reasoning_gym.factory.DATASETS:
        close = [n for n in reasoning_gym_names() if name.split("_")[0] in n][:8]
        raise InputError(
            f"unknown reasoning-gym dataset {name!r}"
            + (f"; similar: {', '.join(close)}" if close else "")
            + "; `depthlens tasks` lists all"
        )
    try:
        data = reasoning_gym.create_dataset(name, size=count, seed=seed, **config)
    except (TypeError, ValueError, AssertionError) as exc:  # reasoning-gym validates configs with asserts
        detail = str(exc) or traceback.format_exception_only(exc)[-1].strip()
        raise InputError(
            f"reasoning-gym dataset {name!r} rejects --task-config {config}: {detail}; "
            "see its config class for the allowed values"
        ) from None
    chosen, skipped = _trusted_entries(name, data, count, seed, config, check_references)
    if skipped:
        first = skipped[0]
        log.warning(
            "reasoning-gym %s: %d generated question(s) state an answer their own expression does not equal "
            "(e.g. %s-%d: %s); not asked — the next questions were drawn instead (docs/definitions.md §5)",
            name,
            len(skipped),
            name,
            first[0],
            first[1],
        )
    kind = ANSWER_TYPES.get(name) or infer_answer_type([str(e["answer"]) for _, e, _, _ in chosen])
    return [
        Question(
            f"{name}-{i}",
            entry["question"],
            str(entry["answer"]),
            scorer=lambda answer, entry=entry, scorer=source: scorer.score_answer(answer, entry),
            answer_type=kind,
            reference_issue=why,
        )
        for i, entry, source, why in chosen
    ]


def _trusted_entries(
    name: str, data: Any, count: int, seed: int, config: dict[str, Any], check: bool
) -> tuple[list[tuple[int, dict[str, Any], Any, str | None]], list[tuple[int, str]]]:
    """The first ``count`` entries (index, entry, dataset, why its reference is wrong or None) — with ``check``,
    only those whose reference holds — and the skipped ones (index, why). Past ``count`` entries come from a
    larger dataset: reasoning-gym seeds each entry by its index."""
    import reasoning_gym

    chosen: list[tuple[int, dict[str, Any], Any, str | None]] = []
    skipped: list[tuple[int, str]] = []
    source, size, i = data, count, 0
    while len(chosen) < count:
        if i == size:
            if i >= 10 * count + 100:
                raise InputError(
                    f"reasoning-gym {name} with --task-config {config}: {len(skipped)} of the first {i} questions "
                    f"state answers their expressions do not equal (e.g. {skipped[0][1]}); choose other settings"
                )
            size *= 2
            source = reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
        entry = source[i]
        why = reference_disagrees(entry.get("metadata") or {}, str(entry["answer"]))
        if why is None or not check:
            chosen.append((i, entry, source, why))
        else:
            skipped.append((i, why))
        i += 1
    return chosen, skipped


def _from_rows(name: str, rows: list[dict[str, Any]], spec: HubTask, seed: int) -> list[Question]:
    questions = []
    for i, row in enumerate(rows):
        missing = [c for c in (spec.question, spec.answer, *spec.incorrect) if c not in row]
        if missing:
            raise InputError(
                f"{name} row {i}: missing column(s) {missing}; expected {spec.question!r}, "
                f"{spec.answer!r}" + (f" and {list(spec.incorrect)}" if spec.incorrect else "")
            )
        if spec.incorrect:  # shuffle the options once per question, reproducibly
            options = [str(row[spec.answer])] + [str(row[c]) for c in spec.incorrect]
            order = list(range(len(options)))
            random.Random(f"{seed}:{i}").shuffle(order)
            choices = tuple(options[j] for j in order)
            answer = LETTERS[order.index(0)]
            questions.append(
                Question(
                    f"{name}-{i}", str(row[spec.question]).strip(), answer, choices, answer_type="letter"
                )
            )
        else:
            questions.append(
                Question(
                    f"{name}-{i}",
                    str(row[spec.question]).strip(),
                    str(row[spec.answer]),
                    answer_type=spec.answer_type,
                )
            )
    return questions


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise InputError(f"task data {str(path)!r} does not exist")
    rows = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: expected a JSON object")
        rows.append(row)
    return rows


def _hub_rows(name: str, spec: HubTask) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise InputError(
            f"task {name} reads {spec.dataset} from the Hugging Face hub, which needs `pip install datasets`; "
            f"or pass --data FILE.jsonl with its columns ({spec.question}, {spec.answer})"
        ) from None
    try:
        return list(datasets.load_dataset(spec.dataset, spec.config, split=spec.split))
    except Exception as exc:
        raise InputError(
            f"task {name}: could not load {spec.dataset} from the hub ({type(exc).__name__}); offline, pass "
            f"--data FILE.jsonl with the same columns ({spec.question}, {spec.answer})"
        ) from None


def load_task(
    name: str,
    count: int | None = None,
    seed: int = 0,
    data: Path | None = None,
    config: dict[str, Any] | None = None,
    check_references: bool = True,
) -> list[Question]:
    """The first ``count`` questions (all when None) of task ``name``; reasoning-gym ones need ``count``.

    ``config`` is passed to the reasoning-gym generator (difficulty: e.g. chain_sum's max_terms, max_digits).
    Generated questions whose stated answer their own arithmetic contradicts are skipped (``studies.gold``);
    ``check_references=False`` keeps them, marked by ``Question.reference_issue`` (to re-grade old stores).
    """
    if count is not None and count < 1:
        raise InputError(f"--questions = {count}; ask for at least 1")
    if name.startswith("reasoning_gym:"):
        return _reasoning_gym(name.split(":", 1)[1], count or 50, seed, config or {}, check_references)
    if config:
        raise InputError(f"--task-config applies to reasoning_gym tasks only, not {name!r}")
    if name in HUB_TASKS:
        spec = HUB_TASKS[name]
        rows = _read_jsonl(data) if data is not None else _hub_rows(name, spec)
        return _from_rows(name, rows, spec, seed)[:count]
    if name.endswith(".jsonl") or data is not None:
        path = Path(name) if data is None else data
        rows = _read_jsonl(path)
        questions = []
        for i, row in enumerate(rows):
            for col in ("question", "answer"):
                if col not in row:
                    raise InputError(f"{path}:{i + 1}: missing {col!r}; each line needs question, answer")
            choices = tuple(str(c) for c in row.get("choices") or ())
            answer = str(row["answer"])
            if choices and answer not in LETTERS[: len(choices)]:
                if answer not in choices:
                    raise InputError(
                        f"{path}:{i + 1}: answer {answer!r} is neither a letter nor one of the choices"
                    )
                answer = LETTERS[choices.index(answer)]
            questions.append(
                Question(
                    str(row.get("id", f"{path.stem}-{i}")),
                    str(row["question"]),
                    answer,
                    choices,
                    answer_type="letter" if choices else "number",
                )
            )
        kind = infer_answer_type([q.answer for q in questions if not q.choices])
        return [q if q.choices else dataclasses.replace(q, answer_type=kind) for q in questions][:count]
    raise InputError(
        f"unknown task {name!r}; use reasoning_gym:<dataset> (e.g. reasoning_gym:basic_arithmetic), "
        f"{', '.join(HUB_TASKS)}, or a .jsonl file; `depthlens tasks` lists all"
    )
