"""Score records in memory: DTR, settling depths and the six baselines per record, from one forward pass a batch.

``score_records`` reads the layers out in-process (transformers), ``score_records_on`` through a reader that does it
itself (a vLLM engine); both yield one result dict per record, in input order. The run that writes a store and
resumes is ``studies.score.run_score``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from depthlens.config import DTRConfig, ReadoutConfig, TCBConfig
from depthlens.errors import InputError, named
from depthlens.metrics.fused import use_compiled
from depthlens.metrics.layer_quantities import LayerQuantities, LayerStat
from depthlens.metrics.token_table import TCB_FIELDS, TokenTable, reduce_readout, sequence_scores, tcb_summary
from depthlens.models.load import LoadedModel
from depthlens.models.threads import use_threads
from depthlens.models.tokens import layer_top_texts, token_texts
from depthlens.readout.stream import TokenSequence, iter_readout, lens_for, model_chunk_sizes, validate
from depthlens.stores.inputs import BadLine, InputRecord
from depthlens.studies.footprint import check_score_batch
from depthlens.studies.layer_settings import (
    check_hidden_budget,
    check_hidden_layers,
    layer_value_fields,
    readout_quantities,
)
from depthlens.studies.score_inputs import checked_sequence, tokenize

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
    plan = _BatchPlan(lm, readout, dtr, tcb, tokens, keep, quantities, block_rows)
    for record in records:
        seq = checked_sequence(lm, record, lambda s, where: validate(lm, s, where), on_skip)
        if seq is None:
            continue
        batch.append((record, seq))
        if len(batch) >= batch_size:
            yield from plan.results(batch)
            batch.clear()
    if batch:
        yield from plan.results(batch)


@dataclasses.dataclass(frozen=True)
class _BatchPlan:
    """What every batch of a ``score_records`` call is read out with: the settings, the hidden layers kept and the
    per-layer quantities, fixed once before the first record."""

    lm: LoadedModel
    readout: ReadoutConfig
    dtr: DTRConfig
    tcb: TCBConfig | None
    tokens: bool
    keep: Sequence[int]
    quantities: LayerQuantities | None
    block_rows: int

    def results(self, batch: list[tuple[InputRecord, TokenSequence]]) -> Iterator[dict[str, Any]]:
        """The results of one batch, in order: one readout pass over its non-empty completions, reduced to token
        tables; an empty completion gets the empty table."""
        lm, readout, dtr, tokens = self.lm, self.readout, self.dtr, self.tokens
        seqs = [s for _, s in batch]
        nonempty = [i for i, s in enumerate(seqs) if s.completion_ids]
        chunks = iter_readout(lm, [seqs[i] for i in nonempty], readout, self.keep)
        # Without per-token output nothing needs the divergence table: settle by exact early exit instead.
        settle_at = dtr.g if readout.early_exit and not tokens and dtr.top_k is None else None
        reduced = reduce_readout(
            chunks,
            len(nonempty),
            lm.n_layers,
            readout.divergence,
            self.tcb,
            settle_at,
            use_compiled(readout.compile, lm.device),
            self.block_rows,
            dtr.top_k,
            readout.layer_top_k if tokens else 0,  # per-token fields: only with the tokens' rows
            self.quantities,
        )
        tables = [TokenTable.empty(lm.n_layers)] * len(seqs)
        for i, table in zip(nonempty, reduced, strict=True):
            tables[i] = table
        for (record, seq), table in zip(batch, tables, strict=True):
            yield _result(lm, record, seq, table, dtr, self.tcb, tokens)


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
