"""One place builds every run, for every front: ``score_run``, ``generate_run`` and ``online_run`` take plain
settings by keyword — each config as itself or as a mapping of its fields — and return the frozen run
(``config.run``) after every check that needs no model, with the warnings its settings earn (``Built``). The
command line, the Python verbs (``api``) and the server call them, so one call behaves alike on every front: a
hub task asked for more questions than it holds is refused everywhere, ``settle='topk:K'`` on a vLLM readout before
any engine starts, a read-out window shorter than the prefix a vote decides at in every front (``check_window``).
What they raise and warn names the setting (``errors.Said``); each front phrases it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from depthlens.config import (
    DIVERGENCE_MAX,
    AnswerConfig,
    DTRConfig,
    EngineConfig,
    GenerateRun,
    OnlineConfig,
    OnlineRun,
    RayConfig,
    ReadoutConfig,
    SamplingConfig,
    ScoreRun,
    ServeConfig,
    StoreSpec,
    TaskSpec,
    TCBConfig,
    VotingConfig,
)
from depthlens.config.readout import check_layer_top, check_per_layer, check_track
from depthlens.errors import DepthlensWarning, InputError, Written, named
from depthlens.evals.tasks import Question
from depthlens.models import machine as machines
from depthlens.models.machine import THREADS_PER_CPU, Need, check_memory, check_threads
from depthlens.studies import resolve

R = TypeVar("R", ScoreRun, GenerateRun, OnlineRun)
C = TypeVar("C")
Settings = Mapping[str, Any]
"""A config's fields by name, as a front was given them (``{"temperature": 0.6}``)."""


@dataclasses.dataclass(frozen=True)
class Built(Generic[R]):
    """A run ready to start: the frozen run, the questions it samples (none for ``score``) and the warnings its
    settings earn (``DepthlensWarning``: each front shows them in its own words)."""

    run: R
    questions: tuple[Question, ...] = ()
    warnings: tuple[DepthlensWarning, ...] = ()


def config(cls: type[C], given: C | Settings | None) -> C:
    """``given`` as a ``cls``: the config itself, built from a mapping of its fields (each checked by the class),
    or the defaults (None)."""
    if isinstance(given, cls):
        return given
    if given is not None and not isinstance(given, Mapping):
        raise TypeError(f"expected a {cls.__name__} or a mapping of its fields, got {type(given).__name__}")
    return cls(**(given or {}))


def readout_config(given: ReadoutConfig | Settings | None) -> ReadoutConfig:
    """The readout: the config itself, or its settings resolved once (``resolve.readout``: ``also``
    comma-separated or a tuple; a tuned lens parsed, its stamp read, its fit's digest taken)."""
    if isinstance(given, ReadoutConfig):
        return given
    return resolve.readout(**dict(given or {}))


def score_run(
    *,
    store: StoreSpec,
    source: Path = Path(),
    readout: ReadoutConfig | Settings | None = None,
    dtr: DTRConfig | Settings | None = None,
    tcb: bool | None = None,
    tcb_settings: TCBConfig | Settings | None = None,
    engine: EngineConfig | Settings | None = None,
    tokens: bool = ScoreRun.tokens,
    batch_size: int = ScoreRun.batch_size,
    skip_bad: bool = ScoreRun.skip_bad,
    command: str | None = None,
) -> Built[ScoreRun]:
    """A ``score`` run of the records in ``source`` (the Python front scores records it holds: ``source`` left
    empty). ``tcb`` None: the TCB fields on the transformers readout, none in a vLLM engine (which cannot compute
    them); asking for them there, or for the top-K settling rule (``settle``), is refused before any engine
    starts."""
    built_engine = config(EngineConfig, engine)
    built_dtr = config(DTRConfig, dtr)
    in_engine = built_engine.backend == "vllm"
    if in_engine and built_dtr.top_k is not None:
        raise InputError(
            f"{named('settle', built_dtr.settle)} reads out on the transformers path only: use "
            f"{named('backend', 'hf')}",
            setting="settle",
            value=built_dtr.settle,
        )
    with_tcb = tcb if tcb is not None else not in_engine
    if with_tcb and in_engine:
        raise InputError(
            f"{named('backend', 'vllm')} computes no TCB fields (they need the transformers readout); add "
            f"{named('tcb', False)}",
            setting="tcb",
            value=True,
        )
    run = ScoreRun(
        source,
        store,
        readout=readout_config(readout),
        dtr=built_dtr,
        tcb=config(TCBConfig, tcb_settings) if with_tcb else None,
        tokens=tokens,
        batch_size=batch_size,
        skip_bad=skip_bad,
        engine=built_engine,
        command=command,
    )
    check_machine(run.engine, run.readout)
    return Built(run, warnings=degenerate(run.readout, run.dtr))


@dataclasses.dataclass(frozen=True)
class _Pool:
    """What a generated pool and an online run share: how each response is sampled, read out, made depth of and
    graded, on which engine, for which task — and the task's questions."""

    sampling: SamplingConfig
    readout: ReadoutConfig
    dtr: DTRConfig
    answers: AnswerConfig
    engine: EngineConfig
    task: TaskSpec | None
    questions: tuple[Question, ...]

    def settings(self) -> dict[str, Any]:
        """The run's fields these are (``GenerateRun`` / ``OnlineRun``)."""
        return {k: getattr(self, k) for k in ("sampling", "readout", "dtr", "answers", "engine", "task")}


def _pool(
    task: TaskSpec | Settings | Sequence[Question],
    sampling: SamplingConfig,
    readout: ReadoutConfig | Settings | None,
    dtr: DTRConfig | Settings | None,
    answers: AnswerConfig | Settings | None,
    engine: EngineConfig | Settings | None,
) -> _Pool:
    built_readout = readout_config(readout)  # the lens's own errors before the task is read
    built_dtr, built_engine = config(DTRConfig, dtr), config(EngineConfig, engine)
    check_machine(built_engine, built_readout)  # before the task is read
    if isinstance(task, Mapping):
        task = TaskSpec(**task)
    rules = answer_rules(answers, task if isinstance(task, TaskSpec) else None)  # before the task is read
    spec, questions = questions_of(task)
    return _Pool(sampling, built_readout, built_dtr, rules, built_engine, spec, tuple(questions))


def generate_run(
    *,
    store: StoreSpec,
    task: TaskSpec | Settings | Sequence[Question],
    pool: int = GenerateRun.POOL,
    seed: int = GenerateRun.seed,
    batch_size: int = GenerateRun.batch_size,
    sampling: SamplingConfig | Settings | None = None,
    readout: ReadoutConfig | Settings | None = None,
    dtr: DTRConfig | Settings | None = None,
    answers: AnswerConfig | Settings | None = None,
    engine: EngineConfig | Settings | None = None,
    command: str | None = None,
) -> Built[GenerateRun]:
    """A ``generate`` run (also ``thinkn --out``'s): ``pool`` responses per question of ``task`` — a task's
    spec (or its settings), or questions already at hand —, its questions read and checked."""
    parts = _pool(task, config(SamplingConfig, sampling), readout, dtr, answers, engine)
    run = GenerateRun(store, pool, seed, batch_size, **parts.settings(), command=command)
    return Built(run, parts.questions, degenerate(run.readout, run.dtr))


def online_run(
    *,
    store: StoreSpec,
    task: TaskSpec | Settings | Sequence[Question],
    policy: OnlineConfig | Settings | None = None,
    seed: int = OnlineRun.seed,
    sampling: SamplingConfig | Settings | None = None,
    readout: ReadoutConfig | Settings | None = None,
    dtr: DTRConfig | Settings | None = None,
    answers: AnswerConfig | Settings | None = None,
    engine: EngineConfig | Settings | None = None,
    command: str | None = None,
) -> Built[OnlineRun]:
    """An online Think@n run (``thinkn --online``): the policy decides per question how many responses start and
    where each stops. Sampling settings without ``readout_tokens`` read out the policy's ℓ (no token past it
    decides: ``resolve.online_window``); ℓ beyond ``max_new_tokens`` or the read-out window is refused here
    (``studies.online.check_online``)."""
    from depthlens.studies.online import check_online

    online = config(OnlineConfig, policy)
    if not isinstance(sampling, SamplingConfig):
        given = dict(sampling or {})
        window = resolve.online_window(given.get("readout_tokens"), "readout_tokens" in given, online)
        sampling = SamplingConfig(**{**given, "readout_tokens": window})
    check_online(online, sampling)  # before the task, the model or any generation
    parts = _pool(task, sampling, readout, dtr, answers, engine)
    run = OnlineRun(store, online, seed, **parts.settings(), command=command)
    return Built(run, parts.questions, degenerate(run.readout, run.dtr))


def check_machine(engine: EngineConfig, readout: ReadoutConfig) -> None:
    """A count that this machine cannot hold is refused before any thread starts or any model loads
    (``models.machine``): torch's threads past ``THREADS_PER_CPU`` × the CPUs the process may use, a readout
    budget (``memory_mb``) past the memory it may use. What needs the model's shape too (a batch's working set)
    is refused once that is read, still before anything is sampled (``studies.footprint``)."""
    check_threads(engine.threads)
    if readout.memory_mb is not None:
        check_memory(Need("memory_mb", readout.memory_mb, 2**20, "the readout's working-memory budget"))


def check_ray(ray: RayConfig) -> None:
    """A local Ray (no ``address``: started here with ``workers`` × ``cpus`` CPUs) runs its actors on this
    machine, each holding the model and ``int(cpus)`` OpenMP threads: more of either than the machine has is
    refused (a cluster's own scheduler places actors on its nodes)."""
    here = machines.machine()
    if ray.address is not None or ray.workers * ray.cpus <= here.most_threads:
        return
    setting, value = ("cpus", ray.cpus) if ray.cpus > here.most_threads else ("workers", ray.workers)
    each = f" of {named('cpus', Written(f'{ray.cpus:g}'))} each" if setting == "workers" else ""
    raise InputError(
        setting=setting,
        value=Written(f"{value:g}"),
        requirement=f"a local Ray runs its actors{each} on this machine, which lends the process {here.cpus} CPU"
        f"{'s' if here.cpus != 1 else ''} (from {here.cpus_from}): at most {here.most_threads} in all "
        f"({THREADS_PER_CPU} × its CPUs); lower {named(setting)}, or join a cluster ({named('ray_address')})",
    )


def check_serve(settings: ServeConfig) -> None:
    """A server's launch settings against this machine, before the model loads: its request threads
    (``max_running``, half the tasks the process may start at most) and the bodies of the requests it holds —
    running and queued, each up to ``max_body_bytes`` — in its memory."""
    here = machines.machine()
    if here.tasks is not None and settings.max_running > here.tasks // 2:
        raise InputError(
            setting="max_running",
            value=settings.max_running,
            requirement=f"must be at most {here.tasks // 2:,}: each request runs on a thread, and the process "
            f"may start {here.tasks:,} (from {here.tasks_from})",
        )
    body = settings.max_body_bytes
    check_memory(Need("max_body_bytes", body, 1, "one request's body"))
    held = f"the bodies of {named('max_running', settings.max_running)} requests running and those waiting"
    check_memory(Need("max_queue", settings.max_queue, body, held, body * settings.max_running))


def sample_limit(settings: ServeConfig, lm: Any) -> ServeConfig:
    """``settings`` with ``max_sample_tokens`` — what the transformers engine's memory holds of the KV cache and
    readout of samples sampled together (``studies.footprint.sample_token_bytes``) — and one sample at
    ``max_tokens`` refused where it cannot fit. A vLLM engine sizes its own cache: its settings as they are."""
    from depthlens.studies.footprint import sample_token_bytes

    per_token = sample_token_bytes(lm)
    one = "one sample's KV cache and readout"
    check_memory(Need("max_tokens", settings.max_tokens, per_token, one, 2 * 4 * lm.vocab_rows))
    return dataclasses.replace(settings, max_sample_tokens=machines.machine().memory // per_token)


def questions_of(task: TaskSpec | Settings | Sequence[Question]) -> tuple[TaskSpec | None, list[Question]]:
    """A run's task (None for questions given as they are) and its questions: a task name or file is checked
    before it is read (``evals.loading.check_task``), and a hub or JSONL task holding fewer questions than
    ``questions`` asks for is refused, not cut to what it has."""
    from depthlens.evals import loading

    if isinstance(task, Mapping):
        task = TaskSpec(**task)
    if isinstance(task, TaskSpec):
        loading.check_task(task)
        questions = loading.task_questions(task)
        refuse_short_task(task, questions)
        return task, questions
    given = list(task)
    odd = next((q for q in given if not isinstance(q, Question)), None)
    if odd is not None or isinstance(task, str):
        raise InputError(
            f"task: a task name ('reasoning_gym:chain_sum'), a TaskSpec, or Question objects, not "
            f"{type(odd if odd is not None else task).__name__}"
        )
    return None, given


def refuse_short_task(task: TaskSpec, questions: Sequence[Question]) -> None:
    """``questions`` beyond what a hub or JSONL task holds is refused, not cut silently to what it has (a
    reasoning-gym task generates as many as asked)."""
    asked = task.questions
    if asked is not None and len(questions) < asked:
        raise InputError(
            setting="questions",
            value=asked,
            requirement=f"task {task.name!r} has {len(questions)}; leave out {named('questions')} to ask all of "
            f"them, or ask for {len(questions)} or fewer",
        )


def answer_rules(answers: AnswerConfig | Settings | None, task: TaskSpec | None) -> AnswerConfig:
    """How prompts ask and answers are read; reasoning-gym's own prompt format (``prompt_style`` native) asks a
    reasoning-gym task only."""
    rules = config(AnswerConfig, answers)
    if task is not None and rules.prompt_style == "native" and not task.name.startswith("reasoning_gym:"):
        raise InputError(
            f"{named('prompt_style', 'native')} asks in reasoning-gym's own format, so it needs a reasoning_gym "
            f"task, not {task.name!r}; use {named('prompt_style', 'paper')}",
            setting="prompt_style",
            value="native",
        )
    return rules


def check_window(
    sampling: SamplingConfig, voting: VotingConfig | None = None, online: OnlineConfig | None = None
) -> None:
    """A read-out window (``readout_tokens``) shorter than the prefix a vote decides at — Think@n's ranking
    (``rank_prefix``), the online policy's decision (``decision_prefix``, with ℓ against ``max_new_tokens``) — is
    refused before anything is sampled: the prefix DTR needs every prefix token read out. (``dtr_prefix``, a
    score, is over the read-out tokens it has.)"""
    from depthlens.studies.online import check_online

    if online is not None:
        check_online(online, sampling)
    window, ranked = sampling.readout_tokens, voting.rank_prefix if voting is not None else None
    if window is not None and ranked is not None and window < ranked:
        raise InputError(
            setting="readout_tokens",
            value=window,
            requirement=f"must be at least {named('rank_prefix', ranked)} (Think@n ranks by the DTR of the first "
            f"{ranked} tokens, each read out); raise {named('readout_tokens')} or lower {named('rank_prefix')}",
        )


def degenerate(readout: ReadoutConfig, dtr: DTRConfig) -> tuple[DepthlensWarning, ...]:
    """Settings that run but cannot mean much, one warning each; the run goes on regardless."""
    warnings = []
    bound = DIVERGENCE_MAX.get(readout.divergence)
    if bound is not None and dtr.g >= bound[0]:
        warnings.append(
            DepthlensWarning(
                f"{named('g', Written(f'{dtr.g:g}'))} is not below the largest {readout.divergence} divergence "
                f"({bound[1]}): every token settles at layer 1 and DTR is 0",
                setting="g",
                value=dtr.g,
            )
        )
    if not readout.final_norm and readout.divergence not in ("jsd", "jsd-nat"):
        kind = readout.divergence
        warnings.append(
            DepthlensWarning(
                f"{named('final_norm', False)} with {named('divergence', kind)}: without the final norm, {kind} "
                "has no common scale with g, so settling and DTR may be all or nothing; the ablation is meant "
                "for jsd",
                setting="final_norm",
                value=False,
            )
        )
    return tuple(warnings)


PER_TOKEN_READOUT = ("layer_top_k", "layer_target", "track", "layer_entropy")
"""The readout's per-token fields a request sets on its own (a server's request: the lens, the divergence and the
budget are the server's)."""


def per_token_readout(*, tokens: bool, vocab: int | None = None, **fields: Any) -> ReadoutConfig:
    """What a request asks each read-out token to keep of every layer (``PER_TOKEN_READOUT``: its top-k, the target
    trajectory, tracked ids, the entropy), checked as a run's readout is: each field in its range, only with the
    per-token values (``tokens``), tracked ids below ``vocab`` (the rows the lens reads; None: unknown here). The
    fields given, as a ``ReadoutConfig`` whose other fields are its defaults."""
    unknown = sorted(set(fields) - set(PER_TOKEN_READOUT))
    if unknown:
        raise InputError(f"per_token_readout: {', '.join(unknown)} is not a per-token field of the readout")
    readout = ReadoutConfig(**fields)
    check_layer_top(readout.layer_top_k, tokens)
    check_per_layer(readout, tokens)
    if vocab is not None:
        check_track(readout.track, vocab)
    return readout
