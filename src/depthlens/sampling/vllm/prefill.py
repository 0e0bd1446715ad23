"""Read out given completions teacher-forced through the engine: ``depthlens score --backend vllm``.

Each record goes in as one request whose prompt is prompt + completion, with ``max_tokens = 1``; the worker reads
out every position that predicts a completion token, inside the prefill (``RequestReadout.prompt_from``), with
the same lens and metric functions as generation, and also the final layer's log p, entropy and self-certainty
of each completion token (and with ``readout.layer_top_k`` each layer's top-k tokens, as ``TokenTable`` holds
them). The engine batches the records' prefills as it batches any prompts.

Prefix caching would skip positions whose KV blocks another record already computed (their states would never
be captured), so every request carries its own ``cache_salt``: each record is prefilled whole.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from depthlens.config import EngineConfig, ReadoutConfig
from depthlens.errors import InputError, named
from depthlens.metrics.token_table import TokenTable
from depthlens.models.info import ModelInfo, info_of
from depthlens.readout.stream import TokenSequence
from depthlens.sampling.vllm.engine import EngineError, JobSize, readout_capture, start_engine
from depthlens.sampling.vllm.generator import nonfinite_error, take_readout
from depthlens.sampling.vllm.settings import TAG_KEY, Taken, request_readout

_REQUEST_IDS = itertools.count()


class EngineScorer:
    """Teacher-forced readout of token sequences on a vLLM engine; ``TokenTable``s like ``reduce_readout``'s."""

    def __init__(
        self,
        model: ModelInfo | Any,
        readout: ReadoutConfig = ReadoutConfig(),
        engine: EngineConfig = EngineConfig(backend="vllm"),
        llm_engine: Any | None = None,
        job: JobSize | None = None,
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.info = info_of(model)
        self.n_layers = self.info.n_layers
        # the primary divergence, read at every completion position inside the prefill
        self.settings = request_readout(readout, engine, self.info, model, window=0, primary_only=True)
        if llm_engine is None:
            llm_engine = start_engine(
                self.info, engine, job or JobSize(8, self.info.max_positions or 4096), progress
            )
        self.engine = llm_engine
        if readout_capture(self.engine) is None:
            raise EngineError("this vLLM engine was started without depthlens's in-engine readout")

    def validate(self, seq: TokenSequence, where: str) -> None:
        """Refuse a record the engine cannot read out (empty prompt, unknown token ids, longer than the engine)."""
        self.info.validate([*seq.prompt_ids, *seq.completion_ids], 0, where)
        limit = self.engine.model_config.max_model_len
        total = len(seq.prompt_ids) + len(seq.completion_ids)
        if total >= limit:  # the engine samples one token after the record
            raise InputError(
                f"{where}: {total} tokens do not fit the engine's {named('max_model_len')} {limit}; raise it (up to "
                f"the "
                "model's context) or shorten the record"
            )

    def tables(self, sequences: Sequence[TokenSequence]) -> list[TokenTable]:
        """One ``TokenTable`` per sequence (empty for an empty completion), all read in one engine batch."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids: dict[str, int] = {}
        for i, seq in enumerate(sequences):
            if not seq.completion_ids:
                continue
            request_id = f"depthlens-score-{next(_REQUEST_IDS)}"
            readout = dataclasses.replace(self.settings, prompt_from=len(seq.prompt_ids))
            params = SamplingParams(
                n=1,
                max_tokens=1,
                temperature=0.0,
                detokenize=False,
                extra_args={TAG_KEY: request_id, **readout.to_extra()},
            )
            tokens = [*seq.prompt_ids, *seq.completion_ids]
            self.engine.add_request(
                request_id, TokensPrompt(prompt_token_ids=tokens, cache_salt=request_id), params
            )
            ids[request_id] = i
        waiting = set(ids)
        try:
            while waiting:
                if not self.engine.has_unfinished_requests():
                    raise EngineError(
                        f"vLLM ended requests without reporting them; rerun with {named('resume')}"
                    )
                waiting -= {o.request_id for o in self.engine.step() if o.finished}
            taken = take_readout(self.engine, list(ids))
        except BaseException:
            self.engine.abort_request(list(ids))
            raise
        out = [TokenTable.empty(self.n_layers) for _ in sequences]
        for request_id, i in ids.items():
            out[i] = self._table(sequences[i], taken.get(request_id, Taken([], torch.zeros(0))), request_id)
        return out

    def _table(self, seq: TokenSequence, taken: Taken, request_id: str) -> TokenTable:
        n = len(seq.completion_ids)
        positions, rows, base = taken.positions, taken.rows, taken.base
        top, per_layer = self.settings.layer_top_k, self.settings.per_layer
        if (
            positions != list(range(n))
            or base is None
            or (top and taken.top_ids is None)
            or (per_layer and not taken.values)
        ):
            raise EngineError(
                f"the engine read out positions {positions[:5]}… of {n} for {request_id}; report it with the vLLM "
                "version"
            )
        bad = torch.isnan(rows).flatten(1).any(dim=1).nonzero()
        if bad.numel():
            raise nonfinite_error(int(bad[0]))
        return TokenTable(
            target_ids=torch.tensor(list(seq.completion_ids), dtype=torch.long),
            divergence=rows[:, 0],
            log_prob=base[:, 0],
            entropy=base[:, 1],
            self_certainty=base[:, 2],
            layer_top_ids=taken.top_ids.long() if taken.top_ids is not None else None,
            layer_top_probs=taken.top_probs,
            layer_values=dict(taken.values or {}),
        )
