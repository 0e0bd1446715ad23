"""Score responses: DTR, settling depths and the six baselines per record, from one forward pass each.

``score`` works on records in memory and returns result dicts; ``run_score`` (a ``config.ScoreRun``) reads JSONL or
Parquet records, writes a results store as records finish, and resumes an interrupted run.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from depthlens import __version__
from depthlens.config import DTRConfig, ReadoutConfig, ScoreRun, TCBConfig
from depthlens.errors import DepthlensError, InputError, StoreError, named
from depthlens.metrics.fused import use_compiled
from depthlens.metrics.layer_quantities import LayerStat, stat_widths, stats_need_hf
from depthlens.metrics.token_table import TCB_FIELDS, TokenTable, reduce_readout, sequence_scores, tcb_summary
from depthlens.models.load import LoadedModel
from depthlens.models.precision import precision_of
from depthlens.models.threads import use_threads
from depthlens.models.tokens import layer_top_texts, token_texts
from depthlens.readout.stream import TokenSequence, iter_readout, lens_for, model_chunk_sizes, validate
from depthlens.stores.files import ResumeRules
from depthlens.stores.guard import refuse_same_file
from depthlens.stores.inputs import BadLine, InputRecord, check_record
from depthlens.stores.records import VOCAB
from depthlens.stores.samples import vocab_entry
from depthlens.studies.footprint import check_score_batch
from depthlens.studies.layer_settings import (
    check_hidden_budget,
    check_hidden_layers,
    layer_value_fields,
    readout_quantities,
)
from depthlens.studies.score_inputs import BadRecord, checked_sequence, tokenize

SUMMARY_FIELDS = (
    "token_count",
    "dtr",
    "mean_settling_depth",
    "reverse_token_count",
    "log_prob",
    "log_prob_sum",
    "neg_perplexity",
    "neg_entropy",
    "self_certainty",
)


def _result(
    lm: LoadedModel,
    record: InputRecord,
    seq: TokenSequence,
    table: TokenTable,
    dtr: DTRConfig,
    tcb: TCBConfig | None,
    tokens: bool,
) -> dict[str, Any]:
    scores = sequence_scores(table, dtr, lm.n_layers)
    result: dict[str, Any] = {"id": record.id}
    result.update({k: scores[k] for k in SUMMARY_FIELDS})
    if dtr.dtr_prefix_tokens is not None:
        result["dtr_prefix"] = scores["dtr_prefix"]
    if tcb is not None:
        result.update(tcb_summary(table.tcb))
    if tokens:
        ids = list(seq.completion_ids)
        result["token_ids"] = ids
        if lm.tokenizer is not None:
            result["tokens"] = token_texts(lm.tokenizer, ids)  # labels for people; token_ids are the record
        result["settling_depth"] = scores["settling_depth"].tolist()
        result["deep"] = scores["deep"].tolist()
        if table.divergence is not None:
            result["divergence"] = [[round(v, 6) for v in row] for row in table.divergence.tolist()]
        if table.layer_top_ids is not None and table.layer_top_probs is not None:
            result["layer_top_ids"] = table.layer_top_ids.tolist()  # [T][L][K]; strings only where shown
            result["layer_top_probs"] = [
                [[round(p, 6) for p in layer] for layer in token] for token in table.layer_top_probs.tolist()
            ]
        result.update(layer_value_fields(table.layer_values, digits=6))
        for key in TCB_FIELDS:
            if key in table.tcb:
                result[key] = table.tcb[key].tolist()
    if table.hidden is not None:  # asked for by the caller (``hidden_layers``): returned, never stored
        result["hidden_states"] = table.hidden.numpy()
    return result


def with_layer_top_tokens(result: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """``result`` with ``layer_top_tokens`` — each layer's top-k ids as readable labels, [T][L][K] — where it has
    ids and a ``tokenizer`` is at hand: for outputs people read (the Python verbs' tables, a served response);
    a store keeps the ids only."""
    if tokenizer is None or "layer_top_ids" not in result:
        return result
    return {**result, "layer_top_tokens": layer_top_texts(tokenizer, result["layer_top_ids"])}


def score_records(
    lm: LoadedModel,
    records: Iterable[InputRecord],
    *,
    readout: ReadoutConfig = ReadoutConfig(),
    dtr: DTRConfig = DTRConfig(),
    tcb: TCBConfig | None = TCBConfig(),
    tokens: bool = False,
    batch_size: int = 1,
    on_skip: Callable[[BadLine], None] | None = None,
    threads: int | None = None,
    layer_stats: Mapping[str, LayerStat] | None = None,
    hidden_layers: Sequence[int] = (),
) -> Iterator[dict[str, Any]]:
    """Yield one result per record, in input order, a batch at a time.

    Records the model cannot take (too long, empty prompt) raise InputError, or go to ``on_skip`` when given.
    ``threads``: torch's intra-op threads (None: ``models.threads``'s choice for scoring). ``layer_stats``: a
    caller's statistics of each layer's log-probabilities (``metrics.layer_quantities``; with ``tokens``), each
    stored as ``layer_stat_<name>``; ``hidden_layers``: those layers' residual streams (0..L, as
    ``output_hidden_states`` numbers them) in each result's ``hidden_states`` (T, k, d) float32, each record's
    within the readout's memory budget. Both are tried before any record is read (``studies.layer_settings``).
    """
    if batch_size < 1:
        raise InputError(f"batch_size = {batch_size}; use 1 or more")
    check_score_batch(lm, batch_size)  # a batch the machine cannot hold, before a thread or a product
    use_threads("score", lm.device.type, threads)
    quantities = readout_quantities(lm, readout, layer_stats, tokens)  # refused here, before any readout
    keep = check_hidden_layers(hidden_layers, lm.n_layers)
    if keep:  # every record's hidden states are returned together: their sum within the budget, checked first
        records = list(records)
        check_hidden_budget(lm, readout, keep, sum(_completion_length(lm, r) for r in records))
    batch: list[tuple[InputRecord, TokenSequence]] = []
    block_rows = model_chunk_sizes(lm, lens_for(lm, readout), readout)[1]  # token-layer rows per lens product

    def flush() -> Iterator[dict[str, Any]]:
        seqs = [s for _, s in batch]
        chunks = iter_readout(lm, [s for s in seqs if s.completion_ids], readout, keep)
        nonempty = [i for i, s in enumerate(seqs) if s.completion_ids]
        # Without per-token output nothing needs the divergence table: settle by exact early exit instead.
        settle_at = dtr.g if readout.early_exit and not tokens and dtr.top_k is None else None
        layer_top = readout.layer_top_k if tokens else 0  # per-token fields: only with the tokens' rows
        compiled = use_compiled(readout.compile, lm.device)
        reduced = reduce_readout(
            chunks,
            len(nonempty),
            lm.n_layers,
            readout.divergence,
            tcb,
            settle_at,
            compiled,
            block_rows,
            dtr.top_k,
            layer_top,
            quantities,
        )
        tables = [TokenTable.empty(lm.n_layers)] * len(seqs)
        for i, table in zip(nonempty, reduced, strict=True):
            tables[i] = table
        for (record, seq), table in zip(batch, tables, strict=True):
            yield _result(lm, record, seq, table, dtr, tcb, tokens)
        batch.clear()

    for record in records:
        seq = checked_sequence(lm, record, lambda s, where: validate(lm, s, where), on_skip)
        if seq is None:
            continue
        batch.append((record, seq))
        if len(batch) >= batch_size:
            yield from flush()
    if batch:
        yield from flush()


def _completion_length(lm: LoadedModel, record: InputRecord) -> int:
    """How many tokens of ``record`` are read out (0 for one the model cannot take: it is refused or skipped when
    its turn comes)."""
    try:
        return len(tokenize(lm, record.data, f"record {record.id!r}").completion_ids)
    except InputError:
        return 0


def score_records_on(
    reader: Any,
    lm: Any,
    records: Iterable[InputRecord],
    *,
    dtr: DTRConfig = DTRConfig(),
    tcb: TCBConfig | None = None,
    tokens: bool = False,
    batch_size: int = 1,
    on_skip: Callable[[BadLine], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """``score_records`` with each batch's tables read by ``reader`` (its ``validate`` and ``tables``):
    ``sampling.vllm.prefill.EngineScorer`` teacher forces the records through a vLLM engine that reads the layers
    out itself, and ``lm`` is then a ``models.info.ModelInfo``. No TCB fields there."""
    if tcb is not None:
        raise InputError(
            f"the TCB fields need the transformers readout: add {named('tcb', False)}, or use "
            f"{named('backend', 'hf')}"
        )
    if dtr.top_k is not None:
        raise InputError(
            f"{named('settle', dtr.settle)} needs the transformers readout: use {named('backend', 'hf')}"
        )
    if batch_size < 1:
        raise InputError(f"batch_size = {batch_size}; use 1 or more")
    batch: list[tuple[InputRecord, TokenSequence]] = []
    for record in [*records, None]:
        if record is not None:
            seq = checked_sequence(lm, record, reader.validate, on_skip)
            if seq is None:
                continue
            batch.append((record, seq))
        if batch and (record is None or len(batch) >= batch_size):
            tables = reader.tables([s for _, s in batch])
            for (rec, seq), table in zip(batch, tables, strict=True):
                yield _result(lm, rec, seq, table, dtr, None, tokens)
            batch.clear()


def engine_reader(info: Any, run: ScoreRun, progress: Callable[[str], None] | None = None) -> Any:
    """The reader of ``score --backend vllm``: an ``EngineScorer`` for ``run.engine``, its KV cache sized for
    ``run.batch_size`` records of up to the engine's (or the model's) longest sequence; ``progress``: where the
    engine's start is told (None: on stderr)."""
    from depthlens.sampling.choose import say
    from depthlens.sampling.vllm.engine import JobSize
    from depthlens.sampling.vllm.prefill import EngineScorer

    longest = run.engine.max_model_len or info.max_positions or 4096
    job = JobSize(run.batch_size, longest)
    return EngineScorer(
        info, run.readout, run.engine, job=job, progress=say if progress is None else progress
    )


def score(
    lm: LoadedModel,
    records: Iterable[dict[str, Any]],
    *,
    readout: ReadoutConfig = ReadoutConfig(),
    dtr: DTRConfig = DTRConfig(),
    tcb: TCBConfig | None = TCBConfig(),
    tokens: bool = False,
    batch_size: int = 1,
    layer_stats: Mapping[str, LayerStat] | None = None,
    hidden_layers: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """Score in-memory records (dicts shaped like the JSONL input) and return their results (``score_records``'s
    ``layer_stats`` and ``hidden_layers`` too)."""
    inputs = []
    for i, data in enumerate(records):
        check_record(data, f"record {i}")
        inputs.append(InputRecord(str(data.get("id", i)), 0, data))
    results = score_records(
        lm,
        inputs,
        readout=readout,
        dtr=dtr,
        tcb=tcb,
        tokens=tokens,
        batch_size=batch_size,
        layer_stats=layer_stats,
        hidden_layers=hidden_layers,
    )
    return list(results)


def score_summary(results: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What a person looks for at the end of a run: how many records, mean DTR and settling depth over the records
    with tokens, the most and least deep records, and the share of deep-thinking tokens over all tokens."""
    rows = list(results)
    scored = [r for r in rows if r.get("token_count") and r.get("dtr") is not None]
    tokens = sum(r["token_count"] for r in scored)
    return {
        "records": len(rows),
        "scored": len(scored),
        "tokens": tokens,
        "mean_dtr": sum(r["dtr"] for r in scored) / len(scored) if scored else None,
        "mean_settling_depth": (
            sum(r["mean_settling_depth"] for r in scored) / len(scored) if scored else None
        ),
        "deep_share": sum(r["dtr"] * r["token_count"] for r in scored) / tokens if tokens else None,
        "most_deep": max(scored, key=lambda r: r["dtr"]) if scored else None,
        "least_deep": min(scored, key=lambda r: r["dtr"]) if scored else None,
    }


MANIFEST_DEFAULTS = {
    "readout": ReadoutConfig().to_dict(),
    "dtr": DTRConfig().to_dict(),
    "tcb": TCBConfig().to_dict(),  # ``exact`` came later: float64 stores resume in float32, within 1e-4 of them
    "layer_stats": {},  # a caller's statistics (name → m) came later: stores before them hold none
}
"""Settings a manifest written before a field existed is read with (``stores.files.ResumeRules``)."""
# ``vocab_rows``: a store from before it was recorded resumes (the model is compared by name)
RESUME_RULES = ResumeRules(defaults=MANIFEST_DEFAULTS, free=(VOCAB,))


def score_manifest(
    model: str,
    n_layers: int | None,
    run: ScoreRun,
    store: dict[str, Any] | None,
    layer_stats: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The manifest of a ``score`` run; ``n_layers`` None (model not loaded yet) leaves it out; ``store`` the Parquet
    store's own settings (``{"format": "parquet", "float16": …}``), None for JSONL; ``layer_stats``: the caller's
    statistics it stores, name → m (``metrics.layer_quantities.stat_widths``): a resumed run must bring the same."""
    manifest = {
        "depthlens_version": __version__,
        "model": model,
        "n_layers": n_layers,
        "input": str(run.source) if run.source != Path() else "records given in Python",
        "readout": run.readout.to_dict(),
        "dtr": run.dtr.to_dict(),
        "tcb": run.tcb.to_dict() if run.tcb is not None else None,
        "tokens": run.tokens,
        "layer_stats": dict(layer_stats or {}),
        "command": run.command or " ".join(sys.argv),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if store is not None:
        manifest["store"] = store
    if n_layers is None:
        del manifest["n_layers"]
    return manifest


@dataclasses.dataclass(frozen=True)
class ScoreEvents:
    """Progress callbacks of a ``score`` run: the total and already-done records once the store is open, each
    finished result (in-process) or block of results (Ray), and the ids of records scored again because their
    input changed since (a resumed run)."""

    on_start: Callable[[int, int], None] = lambda total, done: None
    on_record: Callable[[dict[str, Any]], None] = lambda result: None
    on_block: Callable[[int], None] = lambda n: None
    on_rescore: Callable[[list[str]], None] = lambda ids: None


def run_score(
    lm: LoadedModel,
    run: ScoreRun,
    events: ScoreEvents = ScoreEvents(),
    reader: Any = None,
    records: Sequence[InputRecord] | None = None,
    layer_stats: Mapping[str, LayerStat] | None = None,
) -> list[BadLine]:
    """Score every record of ``run.source`` — or ``records``, given in Python — into ``run.store``; returns the
    lines skipped (with ``skip_bad``).

    ``run.engine`` vllm: the records are teacher forced through a vLLM engine that reads the layers out itself
    (``score_records_on``; ``lm`` may then be a ``models.info.ModelInfo``); ``reader``: one already started for
    these settings, else one is built (``engine_reader``). ``layer_stats``: a caller's statistics of each layer's
    log-probabilities (transformers readout, with ``run.tokens``), tried before the store is touched and stamped in
    its manifest (name → m); a resumed run must bring the same names.

    On resume, records whose input changed since they were scored (the manifest keeps a hash per record) are
    dropped from the store and scored again; ``events.on_rescore`` gets their ids. The store is a sharded Parquet
    store (a directory; per-token floats as float32, or ``float16``) unless it is named ``*.jsonl`` or is an
    existing JSONL file (``stores.formats.results_format``). The input may be JSONL or Parquet.
    """
    from depthlens.stores.formats import open_results, read_inputs, results_format, store_entry

    out_path, spec = run.store.out, run.store
    refuse_same_file(run.source, out_path)
    if run.readout.lens.path is not None and run.engine.backend != "vllm":
        lens_for(lm, run.readout)  # a lens fitted to another model is refused before the store is touched
    stats_need_hf(layer_stats, run.engine.backend)
    # tracked ids and statistics checked against the model before the store is touched
    quantities = readout_quantities(lm, run.readout, layer_stats, run.tokens)
    widths = stat_widths(quantities.stats) if quantities else {}
    records, skipped = (list(records), []) if records is not None else read_inputs(run.source, run.skip_bad)
    store = store_entry(results_format(out_path), spec.float16)
    manifest = {
        **score_manifest(lm.name, lm.n_layers, run, store, widths),
        "precision": precision_of(lm, run.engine),
        **vocab_entry(lm),  # every stored token id is checked against it (stores.meaning)
    }
    hashes = {r.id: r.digest for r in records}
    with open_results(
        out_path, manifest, resume=spec.resume, overwrite=spec.overwrite, rules=RESUME_RULES, hashes=hashes
    ) as writer:
        events.on_rescore(writer.rescored)
        todo = [r for r in records if r.id not in writer.done]
        events.on_start(len(records), len(records) - len(todo))
        on_skip = skipped.append if run.skip_bad else None
        results = _score_results(lm, run, todo, reader, on_skip, layer_stats)
        try:
            for result in results:
                writer.write(result)
                events.on_record(result)
        except DepthlensError as exc:
            if isinstance(exc, StoreError):  # the store's own error already says how to go on
                raise
            if isinstance(exc, BadRecord):  # --resume alone would stop at the same record again
                raise InputError(
                    f"{exc.problem} — results finished so far are kept in {out_path}; rerun with "
                    f"{named('resume', True)} {named('skip_bad', True)} to score the rest, skipping such records"
                ) from exc
            raise type(exc)(
                f"{exc} — results finished so far are kept in {out_path}; rerun with {named('resume')}"
            ) from exc
        _note_skipped(writer, records, skipped)
        if writer.rescored and results_format(out_path) == "jsonl":  # re-scored records went to the end
            from depthlens.stores.jsonl import reorder

            reorder(out_path, list(hashes))
    return skipped


def _note_skipped(writer: Any, records: list[InputRecord], skipped: list[BadLine]) -> None:
    """The input records this run skipped (``--skip-bad``), kept in the manifest: a store that holds every record
    but those is whole (``stores.shortfall``), not cut short."""
    by_line = {r.line: r.id for r in records if r.line}
    ids = sorted({by_line[b.line] for b in skipped if b.line in by_line})
    if ids:
        writer.note("skipped", ids)


def _score_results(
    lm: LoadedModel,
    run: ScoreRun,
    todo: list[InputRecord],
    reader: Any,
    on_skip: Callable[[BadLine], None] | None,
    layer_stats: Mapping[str, LayerStat] | None = None,
) -> Iterator[dict[str, Any]]:
    """The results of ``todo``, in order: read out in a vLLM engine (``reader``; one is started here for a vllm
    run with records left to score) or in-process."""
    if run.engine.backend == "vllm" and reader is None and todo:
        reader = engine_reader(lm, run)
    if reader is not None:
        return score_records_on(
            reader,
            lm,
            todo,
            dtr=run.dtr,
            tcb=run.tcb,
            tokens=run.tokens,
            batch_size=run.batch_size,
            on_skip=on_skip,
        )
    return score_records(
        lm,
        todo,
        readout=run.readout,
        dtr=run.dtr,
        tcb=run.tcb,
        tokens=run.tokens,
        batch_size=run.batch_size,
        on_skip=on_skip,
        threads=run.engine.threads,
        layer_stats=layer_stats,
    )
