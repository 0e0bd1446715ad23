"""Reduce a readout stream to per-token tables and per-sequence scores. Pure: no I/O, no model calls.

The only tensors kept per sequence are [T, L] divergences and a few [T] vectors; the vocab-sized log-probs of
each chunk are consumed and dropped as the stream advances.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from depthlens.config import Divergence, DTRConfig, TCBConfig
from depthlens.metrics.baselines import sequence_baselines, token_baselines
from depthlens.metrics.divergence import layer_divergence
from depthlens.metrics.dtr import (
    deep_flags,
    deep_thinking_ratio,
    mean_settling_depth,
    settling_depth,
    topk_agreement,
    topk_settling_depth,
)
from depthlens.metrics.fused import FUSABLE, compiled_block, compiled_step, compiled_tcb_softmax
from depthlens.metrics.layer_names import is_per_layer
from depthlens.metrics.layer_quantities import LayerQuantities, check_finite_stats
from depthlens.metrics.layer_top import layer_top_k_of_logprobs, top_k_by_blocks, top_k_probs
from depthlens.metrics.tcb import Unembedding, model_row_norms_sq, token_constraint_terms
from depthlens.readout.stream import ReadoutChunk, check_finite

TCB_FIELDS = ("tcb", "v_eff", "margin", "tcb_spectral")  # per-token TCB columns, when asked for


@dataclasses.dataclass(frozen=True)
class TokenTable:
    """Everything per completion token of one sequence."""

    target_ids: torch.Tensor  # [T] long
    divergence: torch.Tensor | None  # [T, L] float32, column L − 1 is 0; None under early exit
    log_prob: torch.Tensor  # [T] log p_L(y_t), nats
    entropy: torch.Tensor  # [T] H(p_L), nats
    self_certainty: torch.Tensor  # [T] KL(U ‖ p_L), nats
    tcb: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # TCB_FIELDS present → [T] float64
    settling: torch.Tensor | None = None  # [T] long: found by early exit (divergence None) or the topk rule
    layer_top_ids: torch.Tensor | None = None  # [T, L, K] long: each layer's K most probable tokens, if asked
    layer_top_probs: torch.Tensor | None = None  # [T, L, K] float32: their probabilities, descending
    # the per-layer quantities asked for (metrics.layer_quantities): field → [T, L] or [T, L, m]
    layer_values: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    hidden: torch.Tensor | None = None  # [T, k, d] float32: the residual streams of the layers kept, if asked

    @property
    def n_tokens(self) -> int:
        return int(self.target_ids.numel())

    @staticmethod
    def empty(n_layers: int) -> TokenTable:
        zeros = torch.zeros(0)
        return TokenTable(torch.zeros(0, dtype=torch.long), torch.zeros(0, n_layers), zeros, zeros, zeros, {})


def chunk_divergences(
    chunk: ReadoutChunk, kind: Divergence, rows: int = 0, compiled: bool = False
) -> torch.Tensor:
    """D_{t,l} for one chunk, [c, L] on the chunk's device, reading its layers in blocks of about ``rows``
    token-layer rows (0: one layer at a time); ``compiled``: one fused kernel per layer (``metrics.fused``) where
    the kind allows."""
    step = compiled_step(chunk.lens, kind) if compiled else None
    if step is None:
        return chunk_divergence_kinds(chunk, (kind,), rows)[kind]
    out = torch.zeros(len(chunk), chunk.n_layers, device=chunk.final.logprobs.device)
    every = torch.arange(len(chunk), device=out.device)
    for layer in range(1, chunk.n_layers):
        out[:, layer - 1] = step(chunk.normed_rows(layer), chunk.final.logprobs, every)
    return out


def chunk_divergence_kinds(
    chunk: ReadoutChunk,
    kinds: Sequence[Divergence],
    rows: int = 0,
    top_k: int | None = None,
    compiled: bool = False,
    layer_top: int = 0,
    quantities: LayerQuantities | None = None,
) -> dict[str, torch.Tensor]:
    """D_{t,l} of several divergence kinds in one walk over the layers: each kind → [c, L], on the chunk's device;
    with ``top_k``, also ``"topk"`` → [c, L] bool: the layer's top-K token set equals the final layer's (the
    ``topk:K`` settling rule, ``metrics.dtr.topk_settling_depth``), from the same unembedding products; with
    ``layer_top`` = K > 0, also ``"layer_top_ids"`` [c, L, K] long and ``"layer_top_probs"`` [c, L, K] float32:
    each layer's K most probable tokens (``metrics.layer_top``; layer L the model's own), from those products too;
    with ``quantities``, each of its fields (``metrics.layer_quantities``: the target trajectory, tracked ids,
    entropy, a caller's statistics) → [c, L] or [c, L, m], from each layer's same log-softmax.

    The unembedding runs on blocks of layers (one large product); the log-softmax then follows layer by layer,
    each straight before that layer's divergences, so its [c, V] is still warm in cache (on a CPU twice as fast
    as one log-softmax over the whole block first). ``compiled`` (without ``top_k``): each block through one fused
    kernel for the logit kinds and each layer's top-k (``metrics.fused.compiled_block``), cosine from the normed
    states. Each layer's top-k is selected on its logits by vocabulary blocks (``metrics.layer_top``): no pass of
    its own over the vocabulary but the block maxima.
    """
    # one fused kernel per block: its divergences and its layers' top-k (the per-layer quantities: the eager walk)
    if compiled and top_k is None and not quantities:
        return _compiled_kinds(chunk, kinds, rows, layer_top)
    final = chunk.final
    out: dict[str, torch.Tensor]  # the kinds, then other columns by name
    out = {kind: torch.zeros(len(chunk), chunk.n_layers, device=final.logprobs.device) for kind in kinds}
    if top_k is not None:
        out["topk"] = torch.ones(len(chunk), chunk.n_layers, dtype=torch.bool, device=final.logprobs.device)
    if layer_top:
        out.update(_final_layer_top(chunk, layer_top))
    if quantities:  # layer L's values fill every column first; earlier layers below
        for name, value in quantities.of_layer(final.logprobs, chunk.target_ids).items():
            out[name] = value.unsqueeze(1).repeat(1, chunk.n_layers, *[1] * (value.ndim - 1))
    for first, logits, normed in chunk.logit_blocks(rows):
        # each layer's top-k selected on the block's logits at once (by vocabulary blocks: one reduction), its
        # probabilities read below from the log-softmax the divergences take anyway: no softmax of its own
        top_ids = top_k_by_blocks(logits, layer_top)[1] if layer_top else None  # [k, c, K]
        for j in range(logits.shape[0]):
            if top_k is not None:
                out["topk"][:, first - 1 + j] = topk_agreement(final.logprobs, logits[j], top_k)
            logprobs = torch.log_softmax(logits[j], dim=-1)
            if top_ids is not None:
                ids, probs = top_k_probs(top_ids[j], logprobs)
                out["layer_top_ids"][:, first - 1 + j] = ids
                out["layer_top_probs"][:, first - 1 + j] = probs
            for kind in kinds:
                d = layer_divergence(kind, final.logprobs, logprobs, final.normed, normed[j])
                out[kind][:, first - 1 + j] = d
            if quantities:  # last: a caller's statistic sees the block after depthlens's own values are taken
                for name, value in quantities.of_layer(logprobs, chunk.target_ids).items():
                    out[name][:, first - 1 + j] = value
    return out


def _final_layer_top(chunk: ReadoutChunk, k: int) -> dict[str, torch.Tensor]:
    """Each layer's top-k table of a chunk, [c, L, K], with layer L's (the model's own distribution) filled in; the
    earlier layers are filled by the walk."""
    ids, probs = layer_top_k_of_logprobs(chunk.final.logprobs, k)  # [c, K]
    return {
        "layer_top_ids": ids[:, None].repeat(1, chunk.n_layers, 1),
        "layer_top_probs": probs[:, None].repeat(1, chunk.n_layers, 1),
    }


def _compiled_kinds(
    chunk: ReadoutChunk, kinds: Sequence[Divergence], rows: int, layer_top: int = 0
) -> dict[str, torch.Tensor]:
    final = chunk.final
    fusable = tuple(kind for kind in kinds if kind in FUSABLE)
    step = compiled_block(chunk.lens, fusable, layer_top) if fusable or layer_top else None
    out: dict[str, torch.Tensor]  # the kinds, then other columns by name
    out = {kind: torch.zeros(len(chunk), chunk.n_layers, device=final.logprobs.device) for kind in kinds}
    if layer_top:
        out.update(_final_layer_top(chunk, layer_top))
    for first, normed in chunk.normed_blocks(rows):
        span = slice(first - 1, first - 1 + normed.shape[0])
        if step is not None:
            values = step(normed, final.logprobs)  # [kinds, k, c], and with layer_top ids, probs [k, c, K]
            if layer_top:
                values, ids, probs = values
                out["layer_top_ids"][:, span] = ids.transpose(0, 1)
                out["layer_top_probs"][:, span] = probs.transpose(0, 1)
            for i, kind in enumerate(fusable):
                out[kind][:, span] = values[i].T
        for kind in kinds:
            if kind not in FUSABLE:
                out[kind][:, span] = layer_divergence(
                    kind, final.logprobs, final.logprobs, final.normed, normed.float()
                ).T
    return out


def chunk_settling(
    chunk: ReadoutChunk, kind: Divergence, g: float, last: int | None = None, compiled: bool = False
) -> torch.Tensor:
    """Settling depths c_t of one chunk with exact early exit: each layer is read out only for the tokens that
    have not settled below it, so a token costs c_t layer readouts instead of L − 1. [c] long.

    c_t is the first layer whose divergence is ≤ g (the cumulative minimum first reaches g there), so a token
    is done the moment one layer is ≤ g. With ``last`` < L − 1 the walk stops there and unsettled tokens get
    ``last + 1`` — exact for the deep flag when ``last`` = ⌈ρL⌉ − 1 (c_t ≥ ⌈ρL⌉ ⇔ not settled by then).
    Identical to ``settling_depth(chunk_divergences(chunk, kind), g)`` (tested). [c] long on the chunk's device.
    """
    n_layers = chunk.n_layers
    last = n_layers - 1 if last is None else min(last, n_layers - 1)
    final = chunk.final
    device = final.logprobs.device
    step = compiled_step(chunk.lens, kind) if compiled else None
    settling = torch.full((len(chunk),), last + 1, dtype=torch.long, device=device)
    active = torch.arange(len(chunk), device=device)
    final_logprobs, final_normed = final.logprobs, final.normed
    for layer in range(1, last + 1):
        if active.numel() == 0:
            break
        if step is not None:  # the kernel reads the active tokens' final rows itself: no [k, V] gather here
            d = step(chunk.normed_rows(layer, active), final.logprobs, active)
        else:
            logprobs, normed = chunk.layer_rows(layer, active)
            d = layer_divergence(kind, final_logprobs, logprobs, final_normed, normed)
        done = d <= g
        settling[active] = torch.where(done, layer, settling[active])  # no boolean index: no sync here
        # Compacting to the unsettled tokens needs their count: one device sync per layer, the price of early
        # exit (each later layer then reads only those). On a CPU, where a sync is free, the eager path's [k, V]
        # gather of the final rows is skipped on layers where nothing settled (most of them).
        if device.type != "cpu" or bool(done.any()):
            keep = ~done
            active = active[keep]
            if step is None:
                final_logprobs, final_normed = final_logprobs[keep], final_normed[keep]
    return settling


def chunk_tcb(
    chunk: ReadoutChunk,
    unembed: Unembedding,
    row_norms_sq: torch.Tensor,
    tcb: TCBConfig,
    compiled: bool = False,
) -> dict:
    """δ_TCB, V_eff, margin (and spectral δ) for one chunk's final states; each [c] float64 on the chunk's device.

    Beside the lens: where W is float32 the chunk's final log-probs are the float32 log-softmax of the very
    product δ_TCB needs, so it takes them instead of a product of its own (a reduced-precision model's own
    logits are rounded to its dtype: there z = W h is evaluated again in float32); ``compiled``: its elementwise
    half through one compiled step (``metrics.fused.compiled_tcb_softmax``)."""
    iterations = tcb.power_iterations if tcb.spectral else None
    shared = unembed.weight.dtype == torch.float32 and chunk.final.logprobs.dtype == torch.float32
    terms = token_constraint_terms(
        unembed,
        chunk.final.normed,
        row_norms_sq,
        tcb.epsilon,
        iterations,
        exact=tcb.exact,
        logprobs=chunk.final.logprobs if shared else None,
        **({"softmax": compiled_tcb_softmax()} if compiled else {}),
    )
    v_eff = terms["v_eff"] if tcb.v_eff == "ipr" else terms["v_eff_exp_entropy"]
    out = {"tcb": terms["tcb"], "v_eff": v_eff, "margin": terms["margin"]}
    if "tcb_spectral" in terms:
        out["tcb_spectral"] = terms["tcb_spectral"]
    return out


def _to_host(columns: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One device-to-host copy for all of a chunk's results: [c] and [c, L] columns packed into one float64
    [c, k] tensor (exact for float32 values and integer ids below 2^53), moved, and cut apart again."""
    parts = [v.double().reshape(v.shape[0], -1) for v in columns.values()]
    host = torch.cat(parts, dim=1).cpu()
    out, at = {}, 0
    for (key, value), part in zip(columns.items(), parts, strict=True):
        width = part.shape[1]
        out[key] = host[:, at : at + width].reshape(value.shape).to(value.dtype)
        at += width
    return out


@dataclasses.dataclass
class _ChunkTCB:
    """δ_TCB's terms of each chunk: one unembedding for every chunk, its row norms once per model."""

    cfg: TCBConfig
    compiled: bool
    unembed: Unembedding | None = None
    row_norms_sq: torch.Tensor | None = None

    def columns(self, chunk: ReadoutChunk) -> dict[str, torch.Tensor]:
        if self.unembed is None or self.row_norms_sq is None:
            self.unembed = Unembedding.from_lens(chunk.lens)
            dtype = torch.float64 if self.cfg.exact else torch.float32
            self.row_norms_sq = model_row_norms_sq(chunk.lens, self.unembed, dtype)
        terms = chunk_tcb(chunk, self.unembed, self.row_norms_sq, self.cfg, self.compiled)
        return {f"tcb:{k}": v for k, v in terms.items()}


def reduce_readout(
    chunks: Iterable[ReadoutChunk],
    n_sequences: int,
    n_layers: int,
    kind: Divergence,
    tcb: TCBConfig | None = None,
    settle_at: float | None = None,
    compiled: bool = False,
    rows: int = 0,
    top_k: int | None = None,
    layer_top: int = 0,
    quantities: LayerQuantities | None = None,
) -> list[TokenTable]:
    """Collect the chunks of ``n_sequences`` sequences into one TokenTable each (empty when no chunk came).

    With ``settle_at`` = g, only settling depths are found, by exact early exit (``chunk_settling``): no
    divergence table, each token read out up to its settling layer only. ``compiled``: the fused kernel per layer.
    ``rows``: the eager divergence table unembeds blocks of layers of about that many token-layer rows (a chunk
    shorter than ``rows`` then gets one large product for several layers instead of one small one per layer).
    Every per-layer and per-term result stays on the device until its chunk is done, then crosses to the host in
    one copy. ``top_k``: settle by the ``topk:K`` rule instead (the divergence table is still kept; ``settle_at``
    must then be None). ``layer_top`` = K > 0: each layer's K most probable tokens too (``settle_at`` must then be
    None: every layer is read), from the walk's own unembedding products (inside the fused kernel where compiled).
    ``quantities``: the per-layer quantities (``metrics.layer_quantities``) from the eager walk's products. A chunk
    that carries kept residual streams (``ReadoutChunk.kept``) gives them to its table's ``hidden``.
    """
    if (layer_top or quantities) and settle_at is not None:
        raise ValueError(
            "reduce_readout: per-layer fields read every layer; early exit (settle_at) reads fewer"
        )
    parts: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(n_sequences)]
    tcb_terms = _ChunkTCB(tcb, compiled) if tcb is not None else None
    for chunk in chunks:
        base = token_baselines(chunk.final.logprobs, chunk.target_ids)
        columns = {
            "nonfinite": chunk.nonfinite,
            "ids": chunk.target_ids,
            **{k: base[k] for k in ("log_prob", "entropy", "self_certainty")},
        }
        if top_k is not None or layer_top or quantities:
            walked = chunk_divergence_kinds(chunk, (kind,), rows, top_k, compiled, layer_top, quantities)
            columns.update(second=walked.pop(kind), **walked)
        elif settle_at is None:
            columns["second"] = chunk_divergences(chunk, kind, rows, compiled=compiled)
        else:
            columns["second"] = chunk_settling(chunk, kind, settle_at, compiled=compiled)
        if tcb_terms is not None:
            columns.update(tcb_terms.columns(chunk))
        host = _to_host(columns)
        check_finite(host.pop("nonfinite"), chunk.start)
        check_finite_stats(host)
        if chunk.kept is not None:  # the residual streams asked for: float32, their own copy
            host["hidden"] = chunk.kept.float().cpu()
        parts[chunk.seq_index].append(host)
    return [_joined_table(seq_parts, n_layers, settle_at, top_k) for seq_parts in parts]


def _joined_table(
    seq_parts: list[dict[str, torch.Tensor]], n_layers: int, settle_at: float | None, top_k: int | None
) -> TokenTable:
    """One sequence's chunks (``reduce_readout``'s host columns) joined into its TokenTable."""
    if not seq_parts:
        return TokenTable.empty(n_layers)
    joined = {k: torch.cat([p[k] for p in seq_parts]) for k in seq_parts[0]}
    tcb_columns = {k.removeprefix("tcb:"): v for k, v in joined.items() if k.startswith("tcb:")}
    baselines = (joined["log_prob"], joined["entropy"], joined["self_certainty"])
    top: dict[str, Any] = {k: joined[k] for k in ("layer_top_ids", "layer_top_probs") if k in joined}
    top["layer_values"] = {k: v for k, v in joined.items() if is_per_layer(k)}
    top["hidden"] = joined.get("hidden")
    if top_k is not None:
        settling = topk_settling_depth(joined["topk"])
        return TokenTable(joined["ids"], joined["second"], *baselines, tcb_columns, settling=settling, **top)
    if settle_at is None:
        return TokenTable(joined["ids"], joined["second"], *baselines, tcb_columns, **top)
    return TokenTable(
        joined["ids"], None, *baselines, tcb_columns, settling=joined["second"], hidden=top["hidden"]
    )


def sequence_scores(table: TokenTable, dtr: DTRConfig, n_layers: int) -> dict[str, Any]:
    """DTR, mean settling depth and the six baselines for one sequence, plus per-token settling and deep flags."""
    if (
        table.settling is not None
    ):  # early exit (at this g: the caller passes dtr.g) or the topk rule found them
        settling = table.settling
    elif table.n_tokens and table.divergence is not None:
        settling = settling_depth(table.divergence, dtr.g)
    else:
        settling = torch.zeros(0, dtype=torch.long)
    deep = deep_flags(settling, n_layers, dtr.rho, dtr.deep_rule)
    scores: dict[str, Any] = {
        "dtr": deep_thinking_ratio(deep),
        "mean_settling_depth": mean_settling_depth(settling),
    }
    if dtr.dtr_prefix_tokens is not None:
        scores["dtr_prefix"] = deep_thinking_ratio(deep, dtr.dtr_prefix_tokens)
    scores.update(sequence_baselines(table.log_prob, table.entropy, table.self_certainty))
    scores["settling_depth"] = settling
    scores["deep"] = deep
    return scores


def tcb_summary(tcb: dict[str, torch.Tensor]) -> dict[str, float | None]:
    """Per-sequence TCB scores: mean and minimum δ_TCB, mean V_eff (None-valued for no tokens)."""
    if not tcb or tcb["tcb"].numel() == 0:
        return {"tcb_mean": None, "tcb_min": None, "v_eff_mean": None}
    summary: dict[str, float | None] = {
        "tcb_mean": float(tcb["tcb"].mean()),
        "tcb_min": float(tcb["tcb"].min()),
        "v_eff_mean": float(tcb["v_eff"].mean()),
    }
    if "tcb_spectral" in tcb:
        summary["tcb_spectral_mean"] = float(tcb["tcb_spectral"].mean())
    return summary
