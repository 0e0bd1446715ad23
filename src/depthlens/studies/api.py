"""The method from Python (docs/python.md): one call per verb, each returning a ``pyarrow.Table`` whose columns are
the stores' (``.to_pandas()`` for a DataFrame).

- ``score(model, records)``: ``depthlens score``'s results (the score store's columns);
- ``generate(model, task)``: a pool per question with per-token depth (the sample store's columns: ``dtr``,
  ``dtr_prefix``, ``settling_depth``, ``deep``, ``token_count`` as in every other table);
- ``think_at_n(pool_or_store)``: Think@n and its peers over a pool (``thinkn --from``'s summary rows);
- ``online(model, task)``: the live policy (``thinkn --online``'s decision per question);
- ``responses(store)``: a sample store on disk as ``generate``'s table.

Each runs the CLI's code path (the run specs of ``config.run``, ``studies.generate`` / ``online`` / ``thinkn``),
with the CLI's defaults — those of the config classes, which every keyword setting is routed to by its field name
(``temperature=0.6`` → ``SamplingConfig.temperature``). A verb that writes a store writes it into ``out``, or into
a temporary directory it reads back and removes (``studies.scratch``). A verb that runs a model says what it
runs and shows bars (``studies.progress``) unless ``progress=False``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from depthlens.config import (
    PREFIX_TOKENS,
    AnswerConfig,
    DTRConfig,
    EngineConfig,
    GenerateRun,
    OnlineConfig,
    OnlineRun,
    ReadoutConfig,
    SamplingConfig,
    ScoreRun,
    StoreSpec,
    TaskSpec,
    TCBConfig,
    VotingConfig,
)
from depthlens.errors import InputError
from depthlens.evals.loading import task_questions
from depthlens.evals.tasks import Question
from depthlens.models.threads import threads_kept
from depthlens.sampling.choose import make_backend
from depthlens.stores.arrow import to_table
from depthlens.stores.inputs import InputRecord, check_record
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.samples import read_manifest, read_responses
from depthlens.studies import generate as generation
from depthlens.studies import online as live
from depthlens.studies import resolve, thinkn
from depthlens.studies.pool_table import metadata, pool_rows, read_metadata, store_records
from depthlens.studies.progress import Bar, Display, counted, readout_words, top_k_words, where_words
from depthlens.studies.score import engine_reader, score_records, score_records_on, with_layer_top_tokens
from depthlens.studies.scratch import scratch_or

Table = Any  # a pyarrow.Table (pyarrow is imported only under stores/)
Task = str | TaskSpec | Sequence[Question]


def settings_for(verb: str, settings: dict[str, Any], *classes: type) -> list[dict[str, Any]]:
    """``settings`` split by config class, each keyword checked against its field's type (``resolve.split``)."""
    return resolve.split(verb, settings, *classes)


F = TypeVar("F", bound=Callable[..., Any])


def _verb(*classes: type) -> Callable[[F], F]:
    """A verb of the API: its keyword settings (the fields of ``classes``) spelt out, with their types and
    defaults, in its signature (``help()``, an editor's completion), and its errors about a setting phrased for
    Python: ``depthlens.generate(lens='x'): …``."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            # the verb's own keywords (progress, tokens) are known too: `progres=False` is told `progress`
            resolve.refuse_unknown(fn.__name__, kwargs, names)
            with resolve.python_front(fn.__name__, flags), threads_kept():  # the run's threads end with it
                return fn(*args, **kwargs)

        signature = inspect.signature(fn)
        params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        flags = {p.name for p in params if p.annotation in (bool, "bool")}
        taken = {p.name for p in params}
        if "prefix" in taken:  # a verb's own ``prefix`` is the field ``prefix=`` stands for: one name shown
            taken |= {resolve.PREFIX_OF[c] for c in classes if c in resolve.PREFIX_OF}
        for name, (cls, hint) in resolve.fields_of(*classes).items():
            if name not in taken:
                field = next(f for f in dataclasses.fields(cls) if f.name == name)
                default = (
                    field.default if field.default is not dataclasses.MISSING else field.default_factory()
                )  # type: ignore[misc]
                params.append(
                    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint)
                )
        names = {p.name for p in params if p.kind is not p.POSITIONAL_ONLY}
        if any(c in resolve.PREFIX_OF for c in classes):
            names.add("prefix")  # ℓ_prefix's keyword, as on the command line (resolve.split maps it)
        call.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return wrap


def _questions(task: Task, spec: TaskSpec | None) -> tuple[list[Question], TaskSpec | None]:
    """The questions of ``task`` (a task name with ``spec``'s settings, a ``TaskSpec``, or Question objects)."""
    if isinstance(task, TaskSpec):
        return task_questions(task), task
    if isinstance(task, str):
        named = dataclasses.replace(spec or TaskSpec(), name=task)
        return task_questions(named), named
    questions = list(task)
    if not all(isinstance(q, Question) for q in questions):
        raise InputError(
            "task: give a task name ('reasoning_gym:chain_sum'), a TaskSpec, or Question objects"
        )
    return questions, None


@contextlib.contextmanager
def _engine_of(
    model: Any,
    run: GenerateRun | OnlineRun,
    requests: int,
    questions: Sequence[Question],
    display: Display,
    on_token: Callable[[int], None],
) -> Iterator[Any]:
    """The generation backend ``run`` gets (``make_backend``, as the studies build it: a vLLM engine's KV cache
    sized for ``requests`` of the longest prompt; ``on_token`` told each step's generated tokens, ``display`` the
    engine's start), its engine shut down when the call returns: a notebook goes on after it, and a started
    engine holds its memory until then."""
    new_tokens = run.sampling.max_new_tokens
    job = generation.engine_job(model, questions, new_tokens, requests, run.answers.prompt_style)
    backend = make_backend(model, run.engine, run.sampling, run.readout, on_token, job, display.say)
    try:
        yield backend
    finally:
        _stop(backend)


def _stop(reader: Any) -> None:
    """Shut down the vLLM engine a backend or reader started (an ``hf`` one holds none)."""
    started = getattr(reader, "engine", None)
    if started is not None:
        from depthlens.sampling.vllm.engine import stop_engine  # imports no vllm

        stop_engine(started)


@_verb(ReadoutConfig, DTRConfig, TCBConfig, EngineConfig)
def score(
    model: Any,
    records: Iterable[dict[str, Any]],
    *,
    tokens: bool = False,
    batch_size: int = ScoreRun.batch_size,
    tcb: bool | None = None,
    progress: bool = True,
    **settings: Any,
) -> Table:
    """``depthlens score`` on in-memory records (dicts shaped like its JSONL input): one row per record, the score
    store's columns (with ``tokens``: the per-token ones too; with ``layer_top_k``, each layer's top-k and its
    ``layer_top_tokens``). Settings: ``ReadoutConfig``, ``DTRConfig``,
    ``TCBConfig`` and ``EngineConfig`` fields (``backend="vllm"`` reads out in a vLLM engine, which has no TCB:
    ``tcb`` None is on for ``hf`` only). ``progress``: an opening line and bars on stderr (False: nothing)."""
    readout, dtr, tcb_settings, engine = settings_for(
        "score", settings, ReadoutConfig, DTRConfig, TCBConfig, EngineConfig
    )
    inputs = []
    for i, data in enumerate(records):
        check_record(data, f"record {i}")
        inputs.append(InputRecord(str(data.get("id", i)), 0, data))
    run = ScoreRun(
        Path(),
        StoreSpec(Path()),
        resolve.readout(**readout),  # lens='tuned:PATH' resolved: its fit's digest in the store
        DTRConfig(**dtr),
        TCBConfig(**tcb_settings) if tcb or (tcb is None and engine.get("backend") != "vllm") else None,
        tokens,
        batch_size,
        engine=EngineConfig(**engine),
    )
    line = (
        f"depthlens.score: backend {run.engine.backend}, {len(inputs)} record{'s' if len(inputs) != 1 else ''}, "
        f"every completion token read out{top_k_words(run.readout.layer_top_k)}, "
        f"{where_words(model, run.engine, 'score')}"
    )
    with Display(progress, line) as display:
        records_bar = display.bar("records", len(inputs), "records")
        tokens_bar = display.bar("tokens", None, "tokens")
        if run.engine.backend == "vllm":
            from depthlens.models.info import info_of

            info = info_of(model)
            reader = engine_reader(info, run, display.say)
            try:
                results = score_records_on(
                    reader, info, inputs, dtr=run.dtr, tcb=run.tcb, tokens=tokens, batch_size=batch_size
                )
                counted = _counted(results, records_bar, tokens_bar)
                return to_table([with_layer_top_tokens(r, info.tokenizer) for r in counted])
            finally:
                _stop(reader)
        results = score_records(
            model,
            inputs,
            readout=run.readout,
            dtr=run.dtr,
            tcb=run.tcb,
            tokens=tokens,
            batch_size=batch_size,
            threads=run.engine.threads,
        )
        counted = _counted(results, records_bar, tokens_bar)
        tokenizer = getattr(model, "tokenizer", None)
        return to_table([with_layer_top_tokens(r, tokenizer) for r in counted])


def _counted(results: Iterable[dict[str, Any]], records: Bar, tokens: Bar) -> list[dict[str, Any]]:
    """Every scored result, each counted on the bars as it comes (as ``ScoreEvents.on_record`` counts them)."""
    done = []
    for result in results:
        done.append(result)
        records.advance()
        tokens.advance(int(result.get("token_count") or 0))
    return done


@_verb(SamplingConfig, ReadoutConfig, DTRConfig, AnswerConfig, EngineConfig, TaskSpec)
def generate(
    model: Any,
    task: Task,
    *,
    pool: int = GenerateRun.POOL,
    seed: int = GenerateRun.seed,
    batch_size: int = GenerateRun.batch_size,
    prefix: int | None = PREFIX_TOKENS,
    out: str | Path | None = None,
    progress: bool = True,
    **settings: Any,
) -> Table:
    """``depthlens generate``: ``pool`` responses per question of ``task``, every read-out token's layers, as a
    table of the sample store's columns plus their depth (``prefix``: the tokens ``dtr_prefix`` covers). ``out``
    keeps the store there (replacing one). ``progress``: an opening line and bars on stderr (False: nothing).
    Settings: ``SamplingConfig``, ``ReadoutConfig``, ``DTRConfig``, ``AnswerConfig``, ``EngineConfig`` and
    ``TaskSpec`` fields (``backend="vllm"``, ``max_new_tokens=80``, ``task_config="min_terms=2,max_terms=2"``,
    ``questions=8``)."""
    sampling, readout, dtr, answers, engine, task_settings = settings_for(
        "generate",
        {"prefix": prefix, **settings},  # the store's dtr_prefix at the table's
        SamplingConfig,
        ReadoutConfig,
        DTRConfig,
        AnswerConfig,
        EngineConfig,
        TaskSpec,
    )
    questions, task_spec = _questions(task, TaskSpec(**task_settings))
    run = GenerateRun(
        StoreSpec(Path(), overwrite=True),  # every setting checked before a scratch directory is made
        pool,
        seed,
        batch_size,
        SamplingConfig(**sampling),
        resolve.readout(**readout),  # lens='tuned:PATH' resolved: its fit's digest in the store
        DTRConfig(**dtr),
        AnswerConfig(**answers),
        EngineConfig(**engine),
        task_spec,
    )
    line = (
        f"depthlens.generate: backend {run.engine.backend}, {len(questions) * pool} responses "
        f"({counted(len(questions), 'question')} × pool {pool}) of up to {run.sampling.max_new_tokens} tokens, "
        f"{readout_words(run.sampling, run.readout.layer_top_k)}, {where_words(model, run.engine, 'sample')}"
    )
    with scratch_or(out) as where, Display(progress, line) as display:
        run = dataclasses.replace(run, store=StoreSpec(where, overwrite=True))
        done = display.bar("responses", len(questions) * pool, "responses")
        tokens = display.bar("tokens", None, "tokens")
        events = generation.GenerationEvents(done.start, done.advance, tokens.advance)
        with _engine_of(model, run, batch_size, questions, display, events.on_token) as backend:
            generation.generate(model, run, questions, backend=backend, events=events)
        return responses(where, prefix=prefix, tokenizer=getattr(model, "tokenizer", None))


@_verb(DTRConfig)
def responses(
    store: str | Path, *, prefix: int | None = PREFIX_TOKENS, tokenizer: Any = None, **dtr_settings: Any
) -> Table:
    """A sample store's responses as ``generate``'s table: depth from the stored divergences with the store's DTR
    settings (``g``, ``rho``, ``deep_rule`` override them), ``tokens`` where a ``tokenizer`` is given."""
    manifest = read_manifest(Path(store))
    dtr = _dtr(manifest, dtr_settings, "responses")
    records = [record for _, record in read_responses(Path(store))]
    as_stored = dtr == _dtr(manifest, {}, "responses") and prefix == manifest.get("depth", {}).get("prefix")
    rows = pool_rows(records, int(manifest["n_layers"]), dtr, prefix, tokenizer, as_stored)
    table = to_table(rows)
    return table.replace_schema_metadata(metadata(manifest, dtr, prefix))


def _dtr(manifest: dict[str, Any], overrides: dict[str, Any], verb: str) -> DTRConfig:
    """The store's DTR settings, each overridden where given (``thinkn --from``'s ``--g`` / ``--rho``)."""
    (given,) = settings_for(verb, overrides, DTRConfig)
    base = DTRConfig.from_dict(manifest["dtr"]) if "dtr" in manifest else DTRConfig()
    dtr = dataclasses.replace(base, **given)
    resolve.check_stored_settle(manifest, dtr, "the pool")
    return dtr


@_verb(VotingConfig, DTRConfig)
def think_at_n(
    pool: Table | str | Path,
    *,
    methods: Sequence[str] | None = None,
    n: int | None = None,
    lens: str | None = None,
    progress: bool = True,
    **settings: Any,
) -> Table:
    """Think@n and its peers over a pool — ``generate``'s table, or a sample store on disk — as ``thinkn --from``
    votes it (nothing is written): one row per method, the summary CSV's columns. ``n`` None: ``VotingConfig.n``,
    or the smallest usable pool where that is smaller. Settings: ``VotingConfig`` fields, then ``DTRConfig``'s
    (the pool's own DTR settings where not given). ``lens``: the pool votes on what it holds, read through the lens
    it was generated with; another one is refused, naming both. ``progress``: an opening line and a bar of trials
    on stderr (False: nothing)."""
    voting_settings, dtr_settings = settings_for("think_at_n", settings, VotingConfig, DTRConfig)
    if isinstance(pool, (str, Path)):
        manifest = read_manifest(Path(pool))
        records = list(read_responses(Path(pool)))
        where = str(pool)
    else:
        manifest = _table_manifest(pool)
        records = list(store_records(pool.to_pylist()))
        where = "the pool table"
    resolve.check_stored_readout(manifest, where, lens=lens)
    dtr = _dtr(manifest, dtr_settings, "think_at_n")
    usable = Counter(str(r["question_id"]) for _, r in records if r.get("status") != "failed")
    n, _ = resolve.voting_n(n, min(usable.values(), default=None))
    voting = VotingConfig(n=n, **voting_settings)
    pools, info = thinkn.pools_from_records(manifest, records, dtr, voting.n)
    line = (
        f"depthlens.think_at_n: {len(pools)} questions' pools, {voting.trials} trials of n = {voting.n} each, "
        f"{len(methods) if methods is not None else 'all'} methods (no model runs: the pool's stored readout)"
    )
    with Display(progress, line) as display:
        trials = display.bar("trials", voting.trials, "trials")
        report = thinkn.vote_pools(pools, info, voting, dtr, methods, where=where, on_trial=trials.advance)
    return to_table(thinkn.summary_rows(report))


def _table_manifest(table: Table) -> dict[str, Any]:
    """The manifest a pool table carries; a table that lost it (through pandas) gets the parts voting needs."""
    carried = read_metadata(table.schema.metadata)
    if carried is not None:
        return carried["manifest"]
    rows = table.select(["question_id", "divergence"]).to_pylist()
    layers = next((len(r["divergence"][0]) for r in rows if r["divergence"]), 1)
    return {"n_layers": layers, "questions": list(dict.fromkeys(r["question_id"] for r in rows))}


@_verb(OnlineConfig, SamplingConfig, ReadoutConfig, DTRConfig, AnswerConfig, EngineConfig, TaskSpec)
def online(
    model: Any,
    task: Task,
    *,
    seed: int = OnlineRun.seed,
    out: str | Path | None = None,
    progress: bool = True,
    **settings: Any,
) -> Table:
    """``thinkn --online``: the live policy on every question, one row per question (``online.jsonl``'s
    columns: the voted answer, whether it is right, tokens spent, responses started, τ, why sampling stopped and
    every response's decision). ``out`` keeps the store (its responses: ``responses(out)``). ``progress``: an
    opening line and bars on stderr (False: nothing). Settings: ``OnlineConfig`` fields (``prefix``, as
    ``decision_prefix``, is the policy's ℓ; ``readout_tokens`` defaults to it, as the CLI's), then
    ``SamplingConfig``, ``ReadoutConfig``, ``DTRConfig``, ``AnswerConfig``, ``EngineConfig``, ``TaskSpec``."""
    policy, sampling, readout, dtr, answers, engine, task_settings = settings_for(
        "online",
        settings,
        OnlineConfig,
        SamplingConfig,
        ReadoutConfig,
        DTRConfig,
        AnswerConfig,
        EngineConfig,
        TaskSpec,
    )
    online_config = OnlineConfig(**policy)
    sampling["readout_tokens"] = resolve.online_window(
        sampling.get("readout_tokens"), "readout_tokens" in sampling, online_config
    )
    questions, task_spec = _questions(task, TaskSpec(**task_settings))
    run = OnlineRun(
        StoreSpec(Path(), overwrite=True),  # every setting checked before a scratch directory is made
        online_config,
        seed,
        SamplingConfig(**sampling),
        resolve.readout(**readout),  # lens='tuned:PATH' resolved: its fit's digest in the store
        DTRConfig(**dtr),
        AnswerConfig(**answers),
        EngineConfig(**engine),
        task_spec,
    )
    requests = max(online_config.warmup, online_config.batch_size)  # as ``run_online`` sizes its engine
    line = (
        f"depthlens.online: backend {run.engine.backend}, {counted(len(questions), 'question')} × up to "
        f"{online_config.max_n} responses (warm-up {online_config.warmup}) of up to "
        f"{run.sampling.max_new_tokens} tokens, {readout_words(run.sampling, run.readout.layer_top_k)}, "
        + where_words(model, run.engine, "sample")
    )
    with scratch_or(out) as where, Display(progress, line) as display:
        run = dataclasses.replace(run, store=StoreSpec(where, overwrite=True))
        done = display.bar("questions", len(questions), "questions")
        tokens = display.bar("tokens", None, "tokens")
        events = live.OnlineEvents(lambda _: done.advance(), on_token=tokens.advance)
        with _engine_of(model, run, requests, questions, display, events.on_token) as backend:
            live.run_online(model, run, questions, backend=backend, events=events)
        return to_table(list(iter_jsonl(where / live.DECISIONS)))
