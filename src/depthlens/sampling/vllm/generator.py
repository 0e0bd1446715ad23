"""Sample on a vLLM engine that reads the layers out itself: the same ``Trace`` fields as ``HFGenerator``, one copy
of the weights.

Sampling: one vLLM request per response (``n=1``, the response's own ``seed``), prompts as token ids, prefix
caching on so the n requests share the prompt's KV blocks. The engine is driven step by step
(``LLMEngine.add_request`` / ``step`` / ``abort_request``), which gives Think@n its two phases without
re-submitting anything: phase one steps until every request has ℓ tokens (or has ended), the rejected requests
are aborted there, and the kept ones go on stepping — their random streams are never restarted, so a kept
response is token for token the response a one-phase run samples. Tokens a request samples past ℓ while the
others catch up are held back and appear when it is resumed.

Per-token fields: log p of each sampled token is vLLM's raw log-probability (``logprobs=0``); entropy,
self-certainty and confidence come from the logits processor ``sampling.vllm_scores``; the divergences of the
first ``readout_tokens`` tokens come from the engine's worker (``sampling.vllm.worker``), which reads the
residual stream of every layer out of the forward pass that sampled the token. No transformers model is loaded:
only the tokenizer and the config (``models.info``).

Public surface (for callers beyond the studies, e.g. a server):

- ``EngineGenerator(model, sampling, readout, engine, on_token, llm_engine, job, progress)``: ``model`` a
  ``models.info.ModelInfo`` (``load_info(name)``; a loaded model works too, only its tokenizer and config are
  used); ``llm_engine`` an engine from ``sampling.vllm.engine.start_engine(info, config, job, progress)`` to
  share, else one is started (its KV cache sized for ``job``, a ``JobSize``). Attributes: ``info``, ``n_layers``,
  ``engine`` (vLLM's ``LLMEngine``), ``capture`` (``"aux"`` | ``"hooks"``; None on an engine without the readout,
  accepted only when ``sampling.readout_tokens == 0``).
- ``sample(prompt_ids, seeds) -> list[Trace]``; ``start(prompt_ids, seeds, stop_after=None) -> Paused`` and
  ``resume(paused, keep) -> list[Trace]`` (Think@n's two phases); ``sample_stopping(prompt_ids, seeds, stop)``
  (a per-token stop rule, ended in the engine). A ``Trace`` (``sampling.backend``) holds ``token_ids``,
  ``finish``, the per-token ``log_prob`` / ``entropy`` / ``self_certainty`` / ``confidence``, ``divergence``
  (one row of ``n_layers`` floats of ``readout.divergence`` per token of the first ``readout_tokens``) and
  ``also`` (kind → rows), and with ``readout.layer_top_k`` = K each read-out token's ``layer_top_ids`` /
  ``layer_top_probs`` ([L][K]: every layer's K most probable tokens, taken in the worker from the same logits);
  with ``readout.layer_target`` / ``track`` / ``layer_entropy``, ``layer_values`` (field → per read-out token
  [L] or [L][M]: the sampled token's own trajectory, read in the worker right after it was sampled).
- The generator steps the engine in the calling thread until its own requests are done: one call at a time per
  engine (several generators may share an engine one after another; request ids are unique in the process).
- Driving the engine yourself: a request is read out when its ``SamplingParams.extra_args`` carry
  ``settings.TAG_KEY: tag`` and ``RequestReadout(...).to_extra()``; ``take_readout(engine, tags)`` then returns
  tag → ``settings.Taken`` (positions, rows [n, kinds, n_layers], prefill baselines, each layer's top-k) and the
  worker forgets them — take the rows of every request you tagged, finished or aborted, or they stay in the
  worker's memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.errors import DepthlensError, InputError, NonFiniteError, named
from depthlens.models.info import ModelInfo, info_of
from depthlens.sampling.backend import Finish, Paused, Trace, kept_positions
from depthlens.sampling.vllm.engine import (
    EngineError,
    JobSize,
    readout_capture,
    sampling_params,
    start_engine,
)
from depthlens.sampling.vllm.settings import TAG_KEY, Taken, request_readout

_FINISH: dict[str, Finish] = {"stop": "eos", "length": "length"}
StopRule = Callable[[], Callable[[float], bool]]  # makes one response's rule: token confidence → end here?
# Request ids unique in this process: generators may share one engine, and its results are kept by request id.
_REQUEST_IDS = itertools.count()


def take_readout(engine: Any, tags: list[str]) -> dict[str, Taken]:
    """What the engine's workers read out for ``tags`` (forgotten there), by tag."""
    for result in engine.collective_rpc("depthlens_take", args=(tags,)):
        if result is not None:
            return result
    raise EngineError(
        "the vLLM engine's workers hold no depthlens readout; start it with sampling.vllm.engine"
    )


def nonfinite_error(k: int) -> NonFiniteError:
    return NonFiniteError(
        f"non-finite hidden state or logit at completion token {k}; the model overflowed in this dtype — try "
        f"{named('dtype')} float32"
    )


@dataclasses.dataclass
class _Batch:
    prompt: list[int]
    request_ids: list[str]
    tokens: list[list[int]]  # every token each request has sampled so far (may run past the pause)
    log_prob: list[list[float]]  # vLLM's raw log p of each of those tokens
    finish: list[str | None]  # vLLM's finish reason once a request has ended
    aborted: set[int] = dataclasses.field(default_factory=set)
    scores: dict[str, dict[int, tuple[float, float, float]]] = dataclasses.field(default_factory=dict)
    rows: dict[str, dict[int, torch.Tensor]] = dataclasses.field(default_factory=dict)
    # request → position → each layer's top-k (ids [L, K], probabilities [L, K]), with layer_top_k
    top: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = dataclasses.field(default_factory=dict)
    # request → position → each per-layer quantity's row ([L] or [L, M]), with the per-layer settings
    values: dict[str, dict[int, dict[str, torch.Tensor]]] = dataclasses.field(default_factory=dict)
    stopped: dict[int, int] = dataclasses.field(
        default_factory=dict
    )  # row → token count a stop rule ended it at
    rules: list[Callable[[float], bool]] = dataclasses.field(default_factory=list)  # row → its stop rule
    fed: dict[int, int] = dataclasses.field(default_factory=dict)  # row → tokens its stop rule has seen


class EngineGenerator:
    """``GenerationBackend`` on a vLLM engine that reads every layer out of its own forward pass."""

    def __init__(
        self,
        model: ModelInfo | Any,
        sampling: SamplingConfig = SamplingConfig(),
        readout: ReadoutConfig = ReadoutConfig(),
        engine: EngineConfig = EngineConfig(backend="vllm"),
        on_token: Callable[[int], None] = lambda n: None,
        llm_engine: Any | None = None,
        job: JobSize | None = None,
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        """``model``: a ``ModelInfo`` (or a loaded model, of which only the tokenizer and config are used);
        ``llm_engine``: an engine already started for it (``start_engine``) to share; else one is started, its KV
        cache sized for ``job``."""
        self.info = info_of(model)
        self.sampling = sampling
        self.readout = readout
        self.config = engine
        self.n_layers = self.info.n_layers
        self.end_ids = set(self.info.end_ids)
        self.on_token = on_token
        self.kinds = (readout.divergence, *readout.also)
        self.request_readout = request_readout(readout, engine, self.info, model, sampling.readout_tokens)
        if job is None:
            job = JobSize(8, sampling.max_new_tokens + 1024)  # a prompt budget where the job does not say
        self.engine = llm_engine if llm_engine is not None else start_engine(self.info, engine, job, progress)
        self.capture = readout_capture(self.engine)
        if self.capture is None and sampling.readout_tokens != 0:  # no rows asked for: no capture needed
            raise EngineError(
                "this vLLM engine was started without depthlens's in-engine readout; start it with "
                "depthlens.sampling.vllm.engine.start_engine"
            )

    def _params(self, seed: int, request_id: str) -> Any:
        readout = {
            TAG_KEY: request_id,
            **self.request_readout.to_extra(),
        }  # the worker's readout of this request
        return sampling_params(self.sampling, seed, request_id, self.end_ids, readout)

    def _check(self, prompt: list[int]) -> None:
        budget = self.sampling.max_new_tokens
        self.info.validate(prompt, budget, "prompt + max_new_tokens")
        limit = self.engine.model_config.max_model_len
        if len(prompt) + budget > limit:
            raise InputError(
                f"prompt + max_new_tokens: {len(prompt) + budget} tokens exceed the engine's {named('max_model_len')} "
                f"{limit}; raise it or lower {named('max_new_tokens')}"
            )

    def start(
        self,
        prompt_ids: Sequence[int],
        seeds: Sequence[int],
        stop_after: int | None = None,
        stop: StopRule | None = None,
    ) -> Paused:
        """``GenerationBackend.start``; ``stop``: a per-token stop rule (``sample_stopping``)."""
        from vllm.inputs import TokensPrompt

        if not seeds:
            raise InputError("no seeds given: sample at least one response")
        prompt = list(prompt_ids)
        self._check(prompt)
        n = len(seeds)
        batch = _Batch(prompt, [], [[] for _ in seeds], [[] for _ in seeds], [None] * n)
        batch.rules = [stop() for _ in seeds] if stop is not None else []
        for seed in seeds:
            request_id = f"depthlens-{next(_REQUEST_IDS)}"
            self.engine.add_request(
                request_id, TokensPrompt(prompt_token_ids=prompt), self._params(int(seed), request_id)
            )
            batch.request_ids.append(request_id)
        budget = self.sampling.max_new_tokens
        until = budget if stop_after is None else min(stop_after, budget)
        self._step_until(batch, lambda i: len(batch.tokens[i]) >= until)
        traces = [Trace(seed=int(s)) for s in seeds]
        for i, trace in enumerate(traces):
            self._fill(batch, i, trace, batch.stopped.get(i, until))
        return Paused(traces, batch)

    def resume(self, paused: Paused, keep: Sequence[int]) -> list[Trace]:
        batch: _Batch = paused.state
        keep_set = kept_positions(paused, keep)
        self._abort(batch, [i for i in range(len(batch.request_ids)) if i not in keep_set])
        self._step_until(batch, lambda i: i not in keep_set)
        kept = [paused.traces[i] for i in keep]
        for i, trace in zip(keep, kept, strict=True):
            self._fill(batch, i, trace, self.sampling.max_new_tokens)
        return kept

    def sample(self, prompt_ids: Sequence[int], seeds: Sequence[int]) -> list[Trace]:
        """Complete responses in one phase."""
        return self.start(prompt_ids, seeds).traces

    def sample_stopping(
        self, prompt_ids: Sequence[int], seeds: Sequence[int], stop: StopRule
    ) -> tuple[list[Trace], list[int | None]]:
        """Complete responses in one phase, each ended in the engine where its stop rule first holds.

        ``stop()`` makes one rule per response; the rule is fed the response's token confidences one token at a
        time and says whether the response ends after that token. Such a response is aborted at once, so it
        holds exactly the tokens a run cut at that count holds, and the tokens past it are never generated.
        Returns the traces and, per response, the token count where its rule ended it (None: it ran to its end).
        """
        paused = self.start(prompt_ids, seeds, stop=stop)
        batch: _Batch = paused.state
        return paused.traces, [batch.stopped.get(i) for i in range(len(seeds))]

    def _abort(self, batch: _Batch, rows: Sequence[int]) -> None:
        rows = [i for i in rows if batch.finish[i] is None and i not in batch.aborted]
        if rows:
            self.engine.abort_request([batch.request_ids[i] for i in rows])
            batch.aborted.update(rows)

    def _step_until(self, batch: _Batch, done: Callable[[int], bool]) -> None:
        """Step the engine until every live request of ``batch`` has ended or satisfies ``done``; a request's
        stop rule (``batch.rules``) ends it in the engine after the first token where it holds."""
        row = {request_id: i for i, request_id in enumerate(batch.request_ids)}

        def waiting() -> bool:
            return any(
                batch.finish[i] is None and i not in batch.aborted and not done(i)
                for i in range(len(batch.request_ids))
            )

        try:
            while waiting():
                if not self.engine.has_unfinished_requests():
                    raise EngineError(
                        f"vLLM ended requests without reporting them; rerun with {named('resume')}"
                    )
                for output in self._step():
                    i = row.get(output.request_id)
                    if i is not None:
                        self._take_output(batch, i, output)
                if batch.rules:
                    self._apply_stops(batch)
            self._collect(batch)
        except BaseException:
            self._abort(batch, range(len(batch.request_ids)))  # leave the engine clean for the next batch
            with contextlib.suppress(Exception):  # the error being raised matters more
                self._collect(batch)  # and what the engine recorded for the batch: nothing left behind
            raise

    def _step(self) -> list[Any]:
        """One engine step; an engine that fails is named, with how to go on (committed responses are kept)."""
        try:
            return self.engine.step()
        except DepthlensError:
            raise
        except Exception as exc:  # vLLM raises what its worker raised, or its own EngineDeadError
            said = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise EngineError(
                f"the vLLM engine failed ({type(exc).__name__}: {said}); rerun with {named('resume')}"
            ) from exc

    def _apply_stops(self, batch: _Batch) -> None:
        """Feed each live request's new token confidences to its stop rule; abort the requests it ends."""
        from depthlens.sampling.vllm import scores as vllm_scores

        for request_id, scores in vllm_scores.drain(self.engine, batch.request_ids).items():
            batch.scores.setdefault(request_id, {}).update(scores)
        ended = []
        for i, request_id in enumerate(batch.request_ids):
            if i in batch.stopped or i in batch.aborted:
                continue
            scores = batch.scores.get(request_id, {})
            fed = batch.fed.get(i, 0)
            for k in range(fed, len(batch.tokens[i])):
                batch.fed[i] = k + 1
                if batch.rules[i](scores[k][2]):  # (entropy, self-certainty, confidence) of token k
                    batch.stopped[i] = k + 1
                    ended.append(i)
                    break
        self._abort(batch, ended)

    def _take_output(self, batch: _Batch, i: int, output: Any) -> None:
        completion = output.outputs[0]
        new = list(completion.token_ids)  # DELTA: this step's tokens only
        batch.tokens[i].extend(new)
        steps = completion.logprobs or []
        batch.log_prob[i].extend(step[t].logprob for step, t in zip(steps, new, strict=True))
        self.on_token(len(new))
        if output.finished:
            batch.finish[i] = completion.finish_reason or "stop"

    def _collect(self, batch: _Batch) -> None:
        """Move what the engine recorded for ``batch``'s requests into it (a request's positions only grow)."""
        from depthlens.sampling.vllm import scores as vllm_scores

        for request_id, scores in vllm_scores.drain(self.engine, batch.request_ids).items():
            batch.scores.setdefault(request_id, {}).update(scores)
        if self.capture is None:
            return
        for request_id, taken in take_readout(self.engine, batch.request_ids).items():
            batch.rows.setdefault(request_id, {}).update(zip(taken.positions, taken.rows, strict=True))
            if taken.top_ids is not None and taken.top_probs is not None:
                top = zip(taken.top_ids, taken.top_probs, strict=True)
                batch.top.setdefault(request_id, {}).update(zip(taken.positions, top, strict=True))
            if taken.values:
                kept = batch.values.setdefault(request_id, {})
                for j, position in enumerate(taken.positions):
                    kept[position] = {name: rows[j] for name, rows in taken.values.items()}

    def _fill(self, batch: _Batch, i: int, trace: Trace, stop: int) -> None:
        request_id = batch.request_ids[i]
        tokens = batch.tokens[i][:stop]
        trace.token_ids = tokens
        ended = batch.finish[i] is not None and len(batch.tokens[i]) <= stop
        trace.finish = _FINISH.get(batch.finish[i] or "", "eos") if ended else "paused"
        if i in batch.stopped and not ended:
            trace.finish = "length"  # ended by the caller's stop rule, which records why
        scores = batch.scores.get(request_id, {})
        window = (
            len(tokens)
            if self.sampling.readout_tokens is None
            else min(len(tokens), self.sampling.readout_tokens)
        )
        rows, top = batch.rows.get(request_id, {}), batch.top.get(request_id, {})
        values = batch.values.get(request_id, {})
        layer_top, per_layer = self.request_readout.layer_top_k, self.request_readout.per_layer
        missing = [k for k in range(len(tokens)) if k not in scores] + [
            k
            for k in range(window)
            if k not in rows or (layer_top and k not in top) or (per_layer and k not in values)
        ]
        if missing or len(batch.log_prob[i]) < len(tokens):
            raise EngineError(
                f"vLLM reported no scores or readout for token(s) {sorted(set(missing))[:5]} of request "
                f"{request_id}; rerun with {named('resume')}, or report it with the vLLM version"
            )
        trace.log_prob = batch.log_prob[i][: len(tokens)]
        columns = list(zip(*(scores[k] for k in range(len(tokens))), strict=True)) or [(), (), ()]
        trace.entropy, trace.self_certainty, trace.confidence = (list(c) for c in columns)
        table = (
            torch.stack([rows[k] for k in range(window)]) if window else torch.zeros(0, len(self.kinds), 1)
        )
        bad = torch.isnan(table).flatten(1).any(dim=1).nonzero()
        if bad.numel():
            raise nonfinite_error(int(bad[0]))
        trace.divergence = table[:, 0].tolist()
        trace.also = {kind: table[:, j].tolist() for j, kind in enumerate(self.kinds) if j}
        if layer_top:
            trace.layer_top_ids = [top[k][0].tolist() for k in range(window)]
            trace.layer_top_probs = [top[k][1].tolist() for k in range(window)]
        if per_layer and window:
            trace.layer_values = {
                name: [values[k][name].tolist() for k in range(window)] for name in values[0]
            }
