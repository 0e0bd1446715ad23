"""The engine behind the server: one per process, shared by every request.

- ``VLLMEngine``: one vLLM engine stepped by one thread for every request (``sampling.vllm.session``): continuous
  batching — the samples of every running request share each engine step, a request that arrives mid-way joins
  the next one, and a stopped or disconnected sample is aborted in the engine. Its per-token divergences are read
  out inside the engine, from the forward pass that sampled each token (``sampling.vllm.depth.EngineDepth``): no
  transformers copy of the weights is loaded.
- ``HFEngine``: the transformers sampler. Its step loop batches the n samples of *one* prompt (one prefill, one
  KV cache repeated n times), so the server runs one request at a time on it and queues the rest; it streams,
  stops at stop strings, aborts a disconnected request and stops Think@n's rejected samples at ℓ, but it cannot
  batch different requests (their prompts and lengths differ and ``HFGenerator`` has no per-row positions).

Each request gets a fresh ``ServeBackend`` (a ``GenerationBackend`` with the request's sampling settings, its
``Watch`` and its cancel flag) from ``Engine.backend``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig, ServeConfig
from depthlens.models.info import ModelInfo
from depthlens.models.load import LoadedModel
from depthlens.readout.stream import lens_for
from depthlens.sampling.backend import Paused, Trace
from depthlens.sampling.hf import HFGenerator
from depthlens.sampling.live import GenerationCancelled, Watch
from depthlens.studies.layer_settings import readout_vocab
from depthlens.studies.runs import PER_TOKEN_READOUT


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (a dtype as a response names it)."""
    return str(dtype).removeprefix("torch.")


def read_with(engine: Engine) -> dict[str, str]:
    """What every depth ``engine`` serves was read with: its forward pass's dtype, the lens (``logit`` or
    ``tuned:PATH``, ``serve --lens``) and the lens's dtype."""
    return {"dtype": engine.dtype, "lens": engine.lens, "lens_dtype": engine.lens_dtype}


def lens_dtype(float32_lens: bool, dtype: str) -> str:
    """The dtype the lens (final norm + unembedding) runs in: float32 where the readout asks it of a lower-precision
    engine, else the engine's own."""
    return "float32" if float32_lens and dtype != "float32" else dtype


def lens_health(readout: ReadoutConfig) -> dict[str, str]:
    """``/health``'s account of the lens: its spec (a fitted lens's form stated: ``tuned``, ``tuned-package``,
    ``jacobian``), and for a fitted lens the digest of the fit it loaded."""
    digest = {"lens_digest": readout.lens_digest} if readout.lens_digest is not None else {}
    return {"lens": str(readout.lens), **digest}


class ServeBackend(Protocol):
    """A ``GenerationBackend`` for one request, with what the server reports about it."""

    n_layers: int
    watch: Watch

    def start(
        self, prompt_ids: Sequence[int], seeds: Sequence[int], stop_after: int | None = None
    ) -> Paused: ...

    def resume(self, paused: Paused, keep: Sequence[int]) -> list[Trace]: ...

    def generated(self) -> int:
        """Every token the engine generated for this request so far."""
        ...

    def engine_tokens(self, trace: Trace) -> int:
        """Tokens the engine generated for ``trace``'s sample (≥ its length when it was stopped late)."""
        ...

    def top_logprobs(self, trace: Trace) -> list[list[tuple[int, float]]]: ...

    def aborted(self, trace: Trace) -> bool:
        """Whether the engine stopped ``trace``'s sample before its own end (EOS or max tokens): rejected at ℓ,
        stopped by a policy or at a stop string. A sample that ended by itself was never stopped."""
        ...


class Engine(Protocol):
    name: str  # "vllm" or "hf"
    n_layers: int
    dtype: str  # the forward pass's dtype: the one every depth it serves was read in
    lens: str  # the lens every depth it serves was read with: logit or tuned:PATH
    lens_dtype: (
        str  # the lens's (final norm + unembedding) dtype: float32 with --float32-lens, else ``dtype``
    )
    max_running: int  # requests it runs at once
    top_logprobs: bool  # whether it returns the top-k log-probabilities of each token
    vocab: int  # the rows its lens reads: a request's tracked ids are below it

    @property
    def context(self) -> int | None:
        """Prompt + reply tokens the engine accepts (None: no limit known); read-only, so an engine's own int
        serves."""
        ...

    def backend(
        self,
        sampling: SamplingConfig,
        logprobs: int,
        cancel: threading.Event | None,
        asked: ReadoutConfig = ReadoutConfig(),
    ) -> ServeBackend: ...

    def health(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


# Fault injection for the tests: each generation step of a served request takes this many seconds more (a loaded
# machine's step), so a shutdown can be shown not to wait for a step to end.
STEP_DELAY = "DEPTHLENS_FAULT_STEP_DELAY"
# ... and this many seconds of work inside torch (a long step as the process sees it: in torch's C++ code, the GIL
# released), so a shutdown can be shown to let no thread sit in torch when the interpreter exits.
STEP_TORCH = "DEPTHLENS_FAULT_STEP_TORCH"


def _torch_work(seconds: float) -> None:
    import torch

    block, end = torch.ones(256, 256), time.monotonic() + seconds
    while time.monotonic() < end:
        block = torch.tanh(block @ block / 256)


class HFBackend:
    """``HFGenerator`` for one request: counts the tokens it generates, raises ``GenerationCancelled`` at the next
    step once ``cancel`` is set."""

    def __init__(
        self, gen: HFGenerator, cancel: threading.Event | None, stats: dict[str, int] | None = None
    ) -> None:
        """``stats``: the engine's counters (``aborted`` grows by each sample this backend stops)."""
        self.gen = gen
        self.cancel = cancel
        self.n_layers = gen.n_layers
        self.count = 0
        gen.on_token = self._count
        self.watch = Watch()
        self.stats = stats if stats is not None else {"aborted": 0}
        self._counted: set[int] = set()  # id() of the traces already counted in ``stats``

    def _count_aborted(self, traces: Sequence[Trace], final: bool) -> None:
        """Count the samples stopped before their end; a paused one only once it is ``final`` (not resumed)."""
        for trace in traces:
            if id(trace) not in self._counted and (
                trace.finish == "stopped" or (final and trace.finish == "paused")
            ):
                self._counted.add(id(trace))
                self.stats["aborted"] += 1

    def _count(self, n: int) -> None:
        self.count += n

    def _guarded(self) -> Watch:
        watch, cancel = self.watch, self.cancel

        delay = float(os.environ.get(STEP_DELAY, "0") or 0)
        busy = float(os.environ.get(STEP_TORCH, "0") or 0)

        def on_step(traces: Sequence[Trace]) -> None:
            if cancel is not None and cancel.is_set():
                raise GenerationCancelled()
            if busy > 0:
                _torch_work(busy)
            if (
                delay > 0
            ):  # a slow step (tests/test_serve_shutdown.py): a cancel set meanwhile waits for the next
                time.sleep(delay)
            watch.on_step(traces)

        return Watch(on_step, watch.ends)

    def start(self, prompt_ids: Sequence[int], seeds: Sequence[int], stop_after: int | None = None) -> Paused:
        if self.cancel is not None and self.cancel.is_set():
            raise GenerationCancelled()
        self.gen.watch = self._guarded()
        paused = self.gen.start(prompt_ids, seeds, stop_after)
        self._count_aborted(paused.traces, final=False)
        return paused

    def resume(self, paused: Paused, keep: Sequence[int]) -> list[Trace]:
        self.gen.watch = self._guarded()
        kept = self.gen.resume(paused, keep)
        self._count_aborted(paused.traces, final=True)
        return kept

    def generated(self) -> int:
        return self.count

    def engine_tokens(self, trace: Trace) -> int:
        return len(trace)  # a row is dropped the step it stops: it generates nothing past its trace

    def top_logprobs(self, trace: Trace) -> list[list[tuple[int, float]]]:
        return []

    def aborted(self, trace: Trace) -> bool:
        """Its row was dropped before EOS or max tokens. Asked once the request's samples are final, so a paused
        trace never resumed (a policy that kept none of its batch) is counted in ``stats`` here."""
        self._count_aborted([trace], final=True)
        return trace.finish in ("paused", "stopped")


class HFEngine:
    """The transformers sampler, one request at a time (see the module docstring)."""

    name = "hf"
    max_running = 1
    top_logprobs = False

    def __init__(self, lm: LoadedModel, readout: ReadoutConfig = ReadoutConfig()) -> None:
        self.lm = lm
        self.readout = readout  # resolved: /health names the fit that reads every served depth
        self.lens = str(readout.lens)
        lens_for(lm, self.readout)  # a lens fitted to another model is refused now, not at the first request
        self.n_layers = lm.n_layers
        self.vocab = readout_vocab(lm, readout)
        self.context = lm.max_positions
        self.lock = threading.Lock()  # one request on the model at a time, whatever the thread pool does
        self.dtype = self.lens_dtype = dtype_name(next(lm.model.parameters()).dtype)
        self.stats = {"aborted": 0}  # samples stopped before their end (touched under ``lock``)

    def backend(
        self,
        sampling: SamplingConfig,
        logprobs: int,
        cancel: threading.Event | None,
        asked: ReadoutConfig = ReadoutConfig(),
    ) -> ServeBackend:
        """``asked``: what the request's read-out tokens keep of every layer (``studies.runs.PER_TOKEN_READOUT``:
        its top-k, the target trajectory, tracked ids, the entropy), taken in the pass that samples them."""
        readout = self.readout  # the server's; a request sets its own per-token fields
        fields = {name: getattr(asked, name) for name in PER_TOKEN_READOUT}
        if any(getattr(readout, name) != value for name, value in fields.items()):
            readout = dataclasses.replace(readout, **fields)
        gen = HFGenerator(self.lm, sampling, readout)
        return _Locked(HFBackend(gen, cancel, self.stats), self.lock)

    def health(self) -> dict[str, Any]:
        return {"backend": self.name, "engine": "running", **lens_health(self.readout), **self.stats}

    def close(self) -> None:
        return None


class _Locked:
    """A backend whose engine calls hold ``lock`` (the transformers model is not shared between threads)."""

    def __init__(self, inner: HFBackend, lock: threading.Lock) -> None:
        self.inner = inner
        self.lock = lock
        self.n_layers = inner.n_layers

    @property
    def watch(self) -> Watch:
        return self.inner.watch

    @watch.setter
    def watch(self, value: Watch) -> None:
        self.inner.watch = value

    def start(self, prompt_ids: Sequence[int], seeds: Sequence[int], stop_after: int | None = None) -> Paused:
        with self.lock:
            return self.inner.start(prompt_ids, seeds, stop_after)

    def resume(self, paused: Paused, keep: Sequence[int]) -> list[Trace]:
        with self.lock:
            return self.inner.resume(paused, keep)

    def generated(self) -> int:
        return self.inner.generated()

    def engine_tokens(self, trace: Trace) -> int:
        return self.inner.engine_tokens(trace)

    def top_logprobs(self, trace: Trace) -> list[list[tuple[int, float]]]:
        return []

    def aborted(self, trace: Trace) -> bool:
        return self.inner.aborted(trace)


class VLLMEngine:
    """One vLLM engine for every request (see the module docstring)."""

    name = "vllm"
    top_logprobs = True

    def __init__(
        self,
        info: ModelInfo,
        engine: EngineConfig,
        readout: ReadoutConfig = ReadoutConfig(),
        max_running: int = ServeConfig.max_running,
        llm_engine: Any | None = None,
    ) -> None:
        """``info``: the model's tokenizer and config (no weights: the engine holds the only copy and reads the
        layers out itself); ``llm_engine``: an engine already started for it (``sampling.vllm.engine.start_engine``)."""
        from depthlens.sampling.vllm.depth import EngineDepth
        from depthlens.sampling.vllm.engine import readout_capture, start_engine
        from depthlens.sampling.vllm.session import EngineSession

        started = llm_engine if llm_engine is not None else start_engine(info, engine)
        depth = EngineDepth(info, readout, engine)
        self.session = EngineSession(started, depth, sorted(info.end_ids), info.n_layers)
        self.capture = readout_capture(started)  # how the worker takes the residual stream: aux | hooks
        self.readout = readout  # resolved: /health names the fit the worker reads every served depth with
        self.lens = str(readout.lens)
        self.n_layers = info.n_layers
        self.vocab = readout_vocab(info, readout)
        self.context = self.session.max_model_len
        self.max_running = max_running
        self.dtype = dtype_name(started.model_config.dtype)
        # what the worker runs, read from the settings every request carries (not from the options)
        self.lens_dtype = lens_dtype(depth.settings.float32_lens, self.dtype)

    def backend(
        self,
        sampling: SamplingConfig,
        logprobs: int,
        cancel: threading.Event | None,
        asked: ReadoutConfig = ReadoutConfig(),
    ) -> ServeBackend:
        """``asked``: what the request's read-out tokens keep of every layer — each layer's top-k
        (``depthlens.layer_top_k``, 0: none), the target trajectory, tracked ids, the entropy —; the worker takes
        them in the pass that reads its depths (tracked ids checked against ``vocab`` by the request's job)."""
        from depthlens.sampling.vllm.groups import PerLayer
        from depthlens.sampling.vllm.requests import SessionBackend

        per_layer = PerLayer(asked.layer_target, asked.track, asked.layer_entropy)
        return SessionBackend(self.session, sampling, Watch(), logprobs, cancel, asked.layer_top_k, per_layer)

    def health(self) -> dict[str, Any]:
        failed = self.session.failed
        return {
            "backend": self.name,
            "engine": "failed" if failed else "running",
            "capture": self.capture,
            **lens_health(self.readout),
            "engine_requests": self.session.running(),
            **self.session.stats,
            **({"error": str(failed)} if failed else {}),
        }

    def close(self) -> None:
        self.session.close()
