"""Sample on a transformers model with a KV cache and read each token's layers out of the very pass that
generated it (``HFGenerator``).

Every response draws from its own seed (``backend.sampling_uniforms``: a counter-based generator of seed and
step), so a response's tokens do not depend on which other responses share its batch or whether they were
rejected (its floats, up to float32 rounding of the batch shape: equal within 5e-5 relative,
tests/tolerance.py). Two phases keep the KV cache, last tokens and seeds of the paused rows and select the kept
ones from them.

A step's work stays on the device and is batched over its rows — sampling, the per-token final-layer scores, the
readout — and its results cross to the host in one copy (``_StepResults``); the traces are filled from those host
arrays once per call, or after every step when a ``Watch`` looks at them. The readout goes through the fused
compiled kernel (``metrics.fused.compiled_block``) as ``ReadoutConfig.compile`` says: ``on`` from the first step,
``auto`` on CUDA, and on a CPU once the eager readout has run long enough for a compilation to pay
(``CompileRule``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from depthlens.config import ReadoutConfig, SamplingConfig
from depthlens.config.readout import check_track
from depthlens.errors import InputError
from depthlens.metrics.fused import CompileRule
from depthlens.metrics.layer_names import is_rank
from depthlens.metrics.layer_quantities import LayerQuantities, LayerStat, check_finite_stats, probe_stats
from depthlens.metrics.token_table import chunk_divergence_kinds
from depthlens.models.load import LoadedModel
from depthlens.readout.stream import (
    TokenSequence,
    check_finite,
    lens_for,
    model_chunk_sizes,
    rows_chunk,
    validate,
)
from depthlens.sampling.backend import (
    PER_TOKEN,
    Paused,
    Trace,
    end_token_ids,
    kept_positions,
    next_token,
    sampling_uniforms,
    score_columns,
)
from depthlens.sampling.live import Watch
from depthlens.sampling.step_layout import StepLayout


@dataclasses.dataclass
class _State:
    cache: Any  # the model's KV cache, one row per active response
    rows: list[int]  # active row → index into traces
    seeds: torch.Tensor  # [R] long, per active row, on the device
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
        layer_stats: Mapping[str, LayerStat] | None = None,
    ) -> None:
        """``layer_stats``: a caller's statistics of each layer's log-probabilities, taken in the same pass
        (``metrics.layer_quantities``; tried on a probe block here, refused by name)."""
        self.lm = lm
        self.sampling = sampling
        self.readout = readout
        self.lens = lens_for(lm, readout)
        self.n_layers = lm.n_layers
        self.end_ids = end_token_ids(lm)
        self.block_rows = model_chunk_sizes(lm, self.lens, readout)[1]  # token-layer rows per lens product
        self.compile = CompileRule(
            readout.compile, lm.device
        )  # the fused kernel: now, never, or once it pays
        self.on_token = on_token  # called with the number of tokens generated at each step (progress)
        self.watch = Watch()  # per-step callbacks (sampling.live): a server's stream, stop strings, cancel
        kinds = (readout.divergence, *readout.also)
        vocab = self.lens.vocab_size or lm.vocab_rows
        check_track(readout.track, vocab, lm.name)
        self.quantities = LayerQuantities.of(readout, probe_stats(layer_stats, vocab))
        fields = tuple(self.quantities.fields().items())
        self.layout = StepLayout(
            len(PER_TOKEN), kinds, self.n_layers, readout.layer_top_k, fields
        )  # a step's row

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
        seed_rows = torch.tensor([int(s) for s in seeds], dtype=torch.long, device=device)
        state = _State(cache, list(range(len(seeds))), seed_rows, None, out)
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
        state.seeds = state.seeds[index]

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

    def _step(self, state: _State) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """One forward and everything read from it, on the device: the sampled tokens [R] and one float64 row per
        response, laid out by ``self.layout`` (token id, ``PER_TOKEN``, then, when read, each divergence kind's
        layers, each layer's top-k and the first non-finite layer)."""
        cfg = self.sampling
        hidden, logits = self._forward(state)
        final = self.lens.final_logits(logits)
        uniforms = sampling_uniforms(state.seeds, state.step)
        tokens = next_token(final, uniforms, cfg.temperature, cfg.top_p, cfg.top_k, cfg.min_p)
        columns = score_columns(torch.log_softmax(final, dim=-1), tokens, cfg.confidence_top_k)
        scores = [columns[k] for k in PER_TOKEN]
        if hidden is None:
            return tokens, self.layout.pack(tokens, scores), False
        began = time.process_time()
        chunk = rows_chunk(self.lm, self.lens, hidden, logits, tokens, start=state.step)
        kinds, top_k = self.layout.kinds, self.layout.top_k
        quantities = self.quantities or None
        tables = chunk_divergence_kinds(
            chunk,
            kinds,
            self.block_rows,
            compiled=self.compile.compiled,
            layer_top=top_k,
            quantities=quantities,
        )
        self.compile.note(time.process_time() - began)  # on a CPU the work is done when the call returns
        top = (tables["layer_top_ids"], tables["layer_top_probs"]) if top_k else None
        # the first non-finite layer is checked on the host, after the step's one copy
        packed = self.layout.pack(tokens, scores, [tables[k] for k in kinds], top, chunk.nonfinite, tables)
        return tokens, packed, True

    def _run(self, traces: list[Trace], state: _State, stop_at: int) -> None:
        cfg = self.sampling
        watching = self.watch != Watch()
        results = _StepResults(self.layout)
        ends = np.array(sorted(self.end_ids), dtype=np.int64)
        lengths = np.array([len(traces[r]) for r in state.rows], dtype=np.int64)
        while state.rows and state.step < stop_at:
            tokens, packed, read = self._step(state)
            values = packed.cpu().numpy()  # the step's one host copy
            if read:
                # a row's token is its response's step-th
                check_finite(self.layout.nonfinite(values), state.step)
                check_finite_stats(self.layout.values(values))
            rows = np.array(state.rows, dtype=np.int64)
            results.add(rows, values, read)
            lengths += 1
            ids = self.layout.token_ids(values)
            finish = np.where(
                np.isin(ids, ends), "eos", np.where(lengths >= cfg.max_new_tokens, "length", "")
            )
            for r in np.flatnonzero(finish != ""):
                traces[state.rows[r]].finish = str(finish[r])
            alive = np.flatnonzero(finish == "")
            if watching:
                results.flush(traces)
                self.watch.on_step(traces)
                for r in alive:
                    if self.watch.ends(state.rows[r], traces[state.rows[r]]):
                        traces[state.rows[r]].finish = "stopped"
                alive = np.array(
                    [r for r in alive if traces[state.rows[r]].finish == "paused"], dtype=np.int64
                )
            state.step += 1
            state.last = tokens
            self.on_token(len(state.rows))
            if len(alive) < len(state.rows):
                lengths = lengths[alive]
                if len(alive):
                    self._select(state, alive.tolist())
                else:
                    state.rows, state.seeds = [], state.seeds[:0]
        results.flush(traces)


class _StepResults:
    """Each step's host array of results, kept until the traces are filled from them (``flush``): per trace, its
    rows of every step at once, so no step pays a loop over its responses."""

    def __init__(self, layout: StepLayout) -> None:
        self.layout = layout
        self.rows: list[np.ndarray] = []  # per step: the trace index of each row
        self.values: list[np.ndarray] = []  # per step: [R, layout.width(read)]
        self.read: list[bool] = []

    def add(self, rows: np.ndarray, values: np.ndarray, read: bool) -> None:
        self.rows.append(rows)
        self.values.append(values)
        self.read.append(read)

    def flush(self, traces: list[Trace]) -> None:
        """Append the kept steps' results to their traces, then forget them."""
        layout = self.layout
        base = layout.width(read=False)
        for index, mine in _by_trace(self.rows, [v[:, :base] for v in self.values]):
            trace = traces[index]
            trace.token_ids.extend(layout.token_ids(mine).tolist())
            for key, column in zip(PER_TOKEN, layout.scores(mine).T, strict=True):
                getattr(trace, key).extend(column.tolist())
        read = [i for i, flag in enumerate(self.read) if flag]
        for index, mine in _by_trace([self.rows[i] for i in read], [self.values[i] for i in read]):
            layers = layout.layers(mine)  # [steps, kinds, L]
            traces[index].divergence.extend(layers[:, 0].tolist())
            for k, kind in enumerate(layout.kinds[1:], start=1):
                traces[index].also.setdefault(kind, []).extend(layers[:, k].tolist())
            if layout.top_k:
                ids, probs = layout.top(mine)  # [steps, L, K]
                traces[index].layer_top_ids.extend(ids.tolist())
                traces[index].layer_top_probs.extend(probs.tolist())
            for name, value in layout.values(mine).items():  # [steps, L] or [steps, L, m]
                rows = value.astype(np.int64) if is_rank(name) else value
                traces[index].layer_values.setdefault(name, []).extend(rows.tolist())
        self.rows, self.values, self.read = [], [], []


def _by_trace(rows: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    """Steps' rows regrouped per trace: (trace index, its rows of every step in step order)."""
    if not rows:
        return []
    index, table = np.concatenate(rows), np.concatenate(values)
    order = np.argsort(index, kind="stable")
    traces, starts = np.unique(index[order], return_index=True)
    bounds = [*starts[1:], len(order)]
    return [(int(t), table[order[lo:hi]]) for t, lo, hi in zip(traces, starts, bounds, strict=True)]
