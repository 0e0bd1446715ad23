"""Stream per-layer distributions of completion tokens in bounded memory.

The sequence is fed through the model in segments that reuse the KV cache, so hidden states exist for one
segment at a time ([L+1, batch, segment, d]); each segment's completion positions are cut into token chunks and
each chunk is read out one layer at a time ([chunk, V] float32). Nothing ever holds a [layers × tokens × vocab]
tensor, and the working set is set by the memory budget (``budget_mb``), not by sequence length or depth.

Position i's hidden state predicts token i + 1, so completion token k (at index P + k, P = prompt length) is read
out at position P + k − 1. Batches are right-padded: with causal attention no real token sees a pad, so no
attention mask is needed and position ids stay 0..n−1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from depthlens.config import ReadoutConfig
from depthlens.errors import InputError, NonFiniteError, named
from depthlens.models.load import LoadedModel
from depthlens.readout.lens import LogitLens

MAX_SEGMENT = 256  # positions per forward segment on a CPU; large enough that the forward stays matmul-bound
MAX_SEGMENT_CUDA = 4096  # on a GPU: a 256-position segment leaves its chunks (≤ segment) too small to fill it
CPU_BUDGET_MB = 512  # the readout's working set on a CPU (and inside a vLLM engine, which owns its device)
CUDA_BUDGET_SHARE = 0.25  # on a GPU: this share of the memory free when the run starts ...
CUDA_BUDGET_CAP_MB = 16384  # ... at most this (chunks of ~2,000 tokens at a 150k vocabulary)
# Each layer's top-k (ReadoutConfig.layer_top_k), per token, layer and k, at a chunk's peak: ids int64 and
# probabilities float32 (12 B), both widened to float64 for the chunk's one host copy (16 B) and concatenated (16 B).
LAYER_TOP_BYTES = 44
# Each per-layer value (the target trajectory, a tracked id's log-probability and rank, the entropy), per token and
# layer at a chunk's peak: int64 or float32 (8 B), widened to float64 for the host copy (8 B) and concatenated (8 B).
PER_LAYER_BYTES = 24


@dataclasses.dataclass(frozen=True)
class TokenSequence:
    """One record's token ids: the prompt (context) and the completion (the tokens that are scored)."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]


@dataclasses.dataclass(frozen=True)
class LayerReadout:
    """One layer's view of a chunk of completion tokens."""

    layer: int  # 1..L
    logprobs: torch.Tensor  # [c, V] float32, log p_{t,l}
    normed: torch.Tensor  # [c, d] norm(h_{t,l}), for the cosine divergence


@dataclasses.dataclass(frozen=True)
class ReadoutChunk:
    """Consecutive completion tokens of one sequence with the final distribution and lazy earlier layers."""

    seq_index: int  # index in the batch passed to ``iter_readout``
    start: int  # completion index of the first token here
    target_ids: torch.Tensor  # [c] the completion tokens these positions predict
    final: LayerReadout  # layer L: the model's own output distribution
    lens: LogitLens
    _hidden: tuple[torch.Tensor, ...]  # L − 1 raw residual states, each [c, d]
    nonfinite: (
        torch.Tensor
    )  # [c] long: each row's first non-finite layer (1-based), 0 if none; checked by the
    # consumer once its results are on the host (``check_finite``), so the check costs no sync of its own
    kept: torch.Tensor | None = (
        None  # [c, k, d]: the residual streams of the layers asked for (``keep_layers``)
    )

    @property
    def n_layers(self) -> int:
        return self.final.layer

    def __len__(self) -> int:
        return int(self.target_ids.shape[0])

    def head(self, k: int) -> ReadoutChunk:
        """The chunk's first ``k`` tokens (a readout window that ends inside the chunk)."""
        final = LayerReadout(self.final.layer, self.final.logprobs[:k], self.final.normed[:k])
        return dataclasses.replace(
            self,
            target_ids=self.target_ids[:k],
            final=final,
            _hidden=tuple(h[:k] for h in self._hidden),
            nonfinite=self.nonfinite[:k],
            kept=None if self.kept is None else self.kept[:k],
        )

    @torch.inference_mode()
    def layers(self, first: int = 1, last: int | None = None) -> Iterator[LayerReadout]:
        """Layers ``first``..``last`` (default L − 1) read out one at a time; only one [c, V] lives per step."""
        for layer, logprobs, normed in self.layer_blocks(0, first, last):  # rows = 0: one layer per block
            yield LayerReadout(layer, logprobs[0], normed[0])

    @torch.inference_mode()
    def layer_blocks(
        self, rows: int, first: int = 1, last: int | None = None
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """Layers ``first``..``last`` read out k = max(1, rows // c) at a time: (first layer of the block,
        log-probs [k, c, V], normed states [k, c, d]).

        One unembedding product per block: a small chunk (a generation step's batch) then streams W_U from
        memory once per block instead of once per layer, which on a CPU is ~4× faster. ``rows`` bounds the
        block's [k·c, V] tensors; rows ≤ c is one layer per block, as ``layers``.
        """
        for lo, logits, normed in self.logit_blocks(rows, first, last):
            yield lo, torch.log_softmax(logits, dim=-1), normed

    @torch.inference_mode()
    def logit_blocks(
        self, rows: int, first: int = 1, last: int | None = None
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """As ``layer_blocks``, with the lens logits [k, c, V] float32 in place of their log-softmax."""
        for lo, normed in self.normed_blocks(rows, first, last):
            yield lo, self.lens.logits_from_normed(normed), normed.float()

    @torch.inference_mode()
    def normed_blocks(
        self, rows: int, first: int = 1, last: int | None = None
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """As ``logit_blocks``, the normed states [k, c, d] only (model dtype): what a compiled block reads."""
        last = self.n_layers - 1 if last is None else last
        per_block = max(1, rows // max(1, len(self)))
        for lo in range(first, last + 1, per_block):
            hi = min(lo + per_block, last + 1)
            yield lo, self.lens.normed_block(torch.stack(self._hidden[lo - 1 : hi - 1]), lo)

    @torch.inference_mode()
    def normed_rows(self, layer: int, index: torch.Tensor | None = None) -> torch.Tensor:
        """norm(h_l) of layer ``layer`` (1..L−1), for the tokens at ``index`` (default all): [k, d], model dtype."""
        hidden = self._hidden[layer - 1]
        return self.lens.normed_at(hidden if index is None else hidden[index], layer)

    @torch.inference_mode()
    def layer_rows(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer`` (1..L−1) read out for the chunk's tokens at ``index`` only: (log-probs [k, V],
        normed states [k, d]). Early exit reads each layer for the tokens not yet settled, nothing more."""
        normed = self.normed_rows(layer, index)
        return torch.log_softmax(self.lens.logits_from_normed(normed), dim=-1), normed.float()


def first_nonfinite(layers: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per row, the first layer (1-based) whose state is NaN or infinite, else 0: [c] long, on the device.

    Computed without a sync: the caller moves it to the host with its other results and raises there
    (``check_finite``). Layers are scanned in order because a NaN spreads to every later layer and position."""
    bad = torch.stack([~torch.isfinite(values).all(dim=-1) for values in layers])  # [layers, c]
    return torch.where(bad.any(0), bad.int().argmax(0) + 1, 0)


def check_finite(nonfinite: Sequence[int] | torch.Tensor | np.ndarray, start: int) -> None:
    """Raise naming the first layer with a non-finite state and the first completion token (``start`` + row) in
    it, from a host copy of ``first_nonfinite`` (the earliest layer is where it began: from there it spreads,
    even to earlier positions, as NaN × 0 in attention)."""
    layers = [int(layer) for layer in nonfinite]
    bad = [layer for layer in layers if layer]
    if bad:
        row = layers.index(min(bad))
        raise NonFiniteError(
            f"non-finite hidden state at layer {layers[row]}, completion token {start + row}; the model "
            f"overflowed in this dtype — try {named('dtype')} float32"
        )


def lens_for(lm: LoadedModel, config: ReadoutConfig) -> LogitLens:
    """The lens of ``lm`` as ``config`` asks (``config.lens``: the logit lens, or a fitted lens — tuned, either
    form, or Jacobian — checked to fit ``lm``, ``readout.lenses.build``): padded vocabulary rows cut to the
    tokenizer's length."""
    vocab = config.vocab_size or (len(lm.tokenizer) if lm.tokenizer is not None else None)
    if config.lens.path is not None:
        from depthlens.readout.lenses import build

        return build(lm, config, vocab)
    return LogitLens(lm.parts, vocab_size=vocab, final_norm=config.final_norm)


def rows_chunk(
    lm: LoadedModel,
    lens: LogitLens,
    hidden_states: Sequence[torch.Tensor],
    model_logits: torch.Tensor,
    target_ids: torch.Tensor,
    seq_index: int = 0,
    start: int = 0,
    keep_layers: Sequence[int] = (),
) -> ReadoutChunk:
    """A readout chunk from one forward's outputs at some positions: L + 1 hidden states [c, d] (embeddings
    first, the model's last — possibly already normed — state last), its logits [c, V] and the tokens predicted;
    ``keep_layers``: the hidden states (0..L, as ``output_hidden_states`` numbers them) the chunk also carries as
    ``kept`` [c, k, d].

    The rows are consecutive positions of one sequence (``iter_readout``) or one position of each sequence of a
    batch (generation reads the step it samples from).
    """
    hidden = tuple(hidden_states[1:-1])
    final_logits = lens.final_logits(model_logits)
    last = hidden_states[-1]
    final_normed = last if lm.parts.last_hidden_normed else lens.normed(last)
    return ReadoutChunk(
        seq_index=seq_index,
        start=start,
        target_ids=target_ids,
        final=LayerReadout(lm.n_layers, torch.log_softmax(final_logits, -1), final_normed.float()),
        lens=lens,
        _hidden=hidden,
        nonfinite=first_nonfinite((*hidden, final_logits)),
        kept=torch.stack([hidden_states[i] for i in keep_layers], dim=1) if keep_layers else None,
    )


def budget_mb(config: ReadoutConfig, device: torch.device | None = None) -> int:
    """The readout's memory budget in MB: ``config.memory_mb`` when set; else ``CPU_BUDGET_MB`` on a CPU (or no
    device given), and on CUDA ``CUDA_BUDGET_SHARE`` of the free memory, at most ``CUDA_BUDGET_CAP_MB``."""
    if config.memory_mb is not None:
        return config.memory_mb
    if device is None or device.type != "cuda":
        return CPU_BUDGET_MB
    free, _ = torch.cuda.mem_get_info(device)
    return max(CPU_BUDGET_MB, min(CUDA_BUDGET_CAP_MB, int(free * CUDA_BUDGET_SHARE) // 2**20))


def chunk_sizes(
    config: ReadoutConfig,
    vocab: int,
    hidden: int,
    n_layers: int,
    batch: int,
    device: torch.device | None = None,
) -> tuple[int, int]:
    """(segment tokens per forward, tokens per readout chunk) that fit the budget (``budget_mb``).

    A readout chunk has about twelve [c, V] float32 tensors alive at its peak (final and layer log-probs, the
    divergence's temporaries) and, with ``layer_top_k`` = K, each layer's top-k ([c, L, K]: ``LAYER_TOP_BYTES``
    a cell), and the per-layer values asked for (``PER_LAYER_BYTES`` each; a caller's statistics are not counted);
    a forward segment holds [batch, S, V] logits and L + 1 hidden states. Segments are
    capped at ``MAX_SEGMENT`` positions (``MAX_SEGMENT_CUDA`` on a GPU) because attention's working set also grows
    with the segment length.
    """
    budget = budget_mb(config, device) * 2**20
    per_layer_values = 2 * config.layer_target + 2 * len(config.track) + config.layer_entropy
    per_token = 12 * 4 * vocab + n_layers * (
        LAYER_TOP_BYTES * config.layer_top_k + PER_LAYER_BYTES * per_layer_values
    )
    chunk = max(1, budget // per_token)
    per_position = batch * (4 * vocab + 4 * (n_layers + 1) * hidden)
    cap = MAX_SEGMENT_CUDA if device is not None and device.type == "cuda" else MAX_SEGMENT
    segment = max(1, min(cap, budget // per_position))
    return segment, chunk


def model_chunk_sizes(
    lm: LoadedModel, lens: LogitLens, config: ReadoutConfig, batch: int = 1
) -> tuple[int, int]:
    """``chunk_sizes`` for ``lm`` read through ``lens`` on its device. The chunk's token count is also the rows of
    one unembedding product in ``ReadoutChunk.logit_blocks``: a chunk shorter than that reads several layers in
    one."""
    n_vocab = lens.vocab_size or lm.parts.unembed_weight.shape[0]
    return chunk_sizes(config, n_vocab, lm.parts.unembed_weight.shape[1], lm.n_layers, batch, lm.device)


def _pad_batch(sequences: Sequence[TokenSequence], pad_id: int) -> torch.Tensor:
    rows = [list(s.prompt_ids) + list(s.completion_ids) for s in sequences]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return ids


def validate(lm: LoadedModel, seq: TokenSequence, what: str) -> None:
    """Raise InputError if ``seq`` cannot be read out by ``lm`` (empty prompt, unknown token ids, too long)."""
    if not seq.prompt_ids:
        raise InputError(
            f"{what}: the prompt is empty, so no position predicts the first completion token; "
            "give at least one prompt token (e.g. the tokenizer's BOS)"
        )
    n_vocab = lm.model.get_input_embeddings().num_embeddings
    out_of_range = [i for i in (*seq.prompt_ids, *seq.completion_ids) if not 0 <= i < n_vocab]
    if out_of_range:
        raise InputError(
            f"{what}: token id(s) {out_of_range[:5]} outside {lm.name}'s vocabulary of {n_vocab}; "
            "token ids must come from this model's tokenizer"
        )
    total = len(seq.prompt_ids) + len(seq.completion_ids)
    limit = lm.max_positions
    if limit is not None and total > limit:
        raise InputError(
            f"{what}: {total} tokens (prompt {len(seq.prompt_ids)} + completion {len(seq.completion_ids)}) "
            f"exceed {lm.name}'s context of {limit}; shorten the record or use a longer-context model"
        )


@torch.inference_mode()
def iter_readout(
    lm: LoadedModel,
    sequences: Sequence[TokenSequence],
    config: ReadoutConfig = ReadoutConfig(),
    keep_layers: Sequence[int] = (),
) -> Iterator[ReadoutChunk]:
    """Yield the completion tokens of ``sequences`` (one forward pass for the batch) as readout chunks.

    Chunks of one sequence come in order; sequences with an empty completion yield nothing. ``keep_layers``: each
    chunk also carries those hidden states (``rows_chunk``).
    """
    if not sequences:
        return
    for i, seq in enumerate(sequences):
        validate(lm, seq, f"sequence {i}")
    model = lm.model
    lens = lens_for(lm, config)
    segment, chunk = model_chunk_sizes(lm, lens, config, len(sequences))
    pad_id = 0
    if lm.tokenizer is not None:
        pad_id = lm.tokenizer.pad_token_id or lm.tokenizer.eos_token_id or 0
    ids = _pad_batch(sequences, pad_id).to(lm.device)
    # Readout positions of sequence b: [P_b − 1, P_b − 1 + C_b).
    spans = [(len(s.prompt_ids) - 1, len(s.prompt_ids) - 1 + len(s.completion_ids)) for s in sequences]
    n_positions = max(end for _, end in spans)  # the last completion token is never an input we need
    cache = None
    for seg_start in range(0, n_positions, segment):
        seg_end = min(seg_start + segment, n_positions)
        wanted = [(b, max(lo, seg_start), min(hi, seg_end)) for b, (lo, hi) in enumerate(spans)]
        wanted = [(b, lo, hi) for b, lo, hi in wanted if lo < hi]
        out = model(
            input_ids=ids[:, seg_start:seg_end],
            past_key_values=cache,
            use_cache=seg_end < n_positions,
            output_hidden_states=bool(wanted),
        )
        cache = out.past_key_values
        if not wanted:
            continue
        hidden_states = out.hidden_states  # L + 1 tensors [B, S, d]; index 0 = embeddings, −1 = normed final
        for b, lo, hi in wanted:
            for c0 in range(lo, hi, chunk):
                c1 = min(c0 + chunk, hi)
                rows = slice(c0 - seg_start, c1 - seg_start)
                start = c0 - spans[b][0]
                yield rows_chunk(
                    lm,
                    lens,
                    tuple(h[b, rows] for h in hidden_states),
                    out.logits[b, rows],
                    ids[b, c0 + 1 : c1 + 1],
                    seq_index=b,
                    start=start,
                    keep_layers=keep_layers,
                )
        del out, hidden_states
