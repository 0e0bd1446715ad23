"""The verbs that sample pools — ``generate`` (a pool per question, every read-out token's layers), ``online`` (the
live policy) — and ``responses`` (a sample store on disk as ``generate``'s table). Each builds its run with the
builder every front shares (``studies.runs``) and runs the CLI's own studies (``studies.generate``,
``studies.online``); a store the caller names none for is written into a temporary directory read back and
removed (``api.scratch``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from depthlens.api.keywords import this_call, verb, warn
from depthlens.api.progress import Display, Progress, counted, readout_words, where_words
from depthlens.api.scratch import scratch_or
from depthlens.api.tables import Table, carrying
from depthlens.config import (
    PREFIX_TOKENS,
    AnswerConfig,
    AnswerType,
    Backend,
    Compile,
    DeepRule,
    Divergence,
    DTRConfig,
    EngineConfig,
    Fallback,
    GenerateRun,
    LensSpec,
    OnlineConfig,
    OnlineRun,
    PromptStyle,
    ReadoutConfig,
    SamplingConfig,
    Signal,
    StoreSpec,
    TaskSpec,
)
from depthlens.errors import InputError
from depthlens.evals.tasks import Question
from depthlens.studies import runs

Task = str | TaskSpec | Sequence[Question]


@verb
def generate(
    model: Any,
    task: Task,
    *,
    pool: int = GenerateRun.POOL,
    seed: int = GenerateRun.seed,
    batch_size: int = GenerateRun.batch_size,
    prefix: int | None = PREFIX_TOKENS,
    out: str | Path | None = None,
    progress: Progress = True,
    layer_stats: Mapping[str, Callable[..., Any]] | None = None,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_new_tokens: int = 512,
    readout_tokens: int | None = 50,
    confidence_top_k: int = 20,
    top_k: int = 0,
    min_p: float = 0.0,
    divergence: Divergence = "jsd",
    final_norm: bool = True,
    memory_mb: int | None = None,
    vocab_size: int | None = None,
    early_exit: bool = True,
    compile: Compile = "auto",
    also: tuple[Divergence, ...] = (),
    lens: str | LensSpec = "logit",
    layer_top_k: int = 0,
    layer_target: bool = False,
    track: tuple[int, ...] = (),
    layer_entropy: bool = False,
    g: float = 0.5,
    rho: float = 0.85,
    deep_rule: DeepRule = "spec",
    settle: str = "jsd",
    prompt_style: PromptStyle = "paper",
    answer_type: AnswerType | None = None,
    fallback: Fallback = "none",
    backend: Backend = "hf",
    dtype: str = "auto",
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    enforce_eager: bool = False,
    kv_cache_gib: float | None = None,
    float32_lens: bool = False,
    threads: int | None = None,
    questions: int | None = None,
    task_seed: int = 0,
    task_config: str | None = None,
    data: str | None = None,
) -> Table:
    """``depthlens generate``: ``pool`` responses per question of ``task`` (a name, a ``TaskSpec`` or Question
    objects), every read-out token's layers, as the sample store's table with its depth (``prefix``: the tokens
    ``dtr_prefix`` covers); ``out`` keeps the store there (replacing one). ``layer_stats``: name → a function of
    one block of a layer's float32 log-probabilities [rows, V], kept per read-out token as ``layer_stat_<name>``
    (``hf`` only). docs/python.md."""
    return _generate(model, task, pool, seed, batch_size, prefix, out, progress, layer_stats)


def _generate(
    model: Any,
    task: Task,
    pool: int,
    seed: int,
    batch_size: int,
    prefix: int | None,
    out: str | Path | None,
    progress: Progress,
    layer_stats: Mapping[str, Callable[..., Any]] | None = None,
) -> Table:
    call = this_call()
    sampling, readout, dtr, answers, engine, task_settings = call.settings(
        SamplingConfig, ReadoutConfig, DTRConfig, AnswerConfig, EngineConfig, TaskSpec
    )
    built = runs.generate_run(
        store=StoreSpec(Path(), overwrite=True),  # every setting checked before a scratch directory is made
        task=_task(task, task_settings),
        pool=pool,
        seed=seed,
        batch_size=batch_size,
        sampling=sampling,
        readout=readout,  # lens='tuned:PATH' resolved: its fit's digest in the store
        dtr={**dtr, "dtr_prefix_tokens": prefix},  # the store's dtr_prefix at the table's
        answers=answers,
        engine=engine,
        command=call.command,
    )
    warn(built.warnings)
    run, questions = built.run, built.questions
    check_layers(model, run, layer_stats)
    line = (
        f"depthlens.generate: backend {run.engine.backend}, {len(questions) * pool} responses "
        f"({counted(len(questions), 'question')} × pool {pool}) of up to {run.sampling.max_new_tokens} tokens, "
        f"{readout_words(run.sampling, run.readout.layer_top_k)}, {where_words(model, run.engine, 'sample')}"
    )
    from depthlens.studies import generate as generation

    with scratch_or(out, call.verb) as where, Display(progress, line) as display:
        run = dataclasses.replace(run, store=StoreSpec(where, overwrite=True))
        done = display.bar("responses", len(questions) * pool, "responses")
        tokens = display.bar("tokens", None, "tokens")
        events = generation.GenerationEvents(done.start, done.advance, tokens.advance)
        with engine_of(model, run, batch_size, questions, display, events.on_token, layer_stats) as backend:
            generation.generate(
                model, run, list(questions), backend=backend, events=events, layer_stats=layer_stats
            )
        return _stored_table(where, prefix, getattr(model, "tokenizer", None), {})


def _task(task: Task, settings: dict[str, Any]) -> TaskSpec | Sequence[Question]:
    """The run's task: a name with the task keywords given (``questions=8``), a ``TaskSpec`` as it is, or
    Question objects."""
    if isinstance(task, str):
        return TaskSpec(name=task, **settings)
    if settings:  # a TaskSpec or questions at hand: the keywords would be dropped
        given = ", ".join(f"{k}=…" for k in settings)
        raise InputError(
            f"depthlens.{this_call().verb}({given}): a task's settings go with its name "
            f"('reasoning_gym:chain_sum', {given}) or into its TaskSpec; questions given as they are take none",
            setting=next(iter(settings)),
        )
    return task


@verb
def responses(
    store: str | Path,
    *,
    prefix: int | None = PREFIX_TOKENS,
    tokenizer: Any = None,
    g: float | None = None,
    rho: float | None = None,
    deep_rule: DeepRule | None = None,
    settle: str | None = None,
) -> Table:
    """A sample store's responses as ``generate``'s table: depth from the stored divergences with the store's DTR
    settings (``g``, ``rho``, ``deep_rule``, ``settle`` override them; None: the store's own), ``tokens`` where a
    ``tokenizer`` is given."""
    (dtr,) = this_call().settings(DTRConfig)
    return _stored_table(Path(store), prefix, tokenizer, dtr)


def _stored_table(store: Path, prefix: int | None, tokenizer: Any, dtr_given: dict[str, Any]) -> Table:
    """A sample store's responses with their depth, carrying its manifest and the settings of that depth."""
    from depthlens.stores.samples import read_manifest, read_responses
    from depthlens.studies.pool_table import pool_rows
    from depthlens.studies.resolve import stored_dtr

    manifest = read_manifest(store)
    dtr = stored_dtr(manifest, dtr_given, "the pool")
    records = [record for _, record in read_responses(store)]
    as_stored = dtr == stored_dtr(manifest, {}, "the pool") and prefix == manifest.get("depth", {}).get(
        "prefix"
    )
    rows = pool_rows(records, int(manifest["n_layers"]), dtr, prefix, tokenizer, as_stored)
    return carrying(rows, {"manifest": manifest, "dtr": dtr.to_dict(), "prefix": prefix})


@contextlib.contextmanager
def engine_of(
    model: Any,
    run: GenerateRun | OnlineRun,
    requests: int,
    questions: Sequence[Question],
    display: Display,
    on_token: Callable[[int], None],
    layer_stats: Mapping[str, Callable[..., Any]] | None = None,
) -> Iterator[Any]:
    """The generation backend ``run`` gets (``make_backend``, as the studies build it: a vLLM engine's KV cache
    sized for ``requests`` of the longest prompt; ``on_token`` told each step's generated tokens, ``display`` the
    engine's start), its engine shut down when the call returns: a notebook goes on after it, and a started
    engine holds its memory until then."""
    from depthlens.sampling.choose import make_backend
    from depthlens.studies.generate import engine_job

    new_tokens = run.sampling.max_new_tokens
    job = engine_job(model, questions, new_tokens, requests, run.answers.prompt_style)
    backend = make_backend(
        model, run.engine, run.sampling, run.readout, on_token, job, display.say, layer_stats=layer_stats
    )
    try:
        yield backend
    finally:
        stop_engine(backend)


def check_layers(
    model: Any, run: GenerateRun | OnlineRun, layer_stats: Mapping[str, Callable[..., Any]] | None = None
) -> None:
    """The per-layer settings against the model before any engine starts (``studies.layer_settings``): statistics
    on the transformers sampler only, each tried on a probe block; tracked ids below the vocabulary."""
    from depthlens.metrics.layer_quantities import stats_need_hf
    from depthlens.studies.layer_settings import readout_quantities

    stats_need_hf(layer_stats, run.engine.backend)
    if model is not None:
        from depthlens.models.info import info_of

        readout_quantities(model if run.engine.backend == "hf" else info_of(model), run.readout, layer_stats)


def stop_engine(reader: Any) -> None:
    """Shut down the vLLM engine a backend or reader started (an ``hf`` one holds none)."""
    started = getattr(reader, "engine", None)
    if started is not None:
        from depthlens.sampling.vllm.engine import stop_engine as stop  # imports no vllm

        stop(started)


@verb
def online(
    model: Any,
    task: Task,
    *,
    seed: int = OnlineRun.seed,
    out: str | Path | None = None,
    progress: Progress = True,
    signal: Signal = "dtr",
    warmup: int = 4,
    max_n: int = 16,
    consensus: float = 0.95,
    keep: float = 0.5,
    prefix: int = 50,
    window: int = 2048,
    batch_size: int = 4,
    threshold: float | None = None,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_new_tokens: int = 512,
    readout_tokens: int | None = 50,
    confidence_top_k: int = 20,
    top_k: int = 0,
    min_p: float = 0.0,
    divergence: Divergence = "jsd",
    final_norm: bool = True,
    memory_mb: int | None = None,
    vocab_size: int | None = None,
    early_exit: bool = True,
    compile: Compile = "auto",
    also: tuple[Divergence, ...] = (),
    lens: str | LensSpec = "logit",
    layer_top_k: int = 0,
    layer_target: bool = False,
    track: tuple[int, ...] = (),
    layer_entropy: bool = False,
    g: float = 0.5,
    rho: float = 0.85,
    deep_rule: DeepRule = "spec",
    dtr_prefix_tokens: int | None = None,
    settle: str = "jsd",
    prompt_style: PromptStyle = "paper",
    answer_type: AnswerType | None = None,
    fallback: Fallback = "none",
    backend: Backend = "hf",
    dtype: str = "auto",
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    enforce_eager: bool = False,
    kv_cache_gib: float | None = None,
    float32_lens: bool = False,
    threads: int | None = None,
    questions: int | None = None,
    task_seed: int = 0,
    task_config: str | None = None,
    data: str | None = None,
) -> Table:
    """``thinkn --online``: the live policy on every question, one row per question (``online.jsonl``'s); ``prefix``
    is its ℓ, which ``readout_tokens`` follows unless given. ``out`` keeps the store. docs/python.md."""
    return _online(model, task, seed, out, progress)


def _online(model: Any, task: Task, seed: int, out: str | Path | None, progress: Progress) -> Table:
    from depthlens.stores.jsonl import iter_jsonl
    from depthlens.studies import online as live

    call = this_call()
    policy, sampling, readout, dtr, answers, engine, task_settings = call.settings(
        OnlineConfig, SamplingConfig, ReadoutConfig, DTRConfig, AnswerConfig, EngineConfig, TaskSpec
    )
    built = runs.online_run(
        store=StoreSpec(Path(), overwrite=True),  # every setting checked before a scratch directory is made
        task=_task(task, task_settings),
        policy=policy,
        seed=seed,
        sampling=sampling,  # no readout_tokens given: the policy's ℓ
        readout=readout,
        dtr=dtr,
        answers=answers,
        engine=engine,
        command=call.command,
    )
    warn(built.warnings)
    run, questions, policy_config = built.run, built.questions, built.run.online
    check_layers(model, run)  # a tracked id past the vocabulary before any engine starts
    requests = max(policy_config.warmup, policy_config.batch_size)  # as ``run_online`` sizes its engine
    line = (
        f"depthlens.online: backend {run.engine.backend}, {counted(len(questions), 'question')} × up to "
        f"{policy_config.max_n} responses (warm-up {policy_config.warmup}) of up to "
        f"{run.sampling.max_new_tokens} tokens, {readout_words(run.sampling, run.readout.layer_top_k)}, "
        + where_words(model, run.engine, "sample")
    )
    with scratch_or(out, call.verb) as where, Display(progress, line) as display:
        run = dataclasses.replace(run, store=StoreSpec(where, overwrite=True))
        done = display.bar("questions", len(questions), "questions")
        tokens = display.bar("tokens", None, "tokens")
        events = live.OnlineEvents(lambda _: done.advance(), on_token=tokens.advance)
        with engine_of(model, run, requests, questions, display, events.on_token) as backend:
            live.run_online(model, run, list(questions), backend=backend, events=events)
        from depthlens.stores.arrow import to_table

        return to_table(list(iter_jsonl(where / live.DECISIONS)))
