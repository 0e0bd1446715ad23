"""Loading a task's questions: reasoning-gym datasets (generated offline, seeded, their references checked),
hub benchmarks (or the same rows from a local JSONL) and plain JSONL question files (docs/definitions.md §5)."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from depthlens.config import TaskSpec
from depthlens.errors import InputError, did_you_mean, missing_path, named
from depthlens.evals.gold import reference_disagrees
from depthlens.evals.tasks import ANSWER_TYPES, HUB_TASKS, LETTERS, HubTask, Question, infer_answer_type

log = logging.getLogger("depthlens.tasks")


def reasoning_gym_names() -> list[str]:
    import reasoning_gym

    return sorted(reasoning_gym.factory.DATASETS)


def parse_task_config(text: str | None) -> dict[str, Any]:
    """``"min_terms=2,max_digits=2"`` → {"min_terms": 2, "max_digits": 2}; values parsed as JSON when they can be."""
    config: dict[str, Any] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"{named('task_config')} {text!r}: expected key=value pairs separated by commas")
        try:
            config[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            config[key.strip()] = value.strip()
    return config


def _reasoning_gym(
    name: str, count: int, seed: int, config: dict[str, Any], check_references: bool = True
) -> list[Question]:
    import reasoning_gym

    check_dataset(name, config)
    try:
        data = reasoning_gym.create_dataset(name, size=count, seed=seed, **config)
    except (TypeError, ValueError, AssertionError) as exc:  # reasoning-gym validates configs with asserts
        detail = str(exc) or traceback.format_exception_only(exc)[-1].strip()
        raise InputError(
            f"reasoning-gym dataset {name!r} rejects {named('task_config')} {config}: {detail}; "
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
            scorer=_entry_scorer(source, entry),
            answer_type=kind,
            reference_issue=why,
        )
        for i, entry, source, why in chosen
    ]


def _entry_scorer(dataset: Any, entry: dict[str, Any]) -> Callable[[str], float]:
    """A question's grader: the reasoning-gym dataset's own ``score_answer`` on its generated entry."""

    def score(answer: str) -> float:
        return dataset.score_answer(answer, entry)

    return score


def check_dataset(name: str, config: dict[str, Any]) -> None:
    """Refuse an unknown reasoning-gym dataset (naming the near ones) or a setting its config class lacks."""
    import reasoning_gym

    if name not in reasoning_gym.factory.DATASETS:
        hint = did_you_mean(name, reasoning_gym_names(), prefix="reasoning_gym:")
        if not hint:
            close = [n for n in reasoning_gym_names() if name.split("_")[0] in n][:8]
            hint = f"; similar: {', '.join(close)}" if close else ""
        raise InputError(f"unknown reasoning-gym dataset {name!r}{hint}; `depthlens tasks` lists all")
    check_config_keys(name, reasoning_gym.factory.DATASETS[name][1], config)


def check_task(task: TaskSpec) -> None:
    """The errors of ``task`` that need neither its questions nor a model — a question file or ``--data`` that
    does not exist, an unknown task, dataset or ``--task-config`` key — so the CLI says them before torch loads."""
    if task.name.startswith("reasoning_gym:"):
        check_dataset(task.name.split(":", 1)[1], parse_task_config(task.task_config))
        return
    source = Path(task.data) if task.data else Path(task.name) if task.name.endswith(".jsonl") else None
    if source is not None and not source.is_file():
        raise InputError(missing_path(source, "task data"))
    if source is None and task.name not in HUB_TASKS:
        raise InputError(_unknown_task(task.name))


def check_config_keys(name: str, config_class: type, config: dict[str, Any]) -> None:
    """Refuse a ``--task-config`` key the dataset's config class has no field for, naming the near one and every
    allowed key (the generator's own error would name only its ``__init__``)."""
    if not dataclasses.is_dataclass(config_class):
        return  # the generator checks its own arguments
    own = {"seed": "task_seed", "size": "questions"}  # depthlens passes these itself
    for key in config:
        if key in own:
            raise InputError(
                f"{named('task_config')} {key}=…: {key} is set by {named(own[key])}; leave it out of "
                f"{named('task_config')}"
            )
    allowed = [f.name for f in dataclasses.fields(config_class) if f.name not in own]
    unknown = [key for key in config if key not in allowed]
    if unknown:
        key = unknown[0]
        raise InputError(
            f"{named('task_config')} {key}={config[key]!r}: reasoning-gym dataset {name!r} has no setting {key!r}"
            f"{did_you_mean(key, allowed)} (its settings: {', '.join(allowed)})"
        )


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
                    f"reasoning-gym {name} with {named('task_config')} {config}: {len(skipped)} of the first {i} "
                    f"questions "
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
        raise InputError(missing_path(path, "task data"))
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
            f"or pass {named('data')} FILE.jsonl with its columns ({spec.question}, {spec.answer})"
        ) from None
    try:
        return list(datasets.load_dataset(spec.dataset, spec.config, split=spec.split))
    except Exception as exc:
        raise InputError(
            f"task {name}: could not load {spec.dataset} from the hub ({type(exc).__name__}); offline, pass "
            f"{named('data')} FILE.jsonl with the same columns ({spec.question}, {spec.answer})"
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
        raise InputError(f"{named('questions')} = {count}; ask for at least 1")
    if data is not None and name not in HUB_TASKS:  # never silently ignored
        raise InputError(
            f"{named('data')} gives the rows of a hub task ({', '.join(HUB_TASKS)}); task {name!r} takes none — a "
            f"question "
            f"file is itself the task: {named('task')} FILE.jsonl"
        )
    if name.startswith("reasoning_gym:"):
        return _reasoning_gym(
            name.split(":", 1)[1], count or TaskSpec.GENERATED, seed, config or {}, check_references
        )
    if config:
        raise InputError(f"{named('task_config')} applies to reasoning_gym tasks only, not {name!r}")
    if name in HUB_TASKS:
        spec = HUB_TASKS[name]
        rows = _read_jsonl(data) if data is not None else _hub_rows(name, spec)
        return _from_rows(name, rows, spec, seed)[:count]
    if name.endswith(".jsonl") or data is not None:
        path = Path(name) if data is None else data
        rows = _read_jsonl(path)
        questions = []
        for i, row in enumerate(rows):
            _check_question_row(path, i + 1, row)
            choices = tuple(row.get("choices") or ())
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
    raise InputError(_unknown_task(name))


def _unknown_task(name: str) -> str:
    return (
        f"unknown task {name!r}{did_you_mean(name, HUB_TASKS) or _bare_dataset(name)}; use "
        "reasoning_gym:<dataset> (e.g. reasoning_gym:basic_arithmetic), "
        f"{', '.join(HUB_TASKS)}, or a .jsonl file; `depthlens tasks` lists all"
    )


def _bare_dataset(name: str) -> str:
    """``"; did you mean reasoning_gym:chain_sum?"`` for a reasoning-gym dataset named without its prefix."""
    return did_you_mean(name, reasoning_gym_names(), prefix="reasoning_gym:") if name.isidentifier() else ""


def _check_question_row(path: Path, line: int, row: dict[str, Any]) -> None:
    """A question file's line: ``question`` a string, ``answer`` given, ``choices`` (if any) a list of strings."""
    for col in ("question", "answer"):
        if col not in row:
            raise InputError(f"{path}:{line}: missing {col!r}; each line needs question, answer")
    if not isinstance(row["question"], str):
        raise InputError(f"{path}:{line}: 'question' must be a string, got {type(row['question']).__name__}")
    choices = row.get("choices")
    if choices is not None and not (isinstance(choices, list) and all(isinstance(c, str) for c in choices)):
        raise InputError(
            f"{path}:{line}: 'choices' must be a list of strings, got {json.dumps(choices)[:60]}"
        )


def task_questions(task: TaskSpec) -> list[Question]:
    """The questions of a run's ``task`` (``load_task`` with its recorded settings)."""
    data = Path(task.data) if task.data else None
    return load_task(task.name, task.questions, task.task_seed, data, parse_task_config(task.task_config))
