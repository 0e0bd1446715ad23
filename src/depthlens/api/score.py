"""``depthlens.score``: ``depthlens score`` on records a notebook holds — one row per record, the score store's
columns — built by the run builder every front shares (``studies.runs.score_run``) and scored by the CLI's own
functions, in this process or in a vLLM engine; ``out`` keeps a score store as ``depthlens score --out`` writes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from depthlens.api.keywords import this_call, verb, warn
from depthlens.api.progress import Bar, Display, Progress, top_k_words, where_words
from depthlens.api.records import Records, records_of
from depthlens.api.tables import Table
from depthlens.config import (
    Backend,
    Compile,
    DeepRule,
    Divergence,
    DTRConfig,
    EngineConfig,
    LensSpec,
    ReadoutConfig,
    ScoreRun,
    StoreSpec,
    TCBConfig,
    VEff,
)
from depthlens.errors import DepthlensWarning
from depthlens.stores.inputs import BadLine, InputRecord
from depthlens.studies import runs


@verb
def score(
    model: Any,
    records: Records,
    *,
    tokens: bool = ScoreRun.tokens,
    batch_size: int = ScoreRun.batch_size,
    tcb: bool | None = None,
    skip_bad: bool = ScoreRun.skip_bad,
    out: str | Path | None = None,
    progress: Progress = True,
    layer_stats: Mapping[str, Callable[..., Any]] | None = None,
    hidden_layers: Sequence[int] | None = None,
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
    prefix: int | None = None,
    settle: str = "jsd",
    epsilon: float = 1.0,
    v_eff: VEff = "ipr",
    spectral: bool = False,
    power_iterations: int = 100,
    exact: bool = False,
    backend: Backend = "hf",
    dtype: str = "auto",
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    enforce_eager: bool = False,
    kv_cache_gib: float | None = None,
    float32_lens: bool = False,
    threads: int | None = None,
) -> Table:
    """``depthlens score`` on in-memory records (dicts shaped like its JSONL input): one row per record, the score
    store's columns (``tokens``: the per-token ones too). ``tcb`` None: on for ``hf`` only; ``skip_bad``: a record
    the model cannot read is left out (and said); ``out``: the score store kept there. ``layer_stats``: name → a
    function of one block of a layer's float32 log-probabilities [rows, V], kept as ``layer_stat_<name>``;
    ``hidden_layers``: those layers' residual streams as ``hidden_states`` (T, k, d), returned, never stored
    (both ``hf`` only). docs/python.md."""
    layers = _Layers(layer_stats, hidden_layers)
    return _score(model, records, tokens, batch_size, tcb, skip_bad, out, progress, layers)


@dataclasses.dataclass(frozen=True)
class _Layers:
    """What a call keeps of each layer that is no config field: a caller's statistics and the hidden states."""

    stats: Mapping[str, Callable[..., Any]] | None
    hidden: Sequence[int] | None  # as given: checked against the model (``check_hidden_layers``)


def _score(
    model: Any,
    records: Records,
    tokens: bool,
    batch_size: int,
    tcb: bool | None,
    skip_bad: bool,
    out: str | Path | None,
    progress: Progress,
    layers: _Layers,
) -> Table:
    call = this_call()
    readout, dtr, tcb_settings, engine = call.settings(ReadoutConfig, DTRConfig, TCBConfig, EngineConfig)
    inputs = records_of("score", records)
    store = StoreSpec(Path(out) if out is not None else Path(), overwrite=True)
    built = runs.score_run(
        store=store,
        readout=readout,  # lens='tuned:PATH' resolved: its fit's digest in the store
        dtr=dtr,
        tcb=tcb,
        tcb_settings=tcb_settings,
        engine=engine,
        tokens=tokens,
        batch_size=batch_size,
        skip_bad=skip_bad,
        command=call.command,
    )
    warn(built.warnings)
    run = built.run
    layers = _check_layers(model, run, layers, out)
    line = (
        f"depthlens.score: backend {run.engine.backend}, {len(inputs)} record{'s' if len(inputs) != 1 else ''}, "
        f"every completion token read out{top_k_words(run.readout.layer_top_k)}, "
        f"{where_words(model, run.engine, 'score')}"
    )
    skipped: list[BadLine] = []
    with Display(progress, line) as display:
        counts = display.bar("records", len(inputs), "records"), display.bar("tokens", None, "tokens")
        if out is not None:
            results = _into_store(model, run, inputs, counts, layers.stats)
        else:
            results = _in_memory(model, run, inputs, counts, skipped.append if skip_bad else None, layers)
    if skipped:
        reasons = "; ".join(bad.reason for bad in skipped[:5])
        warn([DepthlensWarning(f"{len(skipped)} record(s) the model cannot read were left out: {reasons}")])
    return _table(results)


def _check_layers(model: Any, run: ScoreRun, layers: _Layers, out: str | Path | None) -> _Layers:
    """The per-layer settings against the model, before any engine starts or anything is written: statistics and
    hidden states on the transformers readout only, tracked ids below the vocabulary, each statistic tried on a
    probe block, the hidden layers in 0..L (``studies.layer_settings``), hidden states returned, never stored.
    Returns them checked (the hidden layers as a tuple)."""
    from depthlens.errors import InputError, named
    from depthlens.metrics.layer_quantities import stats_need_hf
    from depthlens.studies.layer_settings import check_hidden_layers, readout_quantities

    stats_need_hf(layers.stats, run.engine.backend)
    for wrong, requirement in (
        (
            run.engine.backend == "vllm",
            f"are taken by the transformers readout: use {named('backend', 'hf')}",
        ),
        (out is not None, f"are returned, never stored: score them with {named('out', None)}"),
    ):
        if layers.hidden and wrong:
            raise InputError(
                setting="hidden_layers", value=layers.hidden, requirement=f"hidden states {requirement}"
            )
    if model is None:
        return layers
    reader = model
    if run.engine.backend == "vllm":
        from depthlens.models.info import info_of

        reader = info_of(model)
    readout_quantities(reader, run.readout, layers.stats, run.tokens)
    return _Layers(layers.stats, check_hidden_layers(layers.hidden, model.n_layers))


def _in_memory(
    model: Any,
    run: ScoreRun,
    inputs: list[InputRecord],
    counts: tuple[Bar, Bar],
    on_skip: Any,
    layers: _Layers,
) -> list[dict[str, Any]]:
    """Each record's result, scored here (or read out in a vLLM engine started for the call, stopped after),
    counted on the bars as it comes; ``layer_top_tokens`` where the tokenizer is at hand."""
    from depthlens.api.pools import stop_engine
    from depthlens.studies.score import engine_reader, records_of_run
    from depthlens.studies.scoring import score_records_on, with_layer_top_tokens

    if run.engine.backend == "vllm":
        from depthlens.models.info import info_of

        info = info_of(model)
        reader = engine_reader(info, run)
        try:
            results = score_records_on(
                reader, info, inputs, dtr=run.dtr, tcb=run.tcb, tokens=run.tokens, batch_size=run.batch_size
            )
            return [with_layer_top_tokens(r, info.tokenizer) for r in _counted(results, *counts)]
        finally:
            stop_engine(reader)
    results = records_of_run(model, run, inputs, on_skip, layers.stats, layers.hidden or ())
    tokenizer = getattr(model, "tokenizer", None)
    return [with_layer_top_tokens(r, tokenizer) for r in _counted(results, *counts)]


def _into_store(
    model: Any,
    run: ScoreRun,
    inputs: list[InputRecord],
    counts: tuple[Bar, Bar],
    layer_stats: Mapping[str, Callable[..., Any]] | None,
) -> list[Any]:
    """The records scored into the store ``run.store.out`` names (replacing one there), as ``depthlens score
    --out`` writes it — its manifest records this call —, and read back."""
    from depthlens.stores.parquet import iter_store
    from depthlens.studies.score import ScoreEvents, run_score
    from depthlens.studies.scoring import with_layer_top_tokens

    records, tokens = counts

    def on_record(result: dict[str, Any]) -> None:
        records.advance()
        tokens.advance(int(result.get("token_count") or 0))

    events = ScoreEvents(on_start=records.start, on_record=on_record)
    reader = model
    if run.engine.backend == "vllm":
        from depthlens.models.info import info_of

        reader = info_of(model)
    run_score(reader, run, events, records=inputs, layer_stats=layer_stats)
    tokenizer = getattr(model, "tokenizer", None)
    return [with_layer_top_tokens(r, tokenizer) for r in iter_store(run.store.out)]


def _counted(results: Iterable[dict[str, Any]], records: Bar, tokens: Bar) -> list[dict[str, Any]]:
    """Every scored result, each counted on the bars as it comes (as ``ScoreEvents.on_record`` counts them)."""
    done = []
    for result in results:
        done.append(result)
        records.advance()
        tokens.advance(int(result.get("token_count") or 0))
    return done


def _table(results: list[dict[str, Any]]) -> Table:
    from depthlens.stores.arrow import to_table

    return to_table(results)
