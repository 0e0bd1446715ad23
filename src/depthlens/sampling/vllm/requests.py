"""``SessionBackend``: the ``GenerationBackend`` one caller uses on a shared ``EngineSession``.

Each caller (one request of a server) gets its own: ``start`` submits the n responses of a prompt as a group and
blocks until they reach ℓ (``stop_after``) or end; ``resume`` hands the session the decision and blocks until the
kept ones end. Everything above this room — ``studies.thinkn.think_at_n_live``, ``studies.online.generate_batch``
with ``voting.online.run_policy`` — runs on it unchanged, while the engine batches every caller's requests.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from depthlens.config import SamplingConfig
from depthlens.errors import InputError
from depthlens.sampling.backend import Paused, Trace, kept_positions
from depthlens.sampling.live import Watch
from depthlens.sampling.vllm.groups import Group, GroupSpec, PerLayer, Sample
from depthlens.sampling.vllm.session import EngineSession


class SessionBackend:
    """A ``GenerationBackend`` over a shared engine session, for one caller.

    ``watch``: the per-step callbacks of every group this backend starts; ``logprobs``: top-k log-probabilities
    kept per token (``top_logprobs``); ``cancel``: set by the caller's owner (a client that left) to abort
    whatever this backend runs; ``layer_top_k``: each layer's top-k tokens per read-out token for this caller's
    requests (None: as the session's readout says); ``per_layer``: its per-layer quantities likewise
    (``groups.PerLayer``: target trajectory, tracked ids, entropy).
    """

    def __init__(
        self,
        session: EngineSession,
        sampling: SamplingConfig,
        watch: Watch = Watch(),
        logprobs: int = 0,
        cancel: threading.Event | None = None,
        layer_top_k: int | None = None,
        per_layer: PerLayer | None = None,
    ) -> None:
        self.session = session
        self.layer_top_k = layer_top_k
        self.per_layer = per_layer
        self.sampling = sampling
        self.watch = watch
        self.logprobs = logprobs
        self.cancel = cancel
        self.n_layers = session.n_layers
        self.groups: list[Group] = []

    def start(self, prompt_ids: Sequence[int], seeds: Sequence[int], stop_after: int | None = None) -> Paused:
        if not seeds:
            raise InputError("no seeds given: sample at least one response")
        budget = self.sampling.max_new_tokens
        pause = stop_after if stop_after is not None and stop_after < budget else None
        spec = GroupSpec(
            list(prompt_ids),
            [int(s) for s in seeds],
            self.sampling,
            self.watch,
            self.logprobs,
            pause,
            self.layer_top_k,
            self.per_layer,
        )
        group = self.session.submit(spec)
        self.groups.append(group)
        self.session.wait(group, lambda: group.paused or group.done, self.cancel)
        return Paused(group.traces, group)

    def resume(self, paused: Paused, keep: Sequence[int]) -> list[Trace]:
        group: Group = paused.state
        keep_set = kept_positions(paused, keep)
        if not group.done:
            self.session.decide(group, keep_set)
            self.session.wait(group, lambda: group.done, self.cancel)
        return [paused.traces[i] for i in keep]

    def sample(self, prompt_ids: Sequence[int], seeds: Sequence[int]) -> list[Trace]:
        """Complete responses in one phase."""
        return self.start(prompt_ids, seeds).traces

    def generated(self) -> int:
        """Every token the engine generated for this backend's groups — the cost, past-ℓ tokens included."""
        return sum(len(s.tokens) for g in self.groups for s in g.samples)

    def engine_tokens(self, trace: Trace) -> int:
        """Tokens the engine generated for ``trace``'s request (≥ its length when it was stopped late)."""
        return next(len(s.tokens) for g in self.groups for s in g.samples if s.trace is trace)

    def top_logprobs(self, trace: Trace) -> list[list[tuple[int, float]]]:
        """The top-k (token id, log p) of each of ``trace``'s tokens (empty without ``logprobs``)."""
        return self._sample(trace).top[: len(trace)]

    def aborted(self, trace: Trace) -> bool:
        """Whether the engine aborted ``trace``'s request while it ran (not one that had ended by itself)."""
        return self._sample(trace).aborted

    def _sample(self, trace: Trace) -> Sample:
        return next(s for g in self.groups for s in g.samples if s.trace is trace)
