"""Reduce a readout stream to per-token tables and per-sequence scores. Pure: no I/O, no model calls.

The only tensors kept per sequence are [T, L] divergences and a few [T] vectors; the vocab-sized log-probs of
each chunk are consumed and dropped as the stream advances.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from depthlens.config import Divergence, DTRConfig, TCBConfig
from depthlens.metrics.baselines import sequence_baselines, token_baselines
from depthlens.metrics.divergence import layer_divergence
from depthlens.metrics.dtr import deep_flags, deep_thinking_ratio, mean_settling_depth, settling_depth
from depthlens.metrics.tcb import Unembedding, token_constraint_terms
from depthlens.readout.stream import ReadoutChunk

TCB_FIELDS = ("tcb", "v_eff", "margin", "tcb_spectral")  # per-token TCB columns, when asked for


@dataclasses.dataclass(frozen=True)
class TokenTable:
    """Everything per completion token of one sequence."""

    target_ids: torch.Tensor  # [T] long
    divergence: torch.Tensor  # [T, L] float32; column L − 1 is 0
    log_prob: torch.Tensor  # [T] log p_L(y_t), nats
    entropy: torch.Tensor  # [T] H(p_L), nats
    self_certainty: torch.Tensor  # [T] KL(U ‖ p_L), nats
    tcb: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # TCB_FIELDS present → [T] float64

    @property
    def n_tokens(self) -> int:
        return int(self.target_ids.numel())

    @staticmethod
    def empty(n_layers: int) -> TokenTable:
        zeros = torch.zeros(0)
        return TokenTable(torch.zeros(0, dtype=torch.long), torch.zeros(0, n_layers), zeros, zeros, zeros, {})


def chunk_divergences(chunk: ReadoutChunk, kind: Divergence, rows: int = 0) -> torch.Tensor:
    """D_{t,l} for one chunk, [c, L], reading its layers in blocks of about ``rows`` token-layer rows
    (0: one layer at a time)."""
    out = torch.zeros(len(chunk), chunk.n_layers)
    final = chunk.final
    for first, logprobs, normed in chunk.layer_blocks(rows):
        for j in range(logprobs.shape[0]):  # layer by layer: each [c, V] slice stays in cache
            d = layer_divergence(kind, final.logprobs, logprobs[j], final.normed, normed[j])
            out[:, first - 1 + j] = d.cpu()
    return out


def chunk_tcb(chunk: ReadoutChunk, unembed: Unembedding, row_norms_sq: torch.Tensor, tcb: TCBConfig) -> dict:
    """δ_TCB, V_eff, margin (and spectral δ) for one chunk's final states; each [c] float64 on the CPU."""
    iterations = tcb.power_iterations if tcb.spectral else None
    terms = token_constraint_terms(unembed, chunk.final.normed, row_norms_sq, tcb.epsilon, iterations)
    v_eff = terms["v_eff"] if tcb.v_eff == "ipr" else terms["v_eff_exp_entropy"]
    out = {"tcb": terms["tcb"], "v_eff": v_eff, "margin": terms["margin"]}
    if "tcb_spectral" in terms:
        out["tcb_spectral"] = terms["tcb_spectral"]
    return {k: v.cpu() for k, v in out.items()}


def reduce_readout(
    chunks: Iterable[ReadoutChunk],
    n_sequences: int,
    n_layers: int,
    kind: Divergence,
    tcb: TCBConfig | None = None,
) -> list[TokenTable]:
    """Collect the chunks of ``n_sequences`` sequences into one TokenTable each (empty when no chunk came)."""
    parts: list[list[tuple[torch.Tensor, ...]]] = [[] for _ in range(n_sequences)]
    tcb_parts: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(n_sequences)]
    unembed, row_norms_sq = None, None
    for chunk in chunks:
        base = token_baselines(chunk.final.logprobs, chunk.target_ids)
        parts[chunk.seq_index].append(
            (
                chunk.target_ids.cpu(),
                chunk_divergences(chunk, kind),
                base["log_prob"].cpu(),
                base["entropy"].cpu(),
                base["self_certainty"].cpu(),
            )
        )
        if tcb is not None:
            if unembed is None:  # the same unembedding for every chunk: row norms once per call
                unembed = Unembedding.from_lens(chunk.lens)
                row_norms_sq = unembed.row_norms_sq()
            tcb_parts[chunk.seq_index].append(chunk_tcb(chunk, unembed, row_norms_sq, tcb))
    tables = []
    for seq_parts, seq_tcb in zip(parts, tcb_parts, strict=True):
        if not seq_parts:
            tables.append(TokenTable.empty(n_layers))
            continue
        columns = [torch.cat(col) for col in zip(*seq_parts, strict=True)]
        tcb_columns = {k: torch.cat([p[k] for p in seq_tcb]) for k in seq_tcb[0]} if seq_tcb else {}
        tables.append(TokenTable(*columns, tcb_columns))
    return tables


def sequence_scores(table: TokenTable, dtr: DTRConfig) -> dict[str, Any]:
    """DTR, mean settling depth and the six baselines for one sequence, plus per-token settling and deep flags."""
    n_layers = table.divergence.shape[1]
    settling = settling_depth(table.divergence, dtr.g) if table.n_tokens else torch.zeros(0, dtype=torch.long)
    deep = deep_flags(settling, n_layers, dtr.rho, dtr.deep_rule)
    scores: dict[str, Any] = {
        "n_tokens": table.n_tokens,
        "dtr": deep_thinking_ratio(deep),
        "mean_settling_depth": mean_settling_depth(settling),
    }
    if dtr.prefix is not None:
        scores["dtr_prefix"] = deep_thinking_ratio(deep, dtr.prefix)
    scores.update(sequence_baselines(table.log_prob, table.entropy, table.self_certainty))
    scores["settling_depth"] = settling
    scores["deep"] = deep
    return scores


def tcb_summary(tcb: dict[str, torch.Tensor]) -> dict[str, float | None]:
    """Per-sequence TCB scores: mean and minimum δ_TCB, mean V_eff (None-valued for no tokens)."""
    if not tcb or tcb["tcb"].numel() == 0:
        return {"tcb_mean": None, "tcb_min": None, "v_eff_mean": None}
    summary = {
        "tcb_mean": float(tcb["tcb"].mean()),
        "tcb_min": float(tcb["tcb"].min()),
        "v_eff_mean": float(tcb["v_eff"].mean()),
    }
    if "tcb_spectral" in tcb:
        summary["tcb_spectral_mean"] = float(tcb["tcb_spectral"].mean())
    return summary
