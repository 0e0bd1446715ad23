"""Where the engine session's per-token layer divergences come from: one seam, ``DepthSource``.

The engine session (``sampling.vllm.session``) samples with vLLM and asks its ``DepthSource``, after every engine
step, for the divergence rows of the tokens its requests have produced. Two sources fit the seam:

- ``RescoreDepth`` (today): the transformers copy of the same weights re-reads prompt + tokens teacher-forced
  (``iter_readout``, the same lens and the same functions as every other readout), in blocks: a request's rows
  come when it reaches a decision point (Think@n's ℓ, the end of its read-out window, its end), or every
  ``block`` tokens for a request that streams them.
- the in-engine readout (issue 29): the engine's worker computes each token's rows in the forward pass that
  sampled it; its source passes the worker's per-request settings in ``request_args`` and drains the rows by
  request in ``take`` (``collective_rpc``), every step, ignoring ``urgent``. Nothing else in the session or the
  server changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from depthlens.config import ReadoutConfig
from depthlens.metrics.token_table import chunk_divergence_kinds
from depthlens.models.load import LoadedModel
from depthlens.readout.stream import TokenSequence, iter_readout, lens_for, model_chunk_sizes

Rows = list[list[list[float]]]
"""A run of tokens' rows: per token, per divergence kind (``ReadoutConfig.divergence`` first, then ``also``), L
floats."""


@dataclasses.dataclass(frozen=True)
class DepthNeed:
    """What one engine request needs read out: rows ``have``..``upto`` of its generated ``tokens``.

    ``urgent``: the session waits on them (a decision point, the end of the window, the request's end); otherwise
    they are wanted soon (a stream), and a source may wait to read a larger block.
    """

    tag: str
    prompt: Sequence[int]
    tokens: Sequence[int]
    have: int
    upto: int
    urgent: bool


class DepthSource(Protocol):
    """The seam between the engine session and whatever reads the layers out."""

    kinds: tuple[str, ...]

    def request_args(self, tag: str) -> dict[str, Any]:
        """What the engine must be told about request ``tag`` (``SamplingParams.extra_args``)."""
        ...

    def take(self, engine: Any, needs: Sequence[DepthNeed]) -> dict[str, Rows]:
        """Rows for the needs, by tag: each a contiguous run starting at that need's ``have`` (possibly empty,
        never past ``upto`` for a re-scoring source; every urgent need must be answered in full)."""
        ...


class RescoreDepth:
    """Rows re-scored by the transformers copy ``lm`` in one batched teacher-forced pass per engine step."""

    def __init__(self, lm: LoadedModel, readout: ReadoutConfig = ReadoutConfig(), block: int = 16) -> None:
        self.lm = lm
        self.readout = readout
        self.kinds = (readout.divergence, *readout.also)
        self.block = block  # tokens a streaming request waits for before a re-scoring pass
        self.block_rows = model_chunk_sizes(lm, lens_for(lm, readout), readout)[1]

    def request_args(self, tag: str) -> dict[str, Any]:
        return {}

    @torch.inference_mode()
    def take(self, engine: Any, needs: Sequence[DepthNeed]) -> dict[str, Rows]:
        due = [n for n in needs if n.upto > n.have and (n.urgent or n.upto - n.have >= self.block)]
        if not due:
            return {}
        sequences = [
            TokenSequence([*n.prompt, *n.tokens[: n.have]], list(n.tokens[n.have : n.upto])) for n in due
        ]
        out: dict[str, Rows] = {n.tag: [] for n in due}
        for chunk in iter_readout(self.lm, sequences, self.readout):
            tables = chunk_divergence_kinds(chunk, self.kinds, self.block_rows)
            columns = [tables[kind].tolist() for kind in self.kinds]
            out[due[chunk.seq_index].tag].extend(list(rows) for rows in zip(*columns, strict=True))
        return out
