"""The logit lens over vLLM's own modules, and the readout of captured rows with depthlens's metric functions.

Runs inside the engine's worker, on states the capture (``capture``) took from the engine's forward pass.
``EngineLens`` is a ``LogitLens`` whose norm is the model's own final norm module and whose unembedding is the
model's own ``compute_logits`` (``ParallelLMHead`` + ``LogitsProcessor``: the tensor-parallel gather, the padded
vocabulary cut, soft-capping and logit scaling, exactly as the engine applies them to what it samples from).
The divergences, their layer blocks and their log-softmax are ``metrics.token_table.chunk_divergence_kinds`` on
a ``ReadoutChunk`` — the very code the transformers samplers and ``score`` run — so the two backends differ only
in where the states come from — each layer's top-k tokens (``layer_top``, ``metrics.layer_top``) included, taken
from the same unembedding products as the divergences.

No vllm import: the model and its modules are passed in.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import nn

from depthlens.config import Divergence
from depthlens.metrics.baselines import token_baselines
from depthlens.metrics.layer_quantities import LayerQuantities
from depthlens.metrics.token_table import chunk_divergence_kinds
from depthlens.readout.lens import LogitLens, TranslatedLens
from depthlens.readout.stream import LayerReadout, ReadoutChunk, first_nonfinite

BASELINES = ("log_prob", "entropy", "self_certainty")  # per-token final-layer fields of a prefill readout


class EngineLens(LogitLens):
    """``LogitLens`` over a vLLM model: its final norm module and its ``compute_logits``."""

    def __init__(
        self,
        norm: nn.Module,
        compute_logits: Callable[[torch.Tensor], torch.Tensor | None],
        vocab_size: int | None = None,
        final_norm: bool = True,
    ) -> None:
        # parts stays None: nothing here reads the transformers modules (TCB is not computed in the engine).
        self.parts = None  # type: ignore[assignment]  # no transformers modules in the engine
        self.norm = norm
        self.compute_logits = compute_logits
        self.vocab_size = vocab_size
        self.apply_norm = final_norm

    def normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """norm(h) for residual states [..., d]; vLLM's norms take [tokens, d], so leading axes are flattened."""
        if not self.apply_norm:
            return hidden
        flat = hidden.reshape(-1, hidden.shape[-1]).contiguous()
        out = self.norm(flat)
        out = out[0] if isinstance(out, tuple) else out  # a fused add-norm returns (normed, residual)
        return out.reshape(hidden.shape)

    def logits_from_normed(self, normed: torch.Tensor) -> torch.Tensor:
        """post(W_U · x) as float32 [..., V]: ``compute_logits`` already applies post (soft-cap, scale)."""
        flat = normed.reshape(-1, normed.shape[-1]).contiguous()
        logits = self.compute_logits(flat)
        if logits is None:  # a tensor-parallel rank that gathers to another one (not vLLM's default)
            raise RuntimeError(
                "compute_logits returned no logits on this rank; the lens needs all-gathered logits"
            )
        if self.vocab_size is not None:
            logits = logits[..., : self.vocab_size]
        return logits.float().reshape(*normed.shape[:-1], logits.shape[-1])

    def final_logits(self, model_logits: torch.Tensor) -> torch.Tensor:
        if self.vocab_size is not None:
            model_logits = model_logits[..., : self.vocab_size]
        return model_logits.float()


class EngineTunedLens(EngineLens):
    """``EngineLens`` after a fitted lens's pre-norm matrices (``weight`` [L−1, d, d], ``bias`` [L−1, d] or None —
    the Jacobian lens has none —, float32, on the states' device): layer l is read from W_l h (+ b_l), with
    ``TranslatedLens``'s own arithmetic, so the engine and the transformers readout translate alike."""

    def __init__(
        self,
        norm: nn.Module,
        compute_logits: Callable[[torch.Tensor], torch.Tensor | None],
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        vocab_size: int | None = None,
        final_norm: bool = True,
    ) -> None:
        super().__init__(norm, compute_logits, vocab_size, final_norm)
        self.weight, self.bias = weight, bias

    translate = TranslatedLens.translate
    translate_block = TranslatedLens.translate_block


class Float32Head:
    """The model's final norm and unembedding in float32, for a lens on lower-precision weights: a float32 copy of
    the norm module and of this rank's unembedding shard, then the engine's own gather, vocabulary cut and logit
    post-processing (``LogitsProcessor``: soft-cap, scale). Costs V × d × 4 bytes per rank (its shard)."""

    def __init__(self, model: nn.Module, norm: nn.Module) -> None:
        head, post = getattr(model, "lm_head", None), getattr(model, "logits_processor", None)
        if head is None or post is None:
            raise RuntimeError(f"{type(model).__name__} has no lm_head / logits_processor for a float32 lens")
        self.norm = copy.deepcopy(norm).float()
        self.weight = head.weight.detach().float()
        self.tp_size = getattr(head, "tp_size", 1)
        self.post = post

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        logits = torch.nn.functional.linear(normed.float(), self.weight)
        if self.tp_size > 1:
            logits = self.post._gather_logits(logits)  # all ranks join, as in LogitsProcessor._get_logits
        logits = logits[..., : self.post.org_vocab_size]
        if self.post.soft_cap is not None:
            logits = torch.tanh(logits / self.post.soft_cap) * self.post.soft_cap
        return logits * self.post.scale if self.post.scale != 1.0 else logits


@dataclasses.dataclass
class RowsRead:
    """What ``read_rows`` read out of c positions."""

    values: torch.Tensor  # [c, kinds, L] float32 divergences (column L − 1 is 0), NaN rows where not finite
    base: torch.Tensor | None = None  # [c, 3]: final-layer log p, entropy, self-certainty (given targets)
    top_ids: torch.Tensor | None = None  # [c, L, K] int32: each layer's top-k (given top_k)
    top_probs: torch.Tensor | None = None  # [c, L, K] float32: their probabilities
    per_layer: dict[str, torch.Tensor] | None = (
        None  # the per-layer quantities (given them): [c, L] or [c, L, m]
    )


def read_rows(
    lens: EngineLens,
    hidden: Sequence[torch.Tensor],
    final_normed: torch.Tensor,
    kinds: Sequence[Divergence],
    rows: int,
    targets: torch.Tensor | None = None,
    top_k: int = 0,
    quantities: LayerQuantities | None = None,
    read_targets: torch.Tensor | None = None,
) -> RowsRead:
    """Divergence rows of c positions: [c, kinds, L] float32 (column L − 1 is 0), NaN rows where a state is not
    finite (``first_nonfinite`` says where; the driver raises, naming the token); given the tokens the
    positions predict (``targets`` [c]), their final-layer log p, entropy and self-certainty [c, 3]; given
    ``top_k`` ≥ 1, each layer's K most probable tokens and their probabilities, from the same logits; given
    ``quantities``, the per-layer quantities (``metrics.layer_quantities``) of the tokens read out
    (``read_targets`` [c]: a prompt's next token, or the token the engine sampled there; default ``targets``).

    ``hidden``: L − 1 residual states [c, d] after blocks 1..L−1; ``final_normed``: the model's own normed last
    state [c, d], whose ``compute_logits`` is the distribution the engine samples from.
    """
    n_layers = len(hidden) + 1
    final_logits = lens.logits_from_normed(final_normed)
    bad = first_nonfinite((*hidden, final_logits))
    final_logprobs = torch.log_softmax(final_logits, dim=-1)
    read = read_targets if read_targets is not None else targets
    chunk = ReadoutChunk(
        seq_index=0,
        start=0,
        target_ids=(
            read.to(final_logprobs.device).long()
            if read is not None
            else torch.zeros(final_normed.shape[0], dtype=torch.long, device=final_logprobs.device)
        ),
        final=LayerReadout(n_layers, final_logprobs, final_normed.float()),
        lens=lens,
        _hidden=tuple(hidden),
        nonfinite=bad,
    )
    tables = chunk_divergence_kinds(chunk, kinds, rows, layer_top=top_k, quantities=quantities)
    out = RowsRead(torch.stack([tables[k] for k in kinds], dim=1))
    out.values[bad > 0] = float("nan")
    if top_k:  # int32 ids: half the worker's memory of int64, until the driver takes them
        out.top_ids, out.top_probs = tables["layer_top_ids"].to(torch.int32), tables["layer_top_probs"]
    if quantities:
        out.per_layer = {name: tables[name] for name in quantities.fields()}
    if targets is not None:
        base = token_baselines(final_logprobs, targets.to(final_logprobs.device))
        out.base = torch.stack([base[k].float() for k in BASELINES], dim=1)
    return out


def walk_collectives(
    lens: EngineLens, hidden: Sequence[torch.Tensor], final_normed: torch.Tensor, rows: int
) -> None:
    """What a tensor-parallel rank other than 0 runs instead of ``read_rows``: the same ``compute_logits`` calls
    with the same shapes (each is a collective every rank must join), and none of the divergence arithmetic."""
    lens.logits_from_normed(final_normed)
    chunk = ReadoutChunk(
        seq_index=0,
        start=0,
        target_ids=torch.zeros(final_normed.shape[0], dtype=torch.long),
        final=LayerReadout(len(hidden) + 1, final_normed[:, :0], final_normed),
        lens=lens,
        _hidden=tuple(hidden),
        nonfinite=torch.zeros(final_normed.shape[0], dtype=torch.long, device=final_normed.device),
    )
    for _ in chunk.logit_blocks(rows):
        pass
