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


def next_token(
    logits: torch.Tensor, temperature: float, top_p: float, generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """Sample one token per row of ``logits`` [R, V] (float32), each row with its own generator; [R] long."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each token
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)  # the top token always stays
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    picks = [torch.multinomial(probs[r], 1, generator=g) for r, g in enumerate(generators)]
    return torch.cat(picks)


def token_scores(
    final_logprobs: torch.Tensor, tokens: torch.Tensor, confidence_top_k: int
) -> dict[str, list]:
    """log p, entropy, self-certainty and DeepConf confidence of each row's token, from the final layer [R, V]."""
    base = token_baselines(final_logprobs, tokens)
    base["confidence"] = token_confidence(final_logprobs, confidence_top_k)
    return {k: v.double().cpu().tolist() for k, v in base.items()}


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
