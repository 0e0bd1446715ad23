"""The ``depthlens`` object of a choice: a response's depth and its baselines, computed by ``metrics`` from its
``Trace`` (docs/serve.md lists the fields; docs/definitions.md §2–3 defines them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from depthlens.config import DTRConfig
from depthlens.metrics.baselines import sequence_baselines
from depthlens.metrics.dtr import deep_thinking_ratio, mean_settling_depth, settling_and_deep
from depthlens.models.tokens import layer_top_texts, token_bytes
from depthlens.sampling.backend import Trace
from depthlens.voting.methods import TRACE_SCORES, trace_confidence

PER_TOKEN_FIELDS = ("log_prob", "entropy", "self_certainty", "confidence")


def readout_columns(rows: Sequence[Sequence[float]], n_layers: int, dtr: DTRConfig) -> dict[str, list]:
    """Settling depth, deep flag and divergence row of each read-out token."""
    settle, deep = settling_and_deep(rows, n_layers, dtr)
    return {"settling_depth": settle.tolist(), "deep": deep.tolist(), "divergence": [list(r) for r in rows]}


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token's text: the UTF-8 of the bytes it stands for (a character split across tokens shows as U+FFFD
    in each piece, as the ``bytes`` of ``logprobs`` show it whole); "" for a special token (end of turn)."""
    if tokenizer is None:
        return ["" for _ in ids]
    return [piece.decode("utf-8", errors="replace") for piece in token_bytes(tokenizer, ids)]


def token_columns(trace: Trace, start: int, end: int, tokenizer: Any = None) -> dict[str, Any]:
    """The final-layer values of tokens ``start``..``end`` (nats), with their ids and strings."""
    ids = trace.token_ids[start:end]
    return {
        "token_ids": ids,
        "token_strings": token_strings(tokenizer, ids),
        **{k: getattr(trace, k)[start:end] for k in PER_TOKEN_FIELDS},
    }


def summary(
    trace: Trace, n_layers: int, dtr: DTRConfig, window: int, tokens: bool, tokenizer: Any = None
) -> dict[str, Any]:
    """DTR (over the read-out tokens and over the first ℓ), mean settling depth and every baseline of ``trace``;
    with ``tokens``, the per-token values too (their strings by ``tokenizer``). ``window``: DeepConf's group size
    for its trace scores."""
    rows = trace.divergence
    settle, deep = settling_and_deep(rows, n_layers, dtr)
    baselines = sequence_baselines(
        torch.tensor(trace.log_prob, dtype=torch.float64),
        torch.tensor(trace.entropy, dtype=torch.float64),
        torch.tensor(trace.self_certainty, dtype=torch.float64),
    )
    confidence = np.asarray(trace.confidence, dtype=np.float64)
    out: dict[str, Any] = {
        "dtr": deep_thinking_ratio(deep),
        "dtr_prefix": deep_thinking_ratio(deep, dtr.dtr_prefix_tokens),
        "prefix": dtr.dtr_prefix_tokens,
        "readout_tokens": len(rows),
        "mean_settling_depth": mean_settling_depth(settle),
        "deep_tokens": int(deep.sum()),
        **baselines,
        "confidence": float(confidence.mean()) if len(confidence) else None,
        "deepconf": {
            k: (trace_confidence(confidence, k, window) if len(confidence) else None) for k in TRACE_SCORES
        },
        "seed": trace.seed,
    }
    if tokens:
        columns = {
            "settling_depth": settle.tolist(),
            "deep": deep.tolist(),
            "divergence": [list(r) for r in rows],
        }
        out["tokens"] = {
            **token_columns(trace, 0, len(trace), tokenizer),
            **columns,
            **layer_top(trace, tokenizer),
            **layer_values(trace),
        }
    return out


def layer_top(trace: Trace, tokenizer: Any = None, start: int = 0) -> dict[str, Any]:
    """Each read-out token's top-k per layer from read-out token ``start`` on (``depthlens.layer_top_k``),
    [T][L][K]: ids, probabilities and, where a tokenizer is at hand, the tokens as labels
    (``models.tokens.layer_top_texts``); none when not asked."""
    ids = trace.layer_top_ids[start:]
    if not ids:
        return {}
    out: dict[str, Any] = {"layer_top_ids": ids, "layer_top_probs": trace.layer_top_probs[start:]}
    if tokenizer is not None:
        out["layer_top_tokens"] = layer_top_texts(tokenizer, ids)
    return out


def layer_values(trace: Trace, start: int = 0) -> dict[str, list[Any]]:
    """The per-layer quantities a request asked for (``depthlens.layer_target`` / ``track`` / ``layer_entropy``),
    each read-out token's from read-out token ``start`` on: ``layer_target_logprobs`` / ``layer_target_ranks``
    [T][L], ``layer_track_logprobs`` / ``layer_track_ranks`` [T][L][M], ``layer_entropy`` [T][L] (natural log,
    nats; ranks 0 = the most probable); none when not asked."""
    return {field: rows[start:] for field, rows in trace.layer_values.items()}
