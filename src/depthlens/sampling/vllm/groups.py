"""The engine session's bookkeeping: a group of engine requests (``Group``, ``GroupSpec``), each request's output
(``Sample``), and how a sample's trace is extended from what has arrived (``extend``, ``complete``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from depthlens.config import SamplingConfig
from depthlens.sampling.backend import Finish, Trace
from depthlens.sampling.live import Watch
from depthlens.sampling.vllm.engine import EngineError

_FINISH: dict[str, Finish] = {"stop": "eos", "length": "length"}


@dataclasses.dataclass
class Sample:
    """One engine request: what the engine produced (``tokens`` may run past what its trace shows)."""

    tag: str
    trace: Trace
    tokens: list[int] = dataclasses.field(default_factory=list)
    log_prob: list[float] = dataclasses.field(default_factory=list)
    # the top-k (token id, log p) of each token, when the group asks for them
    top: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    scores: dict[int, tuple[float, float, float]] = dataclasses.field(default_factory=dict)
    rows: list[list[list[float]]] = dataclasses.field(default_factory=list)  # per token, per kind, L floats
    # with layer_top_k = K: per read-out token, per layer, K token ids and their probabilities
    top_ids: list[list[list[int]]] = dataclasses.field(default_factory=list)
    top_probs: list[list[list[float]]] = dataclasses.field(default_factory=list)
    values: dict[str, list[Any]] = dataclasses.field(default_factory=dict)  # per-layer quantities, per token
    engine_finish: str | None = None  # vLLM's finish reason
    stopped: bool = False  # aborted here (a decision, a Watch, a cancel): the trace holds all it will
    aborted: bool = False  # stopped while the engine still ran it (not after it had ended by itself)
    ended: bool = False  # the trace is final

    @property
    def running(self) -> bool:
        return self.engine_finish is None and not self.stopped


@dataclasses.dataclass(frozen=True)
class PerLayer:
    """A caller's own per-layer settings for its requests (``ReadoutConfig.layer_target`` / ``track`` /
    ``layer_entropy``; None: as the session's readout says). ``track`` is checked against the vocabulary by the
    caller (``config.readout.check_track``)."""

    layer_target: bool | None = None
    track: tuple[int, ...] | None = None
    layer_entropy: bool | None = None


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """What a caller asks of one group."""

    prompt: list[int]
    seeds: list[int]
    sampling: SamplingConfig
    watch: Watch = dataclasses.field(default_factory=Watch)
    logprobs: int = 0  # top-k log-probabilities wanted per token (vLLM's ``logprobs``)
    pause_at: int | None = None  # phase one's ℓ
    layer_top_k: int | None = None  # each layer's top-k per read-out token (None: the session's setting)
    # the per-layer quantities of each read-out token (``ReadoutConfig``'s fields; None: the session's setting)
    per_layer: PerLayer | None = None


@dataclasses.dataclass(eq=False)
class Group:
    spec: GroupSpec
    samples: list[Sample]
    keep: set[int] | None = None  # the caller's phase-two decision
    cancelled: bool = False  # the caller gave up: no decision will come
    paused: bool = False
    done: bool = False
    error: BaseException | None = None

    @property
    def traces(self) -> list[Trace]:
        return [s.trace for s in self.samples]

    def limit(self) -> int | None:
        """How many tokens each trace may show now: ℓ until the decision, then all."""
        return self.spec.pause_at if self.spec.pause_at is not None and self.keep is None else None


def extend(s: Sample, limit: int | None, window: int | None, kinds: Sequence[str]) -> bool:
    """Append to ``s.trace`` every token whose fields are all in (up to ``limit``); True when it grew."""
    trace = s.trace
    cap = len(trace) if s.stopped else len(s.tokens) if limit is None else min(limit, len(s.tokens))
    before, rows_before = len(trace), len(trace.divergence)
    k = len(trace)
    while k < cap and k < len(s.log_prob) and k in s.scores:
        trace.token_ids.append(s.tokens[k])
        trace.log_prob.append(s.log_prob[k])
        entropy, certainty, confidence = s.scores[k]
        trace.entropy.append(entropy)
        trace.self_certainty.append(certainty)
        trace.confidence.append(confidence)
        k += 1
    if not s.running and k < cap:  # the engine has ended it, so every field of its tokens is in by now
        raise EngineError(f"vLLM reported no log p or scores for token {k} of request {s.tag}; report it")
    wanted = len(trace) if window is None else min(window, len(trace))
    start = len(trace.divergence)
    for row in s.rows[start:wanted]:
        trace.divergence.append(row[0])
        for kind, extra in zip(kinds[1:], row[1:], strict=True):
            trace.also.setdefault(kind, []).append(extra)
    if s.top_ids:  # taken with the rows, token for token
        trace.layer_top_ids.extend(s.top_ids[start:wanted])
        trace.layer_top_probs.extend(s.top_probs[start:wanted])
    for name, values in s.values.items():  # likewise
        trace.layer_values.setdefault(name, []).extend(values[start:wanted])
    if s.engine_finish is not None and not s.stopped and len(trace) == len(s.tokens):
        trace.finish = _FINISH.get(s.engine_finish, "eos")
    return len(trace) > before or len(trace.divergence) > rows_before


def rows_done(s: Sample, window: int | None) -> bool:
    return len(s.trace.divergence) >= (len(s.trace) if window is None else min(window, len(s.trace)))


def complete(s: Sample, window: int | None) -> bool:
    """Nothing more will come for this trace: it was stopped, or the engine ended it and all of it is shown (a
    trace held at ℓ while its group waits for the decision is not shown whole)."""
    if not rows_done(s, window):
        return False
    return s.stopped or (s.engine_finish is not None and len(s.trace) == len(s.tokens))
