"""What every generation engine gives voting and studies: ``Trace``s of sampled responses with each token's
readout, through the ``GenerationBackend`` protocol (``start`` → ``Paused`` → ``resume``).

Think@n needs two phases: generate ℓ-token prefixes for all n samples, rank them by the DTR of those prefixes,
and continue only the kept ones. ``start`` runs phase one and returns a ``Paused`` batch whose state stays
alive; ``resume`` continues the kept rows from their exact prefix tokens — no token is re-fed and nothing is
scored twice. A new engine is one class with ``n_layers``, ``start`` and ``resume`` (``sampling.hf``,
``sampling.vllm``); nothing above this room sees more than ``Trace``s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import torch

from depthlens.errors import InputError
from depthlens.metrics.baselines import token_baselines, token_confidence
from depthlens.models.load import LoadedModel

Finish = Literal["eos", "length", "paused", "stopped"]

PER_TOKEN = ("log_prob", "entropy", "self_certainty", "confidence")
"""The final-layer values every backend records per generated token (nats; ``Trace``'s per-token fields), which a
sample store keeps for every token whatever the read-out window."""

# End-of-turn markers of common chat templates: generation stops at any that the tokenizer knows, beside the
# model's own eos ids (GGUF conversions often record only one of them).
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|return|>")


@dataclasses.dataclass
class Trace:
    """One sampled response and the per-token readout taken while it was generated.

    Attributes:
        seed: the seed of this response's own random generator.
        token_ids: the generated tokens, the end-of-turn token included when one was produced.
        finish: ``eos`` (ended by the model), ``length`` (hit max_new_tokens), ``paused`` (phase one ended) or
            ``stopped`` (ended by its caller's ``sampling.live.Watch``: a stop string, an online policy).
        log_prob, entropy, self_certainty, confidence: per generated token, from the final layer (nats).
        divergence: [min(T, readout_tokens)][L] divergence of each layer to the final one (the heatmap rows).
        also: the same rows for each further divergence kind of ``ReadoutConfig.also``.
        layer_top_ids, layer_top_probs: [min(T, readout_tokens)][L][K] each layer's K most probable tokens and
            their probabilities, descending (``ReadoutConfig.layer_top_k``; empty when it is 0).
        layer_values: the per-layer quantities asked for (``metrics.layer_quantities``: the target trajectory,
            tracked ids, entropy, a caller's statistics), field → [min(T, readout_tokens)][L] (or [L][m]) rows;
            ranks as whole numbers.
    """

    seed: int
    token_ids: list[int] = dataclasses.field(default_factory=list)
    finish: Finish = "paused"
    log_prob: list[float] = dataclasses.field(default_factory=list)
    entropy: list[float] = dataclasses.field(default_factory=list)
    self_certainty: list[float] = dataclasses.field(default_factory=list)
    confidence: list[float] = dataclasses.field(default_factory=list)
    divergence: list[list[float]] = dataclasses.field(default_factory=list)
    also: dict[str, list[list[float]]] = dataclasses.field(default_factory=dict)
    layer_top_ids: list[list[list[int]]] = dataclasses.field(default_factory=list)
    layer_top_probs: list[list[list[float]]] = dataclasses.field(default_factory=list)
    layer_values: dict[str, list[Any]] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclasses.dataclass
class Paused:
    """Phase one's responses, each stopped after its prefix (or finished), and the state to continue them."""

    traces: list[Trace]
    state: Any  # backend-specific; for HFGenerator a _State


class GenerationBackend(Protocol):
    """What voting and studies need from a generation engine."""

    n_layers: int

    def start(self, prompt_ids: Sequence[int], seeds: Sequence[int], stop_after: int | None = None) -> Paused:
        """Sample one response per seed for the prompt, pausing each after ``stop_after`` tokens."""
        ...

    def resume(self, paused: Paused, keep: Sequence[int]) -> list[Trace]:
        """Continue the responses at positions ``keep`` of ``paused.traces`` to their end; returns those."""


_MIX = (-0x40A7B892E31B1A47, -0x6B2FB644ECCEEE15)  # splitmix64's multipliers as signed 64-bit integers
_GOLDEN = -0x61C8864680B583EB  # 2^64 / φ, signed: spreads consecutive seeds and steps apart


def sampling_uniforms(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """One uniform in [0, 1) per row from its response's seed and the step: [R] long → [R] float64.

    A counter-based generator (splitmix64's mixing of seed and step, in wrapping int64 arithmetic on the device):
    a response's draw at step s depends on its seed and s only — not on its row, its batch or the device — and a
    whole batch is drawn in one op, where a ``torch.Generator`` per row costs one kernel launch per row and step.
    """
    offset = ((step + 1) * _MIX[1] + 2**63) % 2**64 - 2**63  # the step's term, wrapped to int64 here
    z = seeds.long() * _GOLDEN + offset
    z = (z ^ _shift(z, 30)) * _MIX[0]
    z = (z ^ _shift(z, 27)) * _MIX[1]
    z = z ^ _shift(z, 31)
    return _shift(z, 11).double() / float(1 << 53)  # the top 53 bits


def _shift(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic: it would copy the sign bit in)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def next_token(
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """Sample one token per row of ``logits`` [R, V] (float32) by inverse CDF at ``uniforms`` [R]; [R] long.

    The filters apply in ``model.generate``'s order to the tempered distribution: top-k (0 = off) keeps the k
    largest logits, top-p the smallest set of tokens holding ``top_p`` of the mass (the top token always stays),
    min-p drops tokens below ``min_p`` × the top probability. Batched: one sort and one search for all rows.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    if 0 < top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs, order = torch.softmax(scaled, dim=-1).sort(dim=-1, descending=True)  # [R, V], largest first
    if top_p < 1:
        before = probs.cumsum(dim=-1) - probs  # mass strictly above each token
        probs = probs.masked_fill(before >= top_p, 0.0)
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs[:, :1], 0.0)
    cdf = probs.double().cumsum(dim=-1)
    target = uniforms.to(cdf.device)[:, None] * cdf[:, -1:]
    picked = torch.searchsorted(cdf, target, right=True).clamp_max(cdf.shape[-1] - 1)  # first cdf > target
    return order.gather(-1, picked).squeeze(-1)


def score_columns(
    final_logprobs: torch.Tensor, tokens: torch.Tensor, confidence_top_k: int
) -> dict[str, torch.Tensor]:
    """log p, entropy, self-certainty and DeepConf confidence of each row's token, from the final layer [R, V];
    each [R] on the device (``PER_TOKEN``'s order)."""
    base = token_baselines(final_logprobs, tokens)
    base["confidence"] = token_confidence(final_logprobs, confidence_top_k)
    return {key: base[key] for key in PER_TOKEN}


def token_scores(
    final_logprobs: torch.Tensor, tokens: torch.Tensor, confidence_top_k: int
) -> dict[str, list]:
    """``score_columns`` as lists of Python floats (float64)."""
    columns = score_columns(final_logprobs, tokens, confidence_top_k)
    return {k: v.double().cpu().tolist() for k, v in columns.items()}


def kept_positions(paused: Paused, keep: Sequence[int]) -> set[int]:
    """``keep`` as a set, checked against the paused responses."""
    unknown = set(keep) - set(range(len(paused.traces)))
    if unknown:
        raise InputError(f"resume: no responses at positions {sorted(unknown)}")
    return set(keep)


def end_token_ids(lm: LoadedModel) -> set[int]:
    """Token ids that end a response: the model's eos ids and any known end-of-turn marker of its tokenizer."""
    ids: set[int] = set()
    config = getattr(lm.model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    tok = lm.tokenizer
    if tok is not None:
        if tok.eos_token_id is not None:
            ids.add(int(tok.eos_token_id))
        vocab = tok.get_vocab()
        ids.update(vocab[m] for m in END_OF_TURN if m in vocab)
    return ids
