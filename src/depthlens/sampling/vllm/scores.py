"""Per-token entropy, self-certainty and DeepConf confidence taken inside vLLM, from the logits it samples from.

A vLLM (V1 model runner) logits processor that alters nothing: for each row of the batch that belongs to a
depthlens request (``SamplingParams.extra_args["depthlens"]`` names it) it reads the raw, untempered logits,
computes the scores with the very functions ``HFGenerator`` uses (``metrics.baselines``), and keeps them by
request and token position. ``drain`` collects them through ``LLMEngine.collective_rpc``, so it works whether the
engine runs in this process or in worker processes. log p of the sampled token comes from vLLM's own
``logprobs=0`` output (also raw log-probabilities), so every per-token field is read off the engine's forward
pass and no token is fed twice.

Position bookkeeping: a row's position is the length of its request's output-token list when the logits are
seen (vLLM appends async-scheduling placeholders to that list, so it stays exact). A partly prefilled prompt
(chunked prefill) also yields logits whose sample is thrown away; its scores land on position 0 and are
overwritten by the step that really samples token 0 — the last write of a position wins.

This module imports vllm at the top: the engine, generator and session modules import it inside the functions that
run once vllm is chosen.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from depthlens.metrics.baselines import distribution_scores
from depthlens.sampling.backend import PER_TOKEN

TAG = "depthlens"  # extra_args key: the request's name in the scores
TOP_K = "depthlens_confidence_top_k"  # extra_args key: k of DeepConf's confidence
FIELDS = PER_TOKEN[1:]  # entropy, self-certainty, confidence; log p is vLLM's own logprobs output

Scores = dict[int, tuple[float, float, float]]  # token position → (entropy, self-certainty, confidence)


class TokenScores(LogitsProcessor):
    """Records the distribution scores of depthlens's requests at every step; returns the logits unchanged."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[str, int, list[int]]] = {}  # batch row → (tag, top k, output token ids)
        self.scores: dict[str, Scores] = {}

    def is_argmax_invariant(self) -> bool:
        # False puts it among the processors applied to the raw float32 logits, before temperature.
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_row(params: Any, _prompt: Any, output_ids: list[int]) -> tuple[str, int, list[int]] | None:
            extra = params.extra_args or {}
            return (extra[TAG], int(extra[TOP_K]), output_ids) if TAG in extra else None

        process_dict_updates(self.rows, batch_update, new_row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        by_k: dict[int, list[int]] = {}
        for row in sorted(self.rows):
            if row < logits.shape[0]:
                by_k.setdefault(self.rows[row][1], []).append(row)
        for k, rows in by_k.items():
            logprobs = torch.log_softmax(logits[rows].float(), dim=-1)  # [r, V]
            values = distribution_scores(logprobs, k)
            columns = list(zip(*(values[f].tolist() for f in FIELDS), strict=True))
            for row, value in zip(rows, columns, strict=True):
                tag, _, output_ids = self.rows[row]
                self.scores.setdefault(tag, {})[len(output_ids)] = value
        return logits

    def take(self, tags: list[str]) -> dict[str, Scores]:
        """The scores recorded for ``tags``, forgotten here."""
        return {tag: self.scores.pop(tag, {}) for tag in tags}


def _take_from_worker(worker: Any, tags: list[str]) -> dict[str, Scores] | None:
    """Runs on each vLLM worker: the scores its ``TokenScores`` recorded for ``tags`` (None if it has none)."""
    batch = getattr(getattr(worker, "model_runner", None), "input_batch", None)
    processors = getattr(getattr(batch, "logitsprocs", None), "non_argmax_invariant", [])
    found = [p for p in processors if isinstance(p, TokenScores)]
    return found[0].take(tags) if found else None


def drain(engine: Any, tags: list[str]) -> dict[str, Scores]:
    """Collect (and forget) the scores of ``tags`` from the engine's workers; tensor-parallel ranks all see the
    same gathered logits, so the first worker that has a ``TokenScores`` answers."""
    for result in engine.collective_rpc(_take_from_worker, args=(tags,)):
        if result is not None:
            return result
    raise RuntimeError("the vLLM engine has no depthlens TokenScores logits processor")


def registered(engine: Any) -> bool:
    """Whether ``engine`` was started with ``TokenScores`` among its logits processors."""
    config = getattr(engine, "vllm_config", None) or getattr(engine, "model_config", None)
    model_config = getattr(config, "model_config", config)
    return TokenScores in (getattr(model_config, "logits_processors", None) or ())
