"""Sample on a transformers model with a KV cache and read each token's layers out of the very pass that
generated it (``HFGenerator``).

Every response has its own ``torch.Generator`` seeded from its own seed, so a response's tokens do not depend
on which other responses share its batch or whether they were rejected (its floats, up to float32 rounding of
the batch shape: equal within 5e-5 relative, tests/tolerance.py). Two phases keep the KV cache, last tokens and
generators of the paused rows and select the kept ones from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from depthlens.config import ReadoutConfig, SamplingConfig
from depthlens.errors import InputError
from depthlens.metrics.token_table import chunk_divergence_kinds
from depthlens.models.load import LoadedModel
from depthlens.readout.stream import TokenSequence, lens_for, model_chunk_sizes, rows_chunk, validate
from depthlens.sampling.backend import (
    PER_TOKEN,
    Paused,
    Trace,
    end_token_ids,
    kept_positions,
    next_token,
    token_scores,
)
from depthlens.sampling.live import Watch


@dataclasses.dataclass
class _State:
    cache: Any  # the model's KV cache, one row per active response
    rows: list[int]  # active row → index into traces
    generators: list[torch.Generator]  # per active row
    last: torch.Tensor | None  # [R] tokens sampled but not yet fed (None before the first step)
    pending: Any  # the prefill's outputs until the first token is sampled
    step: int = 0


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
        self.watch = Watch()  # per-step callbacks (sampling.live): a server's stream, stop strings, cancel

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
                for key in PER_TOKEN:
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
            self.watch.on_step(traces)
            for r in alive:
                if self.watch.ends(state.rows[r], traces[state.rows[r]]):
                    traces[state.rows[r]].finish = "stopped"
            alive = [r for r in alive if traces[state.rows[r]].finish == "paused"]
            state.step += 1
            state.last = tokens
            self.on_token(len(state.rows))
            if len(alive) < len(state.rows):
                if alive:
                    self._select(state, alive)
                else:
                    state.rows, state.generators = [], []
