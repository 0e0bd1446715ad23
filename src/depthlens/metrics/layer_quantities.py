"""Per-layer quantities besides the divergence (docs/definitions.md §1): the target trajectory — the read-out token's
log-probability and rank at every layer —, the same for token ids a caller tracks, each layer's entropy, and a
caller's own statistics of each layer's log-probabilities.

Pure tensor functions. Each takes one layer's float32 log-probabilities [c, V] — the log-softmax the divergence walk
holds anyway (``metrics.token_table.chunk_divergence_kinds``), so none costs a second softmax — and gives [c] or
[c, m] per layer; the walk stacks them into [c, L] / [c, L, m] (layer L: the model's own distribution).

A rank counts the tokens strictly more probable (0 = the most probable; tokens tied in float32 share the better
rank), one pass over the vocabulary per id. Log-probabilities are natural logs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from depthlens.errors import DepthlensError, InputError, named
from depthlens.metrics.layer_names import (
    ENTROPY,
    STAT_PREFIX,
    TARGET_LOGPROBS,
    TARGET_RANKS,
    TRACK_LOGPROBS,
    TRACK_RANKS,
)

LayerStat = Callable[[torch.Tensor], Any]
"""A caller's statistic: one block of a layer's float32 log-probabilities [rows, V] → [rows] or [rows, m]."""

MAX_STAT_WIDTH = 64
"""The most values a caller's statistic may return per row and layer (m of [rows, m]): more is a slice of the
distribution, not a statistic — its [T][L][m] would be stored for every token."""
_LOOP_IDS = 8  # ranks of up to this many ids per row: one comparison pass each; more: one bucketed count
_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


class StatisticError(DepthlensError, ValueError):
    """A caller's statistic (``layer_stats``) raised, or returned other than [rows] / [rows, m] finite numbers."""


def stat_error(name: str, problem: str) -> StatisticError:
    """The refusal of statistic ``name``: ``layer_stats['name']: <problem>``."""
    return StatisticError(f"layer_stats[{name!r}]: {problem}", setting="layer_stats", value=name)


def count_above(logprobs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """For each row of ``logprobs`` [c, V] and each of its ``values`` [c, M]: how many of the row's entries are
    strictly greater, [c, M] long — the rank of a token whose log-probability is that value.

    Up to ``_LOOP_IDS`` values a row: one comparison pass over the vocabulary each. More: one pass that finds each
    entry's place among the row's sorted values (``searchsorted``) and counts the entries past each value, so the
    cost stops growing with M.
    """
    n = values.shape[-1]
    if n <= _LOOP_IDS:
        counts = [torch.count_nonzero(logprobs > values[:, j : j + 1], dim=-1) for j in range(n)]
        return torch.stack(counts, dim=-1) if counts else values.new_zeros(values.shape, dtype=torch.long)
    ordered, order = values.sort(dim=-1)
    below = torch.searchsorted(
        ordered.contiguous(), logprobs.contiguous()
    )  # [c, V]: how many values are < it
    hist = torch.zeros(values.shape[0], n + 1, dtype=torch.long, device=values.device)
    hist.scatter_add_(1, below, torch.ones_like(below))
    above = hist.flip(1).cumsum(1).flip(1)[:, 1:]  # [c, M]: entries past the j-th smallest value
    return torch.empty_like(above).scatter_(1, order, above)


def target_trajectory(logprobs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probability [c] (float32, nats) and rank [c] (long, 0 = most probable) of each row's token
    ``targets`` [c] in that row's distribution ``logprobs`` [c, V]."""
    chosen = logprobs.gather(-1, targets.to(logprobs.device).long()[:, None])  # [c, 1]
    return chosen[:, 0], count_above(logprobs, chosen)[:, 0]


def layer_entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """H(p) in nats of each row, [c, V] → [c]: the final layer's ``entropy`` baseline (``token_entropy``), its
    0 · log 0 = 0 taken by ``nansum`` rather than a separate pass over the vocabulary (the same values)."""
    return -(logprobs.exp() * logprobs).nansum(-1)


@dataclasses.dataclass(frozen=True)
class LayerQuantities:
    """Which per-layer quantities a walk keeps (``ReadoutConfig.layer_target`` / ``track`` / ``layer_entropy``,
    and the caller's ``layer_stats`` with each one's width m: 0 for [rows], m for [rows, m]).

    ``of_layer`` computes them for one layer; ``fields`` names what it gives and each one's width."""

    target: bool = False
    track: tuple[int, ...] = ()
    entropy: bool = False
    stats: tuple[tuple[str, LayerStat, int], ...] = ()
    _ids: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __bool__(self) -> bool:
        return self.target or bool(self.track) or self.entropy or bool(self.stats)

    @classmethod
    def of(cls, readout: Any, stats: tuple[tuple[str, LayerStat, int], ...] = ()) -> LayerQuantities:
        """The quantities a ``ReadoutConfig`` asks for, and the probed ``stats`` (``probe_stats``)."""
        return cls(readout.layer_target, tuple(readout.track), readout.layer_entropy, stats)

    def fields(self) -> dict[str, int]:
        """Each field this walk gives → its width per layer (0: one value a row and layer; M or m: that many)."""
        out: dict[str, int] = {}
        if self.target:
            out |= {TARGET_LOGPROBS: 0, TARGET_RANKS: 0}
        if self.track:
            out |= {TRACK_LOGPROBS: len(self.track), TRACK_RANKS: len(self.track)}
        if self.entropy:
            out[ENTROPY] = 0
        return out | {STAT_PREFIX + name: width for name, _, width in self.stats}

    def of_layer(self, logprobs: torch.Tensor, targets: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """This layer's quantities from its log-probabilities [c, V] float32 and the tokens read out [c]: each
        field → [c] or [c, width], on the layer's device (ranks long, values float32).

        The caller's statistics come last, so one that changes its input in place (against its contract) cannot
        reach depthlens's own values; their finiteness is checked on the host (``check_finite_stats``)."""
        out: dict[str, torch.Tensor] = {}
        if self.target:
            if targets is None:
                raise ValueError("LayerQuantities.of_layer: the target trajectory needs the tokens read out")
            out[TARGET_LOGPROBS], out[TARGET_RANKS] = target_trajectory(logprobs, targets)
        if self.track:
            values = logprobs.index_select(-1, self._track_ids(logprobs.device))  # [c, M]
            out[TRACK_LOGPROBS], out[TRACK_RANKS] = values, count_above(logprobs, values)
        if self.entropy:
            out[ENTROPY] = layer_entropy(logprobs)
        for name, fn, width in self.stats:
            out[STAT_PREFIX + name] = call_stat(name, fn, logprobs, width)
        return out

    def _track_ids(self, device: torch.device) -> torch.Tensor:
        key = str(device)
        if key not in self._ids:  # one host-to-device copy per walk's device, not one per layer
            self._ids[key] = torch.tensor(self.track, dtype=torch.long, device=device)
        return self._ids[key]


def call_stat(name: str, fn: LayerStat, block: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """``fn`` on one block [rows, V] under inference mode, its result as float32 [rows] or [rows, m] on the block's
    device; refused by name (``StatisticError``) when it raises, is not numbers, has another shape, or (given
    ``width``) another m than on the first block. Finiteness is checked where the values reach the host."""
    rows = block.shape[0]
    try:
        with torch.inference_mode():
            out = fn(block)
    except Exception as exc:  # a caller's code: whatever it raises is named as its failure
        said = " ".join(str(exc).split())[:200]
        raise stat_error(name, f"raised {type(exc).__name__}: {said}") from exc
    try:
        out = torch.as_tensor(out).to(device=block.device, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise stat_error(name, f"returned {type(out).__name__}, not a tensor of numbers") from None
    if out.ndim not in (1, 2) or out.shape[0] != rows:
        raise stat_error(
            name,
            f"returned shape {list(out.shape)} for a block of {rows} rows of {block.shape[-1]} log-probabilities; "
            "it must return [rows] or [rows, m]",
        )
    got = out.shape[1] if out.ndim == 2 else 0
    if got > MAX_STAT_WIDTH:
        raise stat_error(
            name,
            f"returned shape {list(out.shape)}: m = {got} values a row, at most {MAX_STAT_WIDTH} (a statistic, not a "
            "slice of the distribution)",
        )
    if width is not None and got != width:
        raise stat_error(
            name,
            f"returned shape {list(out.shape)} here and m = {width} before; m must be the same on every block",
        )
    return out


def check_finite_stats(values: Mapping[str, Any]) -> None:
    """Refuse by name a caller's statistic that gave NaN or ±inf (``values``: fields → host arrays or tensors)."""
    for field, array in values.items():
        if field.startswith(STAT_PREFIX) and not bool(torch.isfinite(torch.as_tensor(array)).all()):
            raise stat_error(
                field.removeprefix(STAT_PREFIX), "returned NaN or ±inf; it must return finite numbers"
            )


def probe_block(vocab: int, rows: int = 2) -> torch.Tensor:
    """A block of log-probabilities [rows, V] like a layer's (a peaked and a flat distribution), to try each
    statistic on before anything is read out or written (``probe_stats``)."""
    logits = (
        torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
        * torch.linspace(8.0, 1.0, rows)[:, None]
    )
    return torch.log_softmax(logits, dim=-1)


def probe_stats(stats: Mapping[str, LayerStat] | None, vocab: int) -> tuple[tuple[str, LayerStat, int], ...]:
    """``layer_stats`` checked before anything is read out or written: each name a column-safe word (letters,
    digits, ``_``), each function tried on a ``probe_block`` — a raise, a wrong shape or a non-finite value is
    refused by name here (``StatisticError``). Returns (name, function, m) per statistic, m = 0 for [rows]."""
    if not stats:
        return ()
    if not isinstance(stats, Mapping):
        raise stat_error("?", f"layer_stats must map names to functions, not {type(stats).__name__}")
    block = probe_block(vocab)
    out = []
    for name, fn in stats.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise stat_error(
                str(name),
                "a statistic's name must be 1–64 letters, digits or _ (it names the field layer_stat_<name>)",
            )
        if not callable(fn):
            raise stat_error(name, f"is {type(fn).__name__}, not a function of a [rows, V] block")
        value = call_stat(name, fn, block)
        check_finite_stats({STAT_PREFIX + name: value})
        out.append((name, fn, value.shape[1] if value.ndim == 2 else 0))
    return tuple(out)


def stats_need_hf(stats: Mapping[str, LayerStat] | None, backend: str) -> None:
    """A caller's statistic is a Python function: it runs in the transformers readout only, never inside a vLLM
    engine's worker (another process); asked for with ``backend`` vllm it is refused, naming both."""
    if stats and backend == "vllm":
        raise InputError(
            setting="layer_stats",
            value=sorted(stats),
            requirement=f"a statistic runs in the transformers readout: use {named('backend', 'hf')}",
        )


def stat_widths(stats: tuple[tuple[str, LayerStat, int], ...]) -> dict[str, int]:
    """What a store's manifest records of the statistics (``layer_stats``): name → m (0: one value a layer)."""
    return {name: width for name, _, width in stats}
