"""Command-line options → the run's specs (``depthlens.config``), built once per command and passed whole.

Each builder takes one group of options, checks what needs no model, and says which flag is wrong; nothing here
loads a model or imports torch, so a bad option fails in milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

from depthlens.config import (
    AnswerConfig,
    AnswerType,
    Backend,
    EngineConfig,
    Fallback,
    LensSpec,
    ModelSpec,
    PromptStyle,
    RayConfig,
    ReadoutConfig,
    SamplingConfig,
    TaskSpec,
)
from depthlens.errors import InputError

# The engine's options, named as EngineConfig's fields (and so as the commands' parameters).
_ENGINE_OPTIONS = tuple(f.name for f in dataclasses.fields(EngineConfig) if f.name != "backend")


def model_and_engine(options: Mapping[str, Any], backend: Backend) -> tuple[ModelSpec, EngineConfig]:
    """The run's model (``model_spec``) and engine, built from a command's options by name — ``options`` is the
    command's ``locals()`` —, so every command builds them alike: ``backend`` is ``--backend`` resolved
    (``engine_backend``), the vLLM engine's options are read where the command has them (the others keep
    ``EngineConfig``'s defaults)."""
    engine = EngineConfig(backend, **{k: options[k] for k in _ENGINE_OPTIONS if k in options})
    return model_spec(options), engine


def model_spec(options: Mapping[str, Any]) -> ModelSpec:
    """``--model`` and how to load it, from a command's options by name: ``--device``, ``--dtype``,
    ``--trust-remote-code`` and, where the command has them, ``--blocks`` / ``--final-norm-path`` / ``--unembed``
    (an architecture without an adapter row)."""
    return ModelSpec(
        options["model"],
        options["device"],
        options["dtype"],
        options["trust_remote_code"],
        options.get("blocks"),
        options.get("final_norm_path"),
        options.get("unembed"),
    )


def task_spec(
    task: str, questions: int | None, task_seed: int, task_config: str | None, data: Path | None
) -> TaskSpec:
    """``--task`` and its settings, as the store's manifest records them; a missing question file, an unknown
    task or ``--task-config`` key is refused here, before torch is imported (``evals.loading.check_task``)."""
    from depthlens.evals.loading import check_task

    spec = TaskSpec(task, questions, task_seed, task_config, str(data) if data else None)
    check_task(spec)
    return spec


def answer_config(
    prompt_style: str, answer_type: str | None, fallback: str, task: str | None
) -> AnswerConfig:
    """The answer settings of --prompt-style, --answer-type and --answer-fallback (checked)."""
    for option, value, literal in (
        ("--prompt-style", prompt_style, PromptStyle),
        ("--answer-type", answer_type, AnswerType),
        ("--answer-fallback", fallback, Fallback),
    ):
        if value is not None and value not in get_args(literal):
            raise InputError(f"{option} {value!r}: use one of {', '.join(get_args(literal))}")
    rules = AnswerConfig(prompt_style, answer_type, fallback)  # type: ignore[arg-type]
    if task is not None and rules.prompt_style == "native" and not task.startswith("reasoning_gym:"):
        raise InputError(
            f"--prompt-style native asks in reasoning-gym's own format, so it needs a reasoning_gym task, "
            f"not {task!r}; use --prompt-style paper"
        )
    return rules


def readout_config(
    divergence: str, also_divergences: str = "", lens: str = ReadoutConfig.lens
) -> ReadoutConfig:
    """``--divergence``, ``--also-divergences`` (comma-separated) and ``--lens``, a tuned lens stamped with its
    fit's digest (``readout.tuned.stamped``) so that the store's manifest names the very fit that read it."""
    also = tuple(k.strip() for k in also_divergences.split(",") if k.strip())
    config = ReadoutConfig(divergence=divergence, also=also, lens=lens)  # type: ignore[arg-type]
    if LensSpec.parse(config.lens).path is None:  # the logit lens has no stamp, and torch stays unimported
        return config
    from depthlens.readout.tuned import stamped

    return stamped(config)


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


def prefix(value: str) -> int | None:
    """``--prefix N|full``."""
    if value == "full":
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--prefix {value!r}: give a number of tokens or 'full'") from None


def ray_config(
    ray: bool, address: str | None, workers: int, cpus: float, gpus: float, block: int | None = None
) -> RayConfig | None:
    """Ray's settings, or None to run in this process (``--ray-address`` implies ``--ray``)."""
    if not ray and address is None:
        return None
    return RayConfig(workers, cpus, gpus, address, block)


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
