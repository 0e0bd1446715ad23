"""The engine session's per-token layer divergences, read out inside the engine (``sampling.vllm.worker``).

The engine's worker reads every layer out of the forward pass that samples each token — for the requests whose
``SamplingParams.extra_args`` carry readout settings (``settings.RequestReadout``), up to each one's window — and
keeps [kinds × L] float32 rows per token until they are taken. ``EngineDepth`` writes those settings for each
request of the session (``request_args``), takes the rows the session's running requests gained in an engine
step (``take``), and drops what the worker still holds for requests that have ended (``release``: rows past a
stop, a rejected sample's rows past ℓ). There is one copy of the weights: the engine's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from depthlens.config import EngineConfig, ReadoutConfig
from depthlens.errors import DepthlensError
from depthlens.models.info import ModelInfo
from depthlens.sampling.vllm.engine import EngineError
from depthlens.sampling.vllm.generator import nonfinite_error, take_readout
from depthlens.sampling.vllm.settings import TAG_KEY, request_readout

Rows = list[list[list[float]]]
"""A run of tokens' rows: per token, per divergence kind (``ReadoutConfig.divergence`` first, then ``also``), L
floats."""


@dataclasses.dataclass
class Gained:
    """The rows a request gained since it was last taken, and with ``layer_top_k`` = K each of those tokens'
    layer predictions: per token, per layer 1..L, K token ids and their probabilities."""

    rows: Rows
    top_ids: list[list[list[int]]] = dataclasses.field(default_factory=list)
    top_probs: list[list[list[float]]] = dataclasses.field(default_factory=list)
    # the per-layer quantities asked for (``RequestReadout.layer_target`` / ``track`` / ``layer_entropy``):
    # field → per token, [L] or [L][M]
    values: dict[str, list[Any]] = dataclasses.field(default_factory=dict)


class EngineDepth:
    """The in-engine readout's settings for the session's requests, and its rows as they come."""

    def __init__(
        self,
        info: ModelInfo,
        readout: ReadoutConfig = ReadoutConfig(),
        engine: EngineConfig = EngineConfig("vllm"),
    ) -> None:
        # what the worker runs for every request (the one builder: float32_lens and the lens included)
        self.settings = request_readout(readout, engine, info)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The divergence kinds each row holds, the primary one first."""
        return self.settings.kinds

    def request_args(
        self,
        tag: str,
        window: int | None,
        layer_top_k: int | None = None,
        layer_target: bool | None = None,
        track: Sequence[int] | None = None,
        layer_entropy: bool | None = None,
    ) -> dict[str, Any]:
        """``extra_args`` that make the worker read out generated tokens 0..``window``−1 of request ``tag``;
        ``layer_top_k``: each layer's top-k tokens for this request, ``layer_target`` / ``track`` /
        ``layer_entropy`` its per-layer quantities (None: as the session's readout says; ``track`` checked
        against the vocabulary by the caller, ``config.readout.check_track``)."""
        settings = dataclasses.replace(self.settings, window=window)
        asked: dict[str, Any] = {
            "layer_top_k": layer_top_k,
            "layer_target": layer_target,
            "layer_entropy": layer_entropy,
        }
        asked["track"] = tuple(track) if track is not None else None
        changed = {name: value for name, value in asked.items() if value is not None}
        if changed:
            settings = dataclasses.replace(settings, **changed)
        return {TAG_KEY: tag, **settings.to_extra()}

    def take(
        self, engine: Any, have: Mapping[str, int]
    ) -> tuple[dict[str, Gained], dict[str, DepthlensError]]:
        """The rows each request ``tag`` gained after its first ``have[tag]``, and the requests whose rows cannot
        be used (a non-finite value, a gap): those fail alone."""
        rows: dict[str, Gained] = {}
        failed: dict[str, DepthlensError] = {}
        for tag, taken in take_readout(engine, list(have)).items():
            positions, table = taken.positions, taken.rows
            if not positions:
                continue
            start = have[tag]
            if positions != list(range(start, start + len(positions))):
                failed[tag] = EngineError(
                    f"the engine's readout of request {tag} has rows {positions[:4]} after {start} rows, not the "
                    "next ones; report it with the vLLM version"
                )
                continue
            bad = torch.isnan(table).flatten(1).any(dim=1).nonzero()
            if bad.numel():
                failed[tag] = nonfinite_error(start + int(bad[0]))
                continue
            rows[tag] = Gained(table.tolist())
            if taken.top_ids is not None and taken.top_probs is not None:
                rows[tag].top_ids, rows[tag].top_probs = taken.top_ids.tolist(), taken.top_probs.tolist()
            if taken.values:
                rows[tag].values = {name: value.tolist() for name, value in taken.values.items()}
        return rows, failed

    def release(self, engine: Any, tags: Sequence[str]) -> None:
        """Forget whatever the worker still holds for ``tags`` (requests that have ended)."""
        if tags:
            take_readout(engine, list(tags))
