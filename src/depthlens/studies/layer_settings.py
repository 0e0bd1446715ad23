"""The per-layer settings a readout takes beside its ``ReadoutConfig`` — a caller's statistics (``layer_stats``) and
the hidden states it wants back (``hidden_layers``) — checked against the model before anything is read out or
written, and the per-layer values as a result record holds them (docs/python.md, "Per-layer quantities").

Every refusal names the setting (``layer_stats['name']``, ``hidden_layers``, ``track``) and says what to do; each
front phrases it (``errors``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from depthlens.config import ReadoutConfig
from depthlens.config.readout import check_per_layer, check_track
from depthlens.errors import InputError, named
from depthlens.metrics.layer_names import is_rank
from depthlens.metrics.layer_quantities import LayerQuantities, LayerStat, probe_stats
from depthlens.readout.stream import budget_mb


def readout_vocab(lm: Any, readout: ReadoutConfig) -> int:
    """The vocabulary the lens reads for ``lm`` (a loaded model or a ``ModelInfo``): ``readout.vocab_size``, else
    the tokenizer's length, else the unembedding's rows (``readout.stream.lens_for``'s cut)."""
    if readout.vocab_size is not None:
        return readout.vocab_size
    tokenizer = getattr(lm, "tokenizer", None)
    return len(tokenizer) if tokenizer is not None else int(lm.vocab_rows)


def check_layer_stats_tokens(layer_stats: Mapping[str, LayerStat] | None, tokens: bool) -> None:
    """A caller's statistics are per-token fields: asked for without ``tokens`` they are refused, naming both."""
    if layer_stats and not tokens:
        raise InputError(
            setting="layer_stats",
            value=sorted(layer_stats),
            requirement=f"each statistic is kept per token and layer: add {named('tokens', True)}",
        )


def readout_quantities(
    lm: Any, readout: ReadoutConfig, layer_stats: Mapping[str, LayerStat] | None, tokens: bool = True
) -> LayerQuantities | None:
    """The per-layer quantities a readout of ``lm`` keeps (None: none), every setting checked first: per-token
    fields only with ``tokens``, tracked ids below the vocabulary, each statistic tried on a probe block
    (``metrics.layer_quantities.probe_stats``)."""
    check_per_layer(readout, tokens)
    check_layer_stats_tokens(layer_stats, tokens)
    vocab = readout_vocab(lm, readout)
    check_track(readout.track, vocab, getattr(lm, "name", "the model"))
    quantities = LayerQuantities.of(readout, probe_stats(layer_stats, vocab))
    return quantities if quantities else None


def check_hidden_layers(layers: Iterable[int] | None, n_layers: int) -> tuple[int, ...]:
    """``hidden_layers`` as distinct layer numbers in 0..L (0: the embeddings' output, l: block l's output, L: the
    model's last hidden state as ``output_hidden_states`` gives it — after the final norm where the model applies
    it there); anything else is refused naming the range."""
    if layers is None:
        return ()
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise InputError(setting="hidden_layers", value=layers, requirement="must be a list of layer numbers")
    wanted = list(layers)
    bad = [x for x in wanted if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= n_layers]
    if bad:
        raise InputError(
            setting="hidden_layers",
            value=wanted,
            requirement=(
                f"layer {bad[0]!r} is out of range: layers are 0..{n_layers} (0 the embeddings, l block l's output, "
                f"{n_layers} the last hidden state)"
            ),
        )
    if len(set(wanted)) != len(wanted):
        raise InputError(setting="hidden_layers", value=wanted, requirement="must name each layer once")
    return tuple(wanted)


def check_hidden_budget(lm: Any, readout: ReadoutConfig, layers: Sequence[int], tokens: int) -> None:
    """The hidden states asked for — ``tokens`` × |``layers``| × d float32 — within the readout's memory budget
    (``memory_mb``), or refused naming their size and the budget."""
    if not layers:
        return
    hidden = int(lm.parts.unembed_weight.shape[1])
    size = tokens * len(layers) * hidden * 4
    budget = budget_mb(readout, lm.device)
    if size > budget * 2**20:
        raise InputError(
            setting="hidden_layers",
            value=list(layers),
            requirement=(
                f"{tokens:,} tokens × {len(layers)} layers × {hidden} × 4 B = {size / 2**20:,.1f} MB of hidden "
                f"states exceed the memory budget of {budget:,} MB ({named('memory_mb')}); ask for fewer layers or "
                f"records, or raise {named('memory_mb')}"
            ),
        )


def layer_value_fields(values: Mapping[str, torch.Tensor], digits: int | None = None) -> dict[str, Any]:
    """A table's per-layer values (field → [T, L] or [T, L, m] tensors) as a record holds them: ranks as whole
    numbers, floats rounded to ``digits`` (None: as they are)."""
    out: dict[str, Any] = {}
    for field, tensor in values.items():
        if is_rank(field):
            out[field] = tensor.long().tolist()
        else:
            out[field] = rounded(tensor.double().tolist(), digits)
    return out


def stored_layer_values(values: Mapping[str, list[Any]], digits: int) -> dict[str, Any]:
    """A trace's per-layer values (field → rows of lists) as a store keeps them: ranks whole, floats rounded."""
    return {field: rows if is_rank(field) else rounded(rows, digits) for field, rows in values.items()}


def rounded(value: Any, digits: int | None) -> Any:
    """``value`` (a number, or nested lists of them) rounded to ``digits`` decimals (None: as it is)."""
    if digits is None:
        return value
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return round(value, digits)
