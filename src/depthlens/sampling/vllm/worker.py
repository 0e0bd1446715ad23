"""The readout inside a vLLM worker: which rows of a step are read out, the lens over them, and what is kept.

``ReadoutWorkerMixin`` goes in front of vLLM's worker class (``cpu_worker`` / ``gpu_worker``, passed to the
engine as ``worker_cls``). After ``load_model`` it installs the capture (``capture.install``), before vLLM
profiles and compiles the model. After each forward pass, in ``sample_tokens`` — before the engine samples —
it reads out the rows of this step that a request asked for (``settings.RequestReadout``):

- generation: the position the engine samples from, while the request's output is shorter than its window;
  a partly prefilled prompt (chunked prefill) samples nothing and is skipped;
- prefill readout (``prompt_from``): every position of the prompt that predicts one of its completion tokens.

Which rows are read is found before the engine samples; they are read right after it has (the states stay as the
forward left them), so a generated position's target trajectory reads the very token sampled there — the runner's
``_sample`` is wrapped to keep its sampled ids (``_record_samples``).

Rows of all requests with the same settings go through one lens walk (whatever each one's ``layer_top_k``: the
walk takes its rows' largest K). Only [kinds × L] float32 rows per token are kept (and, where a request asks for
``layer_top_k`` = K, [L × K] token ids and probabilities taken from the same logits; for the per-layer quantities,
[L] or [L × M] values), by request tag and position, until ``depthlens_take`` (called through ``collective_rpc``)
hands them over and forgets them. Under tensor parallelism every rank runs the same ``compute_logits`` calls (each
is a collective); rank 0 alone computes and keeps the divergences.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from depthlens.metrics.layer_quantities import LayerQuantities
from depthlens.sampling.vllm.capture import Capture, install
from depthlens.sampling.vllm.lens import (
    EngineLens,
    EngineTunedLens,
    Float32Head,
    RowsRead,
    read_rows,
    walk_collectives,
)
from depthlens.sampling.vllm.settings import TAG_KEY, EngineReadout, RequestReadout, Taken
from depthlens.sampling.vllm.tuned import load_translators


@dataclasses.dataclass
class _Rows:
    """The rows of one step that share settings: flat batch rows, and whose position each one is."""

    settings: RequestReadout
    flat: list[int] = dataclasses.field(default_factory=list)
    owners: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # (tag, position)
    targets: list[int] = dataclasses.field(default_factory=list)  # prefill: the token each row predicts
    ks: list[int] = dataclasses.field(default_factory=list)  # each row's request's layer_top_k (0: none)
    sampled_by: list[int] = dataclasses.field(
        default_factory=list
    )  # generation: its request's row in the batch

    def quantities(self) -> LayerQuantities | None:
        """The per-layer quantities these rows' settings ask for (None: none)."""
        s = self.settings
        quantities = LayerQuantities(s.layer_target, s.track, s.layer_entropy)
        return quantities if quantities else None


_NONE: tuple[list[int], list[int], list[int]] = ([], [], [])


def _request_rows(
    req: Any, settings: RequestReadout, start: int, scheduled: int
) -> tuple[list[int], list[int], list[int]]:
    """(flat rows, positions, predicted prompt tokens) the request's readout asks for in this step."""
    computed, prompt = req.num_computed_tokens, req.num_prompt_tokens
    if settings.prompt_from is not None:
        # Teacher forcing: prompt index k ≥ prompt_from is completion token k − prompt_from, read at k − 1.
        at = range(max(settings.prompt_from - 1, computed), min(prompt - 1, computed + scheduled))
        ids = req.prompt_token_ids
        flat = [start + q - computed for q in at]
        return flat, [q + 1 - settings.prompt_from for q in at], [ids[q + 1] for q in at]
    if computed + scheduled < prompt:
        return _NONE  # a partial prefill: its sample is thrown away
    position = len(req.output_token_ids)
    if settings.window is not None and position >= settings.window:
        return _NONE
    return [start + scheduled - 1], [position], []


class InEngineReadout:
    """The worker's readout state: the capture, the lens modules and the rows kept until taken."""

    def __init__(self, runner: Any, config: EngineReadout) -> None:
        self.capture: Capture = install(runner, config)
        self.model = runner.get_model()
        self.n_layers = config.n_layers
        self.kept: dict[str, dict[int, torch.Tensor]] = {}
        self.base: dict[str, dict[int, torch.Tensor]] = {}  # prefill readout: [3] baselines per position
        self.top: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}  # [L, K] ids and probs
        self.values: dict[str, dict[int, dict[str, torch.Tensor]]] = {}  # per-layer quantities: [L] or [L, M]
        self.sampled: torch.Tensor | None = (
            None  # this step's sampled ids [requests, 1+], once it has sampled
        )
        self._record_samples(runner)
        from vllm.distributed import get_tensor_model_parallel_rank

        self.rank = get_tensor_model_parallel_rank()
        self.float32: Float32Head | None = None  # made at the first request that asks for a float32 lens
        self.hidden_size = int(runner.model_config.get_hidden_size())
        self.device = next(self.model.parameters()).device

    def _record_samples(self, runner: Any) -> None:
        """Keep each step's sampled token ids (the runner's ``_sample`` output, [requests, 1+] on the device, one
        row per request of the input batch): a generated position's target is the token sampled there."""
        sample = getattr(runner, "_sample", None)
        if sample is None:  # another runner: the target trajectory of generated tokens refuses below
            return

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = sample(*args, **kwargs)
            self.sampled = out.sampled_token_ids
            return out

        runner._sample = recorded

    def lens(self, settings: RequestReadout) -> EngineLens:
        """The lens a request's settings ask for: the engine's own modules, or their float32 copies; through a
        tuned lens's translators where it names one."""
        norm, compute_logits = self.capture.norm, self.model.compute_logits
        if settings.float32_lens:
            if self.float32 is None:
                self.float32 = Float32Head(self.model, self.capture.norm)
            norm, compute_logits = self.float32.norm, self.float32.compute_logits
        if settings.lens is None:
            return EngineLens(norm, compute_logits, settings.vocab, settings.final_norm)
        weight, bias = load_translators(
            settings.lens, settings.lens_digest, self.n_layers, self.hidden_size, self.device
        )
        return EngineTunedLens(norm, compute_logits, weight, bias, settings.vocab, settings.final_norm)

    def _groups(self, runner: Any, state: Any) -> list[_Rows]:
        batch = runner.input_batch
        starts = runner.query_start_loc.np
        scheduled = state.scheduler_output.num_scheduled_tokens
        groups: dict[tuple[Any, ...], _Rows] = {}
        for row, req_id in enumerate(batch.req_ids[: batch.num_reqs]):
            req = runner.requests.get(req_id)
            params = req.sampling_params if req is not None else None
            settings = RequestReadout.from_extra(params.extra_args) if params is not None else None
            if settings is None or params is None or req_id not in scheduled:
                continue
            flat, positions, targets = _request_rows(req, settings, int(starts[row]), scheduled[req_id])
            if flat:
                tag = str(params.extra_args[TAG_KEY])
                rows = groups.setdefault(settings.group(), _Rows(settings))
                rows.flat.extend(flat)
                rows.owners.extend((tag, p) for p in positions)
                rows.targets.extend(targets)
                rows.ks.extend([settings.layer_top_k] * len(flat))
                if not targets:  # a generated position: its token is the one the engine samples for this row
                    rows.sampled_by.extend([row] * len(flat))
        return list(groups.values())

    def pending(self, runner: Any) -> tuple[Any, list[_Rows]] | None:
        """This step's forward state and the rows to read out of it, found before the engine samples (which
        clears the state from the runner); None when the step ran no forward."""
        state = runner.execute_model_state
        if state is None:
            return None
        self.sampled = None
        return state, self._groups(runner, state)

    @torch.inference_mode()
    def step(self, pending: tuple[Any, list[_Rows]] | None) -> None:
        """Read out the rows ``pending`` found (called after the engine sampled this step's tokens)."""
        if pending is None:
            return
        state, groups = pending
        for rows in groups:
            settings = rows.settings
            lens = self.lens(settings)
            size = max(1, settings.rows)
            for lo in range(0, len(rows.flat), size):
                flat = torch.tensor(
                    rows.flat[lo : lo + size], dtype=torch.long, device=state.hidden_states.device
                )
                hidden = self.capture.states(state, flat)
                final_normed = state.hidden_states[flat]
                if settings.float32_lens:
                    hidden, final_normed = tuple(h.float() for h in hidden), final_normed.float()
                if self.rank != 0:
                    walk_collectives(lens, hidden, final_normed, settings.rows)
                    continue
                targets = torch.tensor(rows.targets[lo : lo + size]) if rows.targets else None
                ks = rows.ks[lo : lo + size]
                quantities = rows.quantities()
                sampled = (
                    self._sampled(rows.sampled_by[lo : lo + size]) if quantities and targets is None else None
                )
                read = read_rows(
                    lens,
                    hidden,
                    final_normed,
                    settings.kinds,
                    settings.rows,
                    targets,
                    max(ks),
                    quantities,
                    sampled,
                )
                self._keep(read, rows.owners[lo : lo + size], ks)

    def _sampled(self, batch_rows: list[int]) -> torch.Tensor:
        """The tokens this step sampled for the requests at ``batch_rows`` of the input batch, [k] on the device."""
        if self.sampled is None:
            raise RuntimeError(
                "depthlens: this vLLM runner did not report its sampled tokens, which the target trajectory of a "
                "generated token reads; use the transformers backend for layer_target"
            )
        index = torch.tensor(batch_rows, dtype=torch.long, device=self.sampled.device)
        return self.sampled[index, 0].long()

    def _keep(self, read: RowsRead, owners: list[tuple[str, int]], ks: list[int]) -> None:
        """Keep a block's rows by (tag, position): one copy to the host per block of rows, not one per row; each
        row's own K of the block's top-k (a copy where it is fewer, so the block is not held for it)."""
        values = read.values.cpu()
        base = read.base.cpu() if read.base is not None else None
        top = None  # each layer's top-k: ids and probabilities are set together, or neither
        if read.top_ids is not None and read.top_probs is not None:
            top = (read.top_ids.cpu(), read.top_probs.cpu())
        per_layer = {name: v.cpu() for name, v in read.per_layer.items()} if read.per_layer else None
        for j, (tag, position) in enumerate(owners):
            if per_layer is not None:
                self.values.setdefault(tag, {})[position] = {name: v[j] for name, v in per_layer.items()}
            self.kept.setdefault(tag, {})[position] = values[j]
            if base is not None:
                self.base.setdefault(tag, {})[position] = base[j]
            if top is not None and ks[j]:
                ids, probs = top[0][j], top[1][j]  # [L, K] of the block's largest K
                if ks[j] < ids.shape[-1]:
                    ids, probs = ids[:, : ks[j]].clone(), probs[:, : ks[j]].clone()
                self.top.setdefault(tag, {})[position] = (ids, probs)

    def take(self, tags: list[str]) -> dict[str, Taken] | None:
        """The rows kept for ``tags`` (forgotten here); None on ranks other than 0, which keep none."""
        if self.rank != 0:
            return None
        out: dict[str, Taken] = {}
        for tag in tags:
            kept, base, top = self.kept.pop(tag, {}), self.base.pop(tag, None), self.top.pop(tag, None)
            values = self.values.pop(tag, None)
            positions = sorted(kept)
            if not positions:
                out[tag] = Taken([], torch.zeros(0, 0, self.n_layers))
                continue
            out[tag] = Taken(
                positions,
                torch.stack([kept[p] for p in positions]),
                torch.stack([base[p] for p in positions]) if base else None,
                torch.stack([top[p][0] for p in positions]) if top else None,
                torch.stack([top[p][1] for p in positions]) if top else None,
                _stacked(values, positions),
            )
        return out


def _stacked(
    values: dict[int, dict[str, torch.Tensor]] | None, positions: list[int]
) -> dict[str, torch.Tensor] | None:
    """Each per-layer field's rows of ``positions`` stacked: [n, L] or [n, L, M]; None where none were kept."""
    if not values:
        return None
    fields = values[positions[0]]
    return {name: torch.stack([values[p][name] for p in positions]) for name in fields}


class ReadoutWorkerMixin:
    """In front of a vLLM worker class: the in-engine readout, set up when ``additional_config`` asks for it."""

    depthlens_readout: InEngineReadout | None = None
    vllm_config: Any  # the vLLM worker's own, set by its __init__
    model_runner: Any

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)  # type: ignore[misc]  # the vLLM worker class defines it
        config = EngineReadout.from_config(self.vllm_config.additional_config)
        if config is not None:
            self.depthlens_readout = InEngineReadout(self.model_runner, config)

    def sample_tokens(self, grammar_output: Any) -> Any:
        readout = self.depthlens_readout
        if readout is None:
            return super().sample_tokens(grammar_output)  # type: ignore[misc]  # the vLLM worker class defines it
        pending = readout.pending(self.model_runner)
        output = super().sample_tokens(grammar_output)  # type: ignore[misc]  # the vLLM worker class defines it
        readout.step(pending)  # after sampling: a generated position reads out the token sampled there
        return output

    def depthlens_take(self, tags: list[str]) -> dict[str, Taken] | None:
        """Called through ``collective_rpc``: the kept rows of ``tags``."""
        return self.depthlens_readout.take(tags) if self.depthlens_readout is not None else None

    def depthlens_capture(self) -> str | None:
        """Called through ``collective_rpc``: which capture path this worker runs (None: no readout)."""
        return self.depthlens_readout.capture.kind if self.depthlens_readout is not None else None
