"""Score responses: DTR, settling depths and the six baselines per record, from one forward pass each.

``score`` works on records in memory and returns result dicts (the batches are read in ``studies.scoring``);
``run_score`` (a ``config.ScoreRun``) reads JSONL or Parquet records, writes a results store as records finish, and
resumes an interrupted run.
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
from depthlens.metrics.layer_quantities import LayerStat, stat_widths, stats_need_hf
from depthlens.models.load import LoadedModel
from depthlens.models.precision import precision_of
from depthlens.readout.stream import lens_for
from depthlens.stores.files import ResumeRules
from depthlens.stores.guard import refuse_same_file
from depthlens.stores.inputs import BadLine, InputRecord, check_record
from depthlens.stores.records import VOCAB
from depthlens.stores.sample_writes import vocab_entry
from depthlens.studies.layer_settings import readout_quantities
from depthlens.studies.score_inputs import BadRecord
from depthlens.studies.scoring import score_records, score_records_on

__all__ = [  # score_records / score_records_on live in studies.scoring; this path is docs/python.md's
    "RESUME_RULES",
    "ScoreEvents",
    "engine_reader",
    "note_skipped",
    "refuse_same_file",
    "run_score",
    "score",
    "score_manifest",
    "score_records",
    "score_records_on",
    "score_summary",
]


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
    from depthlens.stores.formats import open_results, read_inputs, results_format

    out_path, spec = run.store.out, run.store
    refuse_same_file(run.source, out_path)
    widths = _check_before_store(lm, run, layer_stats)
    records, skipped = (list(records), []) if records is not None else read_inputs(run.source, run.skip_bad)
    hashes = {r.id: r.digest for r in records}
    with open_results(
        out_path,
        _run_manifest(lm, run, widths),
        resume=spec.resume,
        overwrite=spec.overwrite,
        rules=RESUME_RULES,
        hashes=hashes,
    ) as writer:
        events.on_rescore(writer.rescored)
        todo = [r for r in records if r.id not in writer.done]
        events.on_start(len(records), len(records) - len(todo))
        on_skip = skipped.append if run.skip_bad else None
        _write_results(writer, _score_results(lm, run, todo, reader, on_skip, layer_stats), events, out_path)
        note_skipped(writer, records, skipped)
        if writer.rescored and results_format(out_path) == "jsonl":  # re-scored records went to the end
            from depthlens.stores.jsonl import reorder

            reorder(out_path, list(hashes))
    return skipped


def _check_before_store(
    lm: LoadedModel, run: ScoreRun, layer_stats: Mapping[str, LayerStat] | None
) -> dict[str, int]:
    """Every check on the model that can refuse ``run`` before its store is touched: a lens fitted to another model,
    statistics on an engine that cannot compute them, tracked ids and statistics against the model. Returns the
    statistics' widths, name → m, for the manifest."""
    if run.readout.lens.path is not None and run.engine.backend != "vllm":
        lens_for(lm, run.readout)
    stats_need_hf(layer_stats, run.engine.backend)
    quantities = readout_quantities(lm, run.readout, layer_stats, run.tokens)
    return stat_widths(quantities.stats) if quantities else {}


def _run_manifest(lm: LoadedModel, run: ScoreRun, widths: Mapping[str, int]) -> dict[str, Any]:
    """``score_manifest`` of ``run`` on the loaded ``lm``: with its store's format, the precision it computes in and
    the vocabulary every stored token id is checked against (``stores.meaning``)."""
    from depthlens.stores.formats import results_format, store_entry

    store = store_entry(results_format(run.store.out), run.store.float16)
    return {
        **score_manifest(lm.name, lm.n_layers, run, store, widths),
        "precision": precision_of(lm, run.engine),
        **vocab_entry(lm),
    }


def _write_results(
    writer: Any, results: Iterator[dict[str, Any]], events: ScoreEvents, out_path: Path
) -> None:
    """Write each result as it finishes; an error on the way says that the results so far are kept in ``out_path``
    and how to go on from them."""
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


def note_skipped(writer: Any, records: list[InputRecord], skipped: list[BadLine]) -> None:
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
    return records_of_run(lm, run, todo, on_skip, layer_stats)


def records_of_run(
    lm: LoadedModel,
    run: ScoreRun,
    records: Iterable[InputRecord],
    on_skip: Callable[[BadLine], None] | None = None,
    layer_stats: Mapping[str, LayerStat] | None = None,
    hidden_layers: Sequence[int] = (),
) -> Iterator[dict[str, Any]]:
    """``records`` read out in-process under ``run``'s settings (readout, DTR, TCB, tokens, batch, threads): the
    one place a built run becomes ``score_records``'s arguments, for the CLI's store and the Python verb alike."""
    return score_records(
        lm,
        records,
        readout=run.readout,
        dtr=run.dtr,
        tcb=run.tcb,
        tokens=run.tokens,
        batch_size=run.batch_size,
        on_skip=on_skip,
        threads=run.engine.threads,
        layer_stats=layer_stats,
        hidden_layers=hidden_layers,
    )
