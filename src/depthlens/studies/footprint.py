"""What a run holds in memory at once, from its settings and the model's shape, against what the machine lends
(``models.machine``): a setting that makes it too large to fit is refused before anything is sampled, scored or
voted, naming the setting and the largest value that fits.

Each count is the run's own working set at the worst its settings allow — every response running to
``max_new_tokens``, as a small model looping to the cap does — and never more: the model's weights and the
readout's chunks (bounded by ``memory_mb``) are left out, so a run refused here could not have finished, and one
let through may still want more than its share of a busy machine.

- **A pool being sampled** (``generate``, ``thinkn``, online Think@n, a served request on the transformers
  engine): the responses sampled together (``batch_size``; online: the warm-up or a batch), each with its KV cache
  to the longest prompt + ``max_new_tokens`` (on the transformers sampler; a vLLM engine sizes its own cache), its
  logits, and its per-layer readout — ``readout_tokens`` × L × (the divergences + ``layer_top_k`` ids and
  probabilities).
- **A batch being scored**: ``batch_size`` records, each at least one position's logits, layer states and KV.
- **A vote's trials**: every method's outcome per trial and question (``trials`` × questions).
- **The correlation study**: its seeds' bins (``seeds`` × questions × ``bins``) and a question's permutations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from depthlens.config import (
    CorrelationConfig,
    GenerateRun,
    OnlineRun,
    ReadoutConfig,
    SamplingConfig,
    VotingConfig,
)
from depthlens.evals.tasks import Question
from depthlens.models.info import kv_bytes_per_token, text_config
from depthlens.models.machine import Need, check_memory

FLOAT32, FLOAT64 = 4, 8
LAYER_TOP_BYTES = 12  # a kept top-k entry: its id and probability, as the sampler holds them


def kv_per_token(model: Any) -> int:
    """KV cache bytes one token takes in ``model`` (a ``LoadedModel``, or a ``ModelInfo`` — no weights — whose
    dtype is not known yet: its 2-byte lower bound); 0 where its config does not say (nothing refused for it)."""
    inner = getattr(model, "model", None)
    dtype = str(getattr(inner, "dtype", "bfloat16")).removeprefix("torch.")
    try:
        return kv_bytes_per_token(getattr(inner, "config", None) or model.config, dtype)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):  # an architecture without those fields
        return 0


def response_bytes(
    model: Any, sampling: SamplingConfig, readout: ReadoutConfig, longest_prompt: int, with_cache: bool
) -> tuple[int, int]:
    """(bytes per token, bytes whatever the length) one response being sampled holds at its longest: its KV cache
    (``with_cache``: the transformers sampler's; a vLLM engine holds its own, sized to its budget), its readout
    and its logits."""
    layers = model.n_layers
    per_readout_token = layers * (FLOAT32 * (1 + len(readout.also)) + LAYER_TOP_BYTES * readout.layer_top_k)
    window = sampling.max_new_tokens
    if sampling.readout_tokens is not None:
        window = min(window, sampling.readout_tokens)
    cache = kv_per_token(model) if with_cache else 0
    per_token = cache + (per_readout_token if window == sampling.max_new_tokens else 0)
    fixed = cache * longest_prompt + 2 * FLOAT32 * model.vocab_rows
    if window < sampling.max_new_tokens:
        fixed += window * per_readout_token
    return per_token, fixed


def sampled_together(run: GenerateRun | OnlineRun) -> tuple[str, int, int]:
    """(the setting, its value, the responses it makes sampled together): a pool's ``batch_size`` (at most the
    pool); online, the larger of the warm-up and a later batch (at most ``max_n``)."""
    if isinstance(run, GenerateRun):
        return "batch_size", run.batch_size, min(run.batch_size, run.pool)
    online = run.online
    setting = "batch_size" if online.batch_size >= online.warmup else "warmup"
    given = getattr(online, setting)
    return setting, given, min(given, online.max_n)


def refuse_unfit(
    lm: Any, run: GenerateRun | OnlineRun, questions: Sequence[Question], memory: bool = True
) -> None:
    """Refuse, before anything is sampled, a run that cannot be: a response that does not fit the model's context
    (``studies.generate.refuse_too_long``), or (``memory``) responses sampled together that do not fit this
    machine's memory (``check_pool``). ``lm``: a loaded model, or a ``ModelInfo`` (the CLI's, before the weights
    load)."""
    from depthlens.studies.generate import engine_len, refuse_too_long

    style, backend = run.answers.prompt_style, run.engine.backend
    longest = refuse_too_long(lm, questions, style, run.sampling.max_new_tokens, engine_len(run.engine))
    if memory:
        check_pool(lm, run.sampling, run.readout, sampled_together(run), longest, with_cache=backend == "hf")


def check_pool(
    model: Any,
    sampling: SamplingConfig,
    readout: ReadoutConfig,
    at_once: tuple[str, int, int],
    longest_prompt: int,
    with_cache: bool = True,
) -> None:
    """Refuse a pool whose responses sampled together cannot fit: one response at ``max_new_tokens`` first (naming
    it), then ``at_once`` — (its setting, the value given, the responses it makes sampled together)."""
    per_token, fixed = response_bytes(model, sampling, readout, longest_prompt, with_cache)
    one = Need(
        "max_new_tokens",
        sampling.max_new_tokens,
        per_token,
        f"one response to that many tokens after a {longest_prompt}-token prompt: "
        f"{_each(with_cache, model)} its {model.n_layers} layers' readout",
        fixed,
    )
    check_memory(one)
    setting, given, count = at_once
    check_memory(
        Need(
            setting,
            given,
            one.size,
            f"{count} response{'s' if count != 1 else ''} sampled together, each to "
            f"{sampling.max_new_tokens:,} tokens: {_each(with_cache, model)} its readout",
            count=count,
        )
    )


def _each(with_cache: bool, model: Any) -> str:
    if not with_cache:
        return "its logits and"
    return f"its KV cache ({kv_per_token(model):,} bytes a token), its logits and"


def sample_token_bytes(model: Any) -> int:
    """What one token of a sample holds on the transformers engine: its KV cache and its read-out row (a divergence
    per layer) — a served request's samples of one prompt are sampled together (``ServeConfig.max_sample_tokens``)."""
    return kv_per_token(model) + FLOAT32 * model.n_layers


def check_score_batch(model: Any, batch_size: int) -> None:
    """Refuse a ``batch_size`` whose records cannot fit even at one position each: logits and log-probabilities
    over the vocabulary, the L + 1 layer states, one token of KV cache — a batch the input could fill."""
    config = text_config(getattr(getattr(model, "model", None), "config", None) or model.config)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    per = 2 * FLOAT32 * model.vocab_rows + FLOAT32 * (model.n_layers + 1) * hidden + kv_per_token(model)
    check_memory(
        Need(
            "batch_size",
            batch_size,
            per,
            "records scored together, each at least one position's logits, layer states and KV cache",
        )
    )


def check_lens_fit(model: Any, max_tokens: int, batch_tokens: int, layers_per_step: int) -> None:
    """Refuse a tuned-lens fit whose held states (``max_tokens`` positions × L + 1 layers × d, float32) or whose
    KL step (``batch_tokens`` rows of log-probabilities at the final layer and each layer drawn, with their
    gradients) cannot fit."""
    config = text_config(getattr(getattr(model, "model", None), "config", None) or model.config)
    layers, hidden = model.n_layers, int(getattr(config, "hidden_size", 0) or 0)
    states = f"each position's {layers + 1} layer states of {hidden} floats"
    check_memory(Need("max_tokens", max_tokens, FLOAT32 * (layers + 1) * hidden, states))
    drawn = min(layers_per_step, layers) + 1
    rows = f"each row's log-probabilities over {model.vocab_rows:,} tokens at {drawn} layers, with their gradients"
    check_memory(Need("batch_tokens", batch_tokens, 3 * FLOAT32 * model.vocab_rows * drawn, rows))


def check_trials(voting: VotingConfig, questions: int, methods: Sequence[str]) -> None:
    """Refuse ``voting.trials`` whose outcome arrays — six per method, trials × questions float64 — cannot fit."""
    per = FLOAT64 * questions * 6 * max(1, len(methods))
    check_memory(
        Need(
            "trials",
            voting.trials,
            per,
            f"each of {len(methods)} methods' outcomes per trial on {questions} questions",
        )
    )


def check_correlation(cfg: CorrelationConfig, questions: int, largest_pool: int) -> None:
    """Refuse ``seeds`` whose per-seed bins (seeds × questions × (2 bins + 1) float64) cannot fit, and — a setting
    only Python gives — ``permutations`` whose shuffles of the largest pool (a float64 draw and its int64 order
    each) cannot."""
    check_memory(
        Need(
            "seeds",
            cfg.seeds,
            FLOAT64 * questions * (2 * cfg.bins + 1),
            f"each seed's bins of {questions} questions",
        )
    )
    check_memory(
        Need(
            "permutations",
            cfg.permutations,
            2 * FLOAT64 * largest_pool,
            f"each permutation of a {largest_pool}-response question",
        )
    )
