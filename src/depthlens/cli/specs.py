"""Command-line options → the run's specs (``depthlens.config``), built once per command and passed whole.

Each builder takes a few options (the option groups of ``cli.groups`` build their own specs), checks what needs no
model, and says which flag is wrong; nothing here loads a model or imports torch, so a bad option fails in
milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

from depthlens.config import (
    AnswerConfig,
    AnswerType,
    Backend,
    Fallback,
    LensSpec,
    PromptStyle,
    ReadoutConfig,
    SamplingConfig,
    TaskSpec,
)
from depthlens.errors import InputError


def task_spec(
    task: str, questions: int | None, task_seed: int, task_config: str | None, data: Path | None
) -> TaskSpec:
    """``--task`` and its settings, as the store's manifest records them; a missing question file, an unknown
    task or ``--task-config`` key is refused here, before torch is imported (``evals.loading.check_task``)."""
    from depthlens.evals.loading import check_task

    spec = TaskSpec(task, questions, task_seed, task_config, str(data) if data else None)
    check_task(spec)
    return spec


def answer_config(prompt_style: str, answer_type: str | None, fallback: str) -> AnswerConfig:
    """The answer settings of --prompt-style, --answer-type and --answer-fallback (each one of its choices; the
    run's builder checks them against the task: ``studies.runs.answer_rules``)."""
    for option, value, literal in (
        ("--prompt-style", prompt_style, PromptStyle),
        ("--answer-type", answer_type, AnswerType),
        ("--answer-fallback", fallback, Fallback),
    ):
        if value is not None and value not in get_args(literal):
            raise InputError(f"{option} {value!r}: use one of {', '.join(get_args(literal))}")
    return AnswerConfig(prompt_style, answer_type, fallback)  # type: ignore[arg-type]  # each one of its choices


def readout_config(
    divergence: str, also_divergences: str = "", lens: str | LensSpec = ReadoutConfig.lens
) -> ReadoutConfig:
    """``--divergence``, ``--also-divergences`` (comma-separated) and ``--lens`` (``studies.resolve.readout``: a
    tuned lens resolved, its fit's digest taken, so that the store's manifest names the very fit that read it)."""
    from depthlens.studies.resolve import readout

    return readout(divergence, also_divergences, lens)


def readout_tokens(value: str | None, default: int | None) -> int | None:
    """``--readout-tokens N|all`` (None: ``default``)."""
    if value is None:
        return default
    if value == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--readout-tokens {value!r}: give a number of tokens or 'all'") from None


def track_ids(value: str) -> tuple[int, ...]:
    """``--track ID,…``: the token ids, comma-separated (spaces allowed; empty: none). Their range — each once, at
    most ``MAX_TRACK``, below the vocabulary — is ``ReadoutConfig``'s to check, named ``--track`` there too."""
    parts = [p.strip() for p in value.split(",")] if value.strip() else []
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise InputError(
            f"--track {value!r}: give token ids, comma-separated (e.g. --track 791,1462)"
        ) from None


def prefix(value: str) -> int | None:
    """``--prefix N|full``."""
    if value == "full":
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--prefix {value!r}: give a number of tokens or 'full'") from None


def job_size(questions: int | None, per_question: int, at_once: int, sampling: SamplingConfig) -> Any:
    """The run's size (``sampling.choose.Job``), by which ``--backend auto`` picks the backend that finishes it
    first: ``per_question`` responses of each question (a task's default question count taken as 100),
    ``at_once`` of them together."""
    from depthlens.sampling.choose import Job

    responses = (questions or 100) * per_question
    return Job(responses, sampling.max_new_tokens, min(at_once, per_question), sampling.readout_tokens)


def engine_backend(backend: str, model: str, resumes: Path | None = None, job: Any = None) -> Backend:
    """``--backend`` resolved (``auto``: the backend the run being resumed recorded — ``resumes`` is its manifest
    —, else ``$DEPTHLENS_BACKEND``, else the one expected to finish ``job`` first, ``sampling.choose``) and
    checked: vllm installed and able to take ``model``, before any model loads."""
    from depthlens.sampling.choose import resolve_backend

    recorded = recorded_backend(resumes) if resumes is not None else None
    chosen = resolve_backend(backend, recorded, model, job)
    if chosen == "vllm":
        from depthlens.sampling.vllm.backend import check_source  # imports no vllm

        check_source(model)
    return chosen


def recorded_backend(manifest: Path) -> str | None:
    """The backend a run's manifest records (a sample store's ``engine``, a TCB study's ``settings.engine``);
    ``hf`` for runs from before backends were recorded; None where there is no readable manifest."""
    try:
        stored = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # nothing to resume, or a damaged manifest the resume check itself reports
    if not isinstance(stored, dict):
        return None
    settings = stored.get("settings")
    engine = stored.get("engine") or (settings.get("engine") if isinstance(settings, dict) else None)
    return str(engine.get("backend", "hf")) if isinstance(engine, dict) else "hf"
