"""The HF sampler's per-step row: everything one step reads, packed into one float64 row per response so it crosses
to the host in one copy, and cut apart again by the same offsets (issue 50 item 8: one layout, not three readers of
positions).

A row is ``[token | PER_TOKEN scores | read-out part]``; the read-out part, present on the steps inside the read-out
window, is ``[each divergence kind's L layers | layer_top ids L × K | layer_top probabilities L × K | each per-layer
quantity's L (× m) values | first non-finite layer]``. float64 holds float32 values, token ids and ranks (< 2^53)
exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from depthlens.config.readout import Divergence


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """Where each of a step's results sits in its packed row (``pack``) and how to read it back (the decoders)."""

    n_scores: int  # PER_TOKEN's values
    kinds: tuple[Divergence, ...]  # divergence kinds, the primary first
    n_layers: int
    top_k: int = 0  # ReadoutConfig.layer_top_k: each layer's K most probable tokens, 0 for none
    # the per-layer quantities (metrics.layer_quantities.LayerQuantities.fields): (field, m), m = 0 one value a layer
    fields: tuple[tuple[str, int], ...] = ()

    @property
    def _layers_at(self) -> int:
        return 1 + self.n_scores

    @property
    def _top_at(self) -> int:
        return self._layers_at + len(self.kinds) * self.n_layers

    @property
    def _cube(self) -> int:
        return self.n_layers * self.top_k

    @property
    def _values_at(self) -> int:
        return self._top_at + 2 * self._cube

    def _field_width(self, width: int) -> int:
        return self.n_layers * max(1, width)

    def width(self, read: bool) -> int:
        """The row's width on a step that reads the layers out (``read``) or not."""
        values = sum(self._field_width(w) for _, w in self.fields)
        return self._values_at + values + 1 if read else self._layers_at

    def pack(
        self,
        tokens: torch.Tensor,
        scores: Sequence[torch.Tensor],
        layers: Sequence[torch.Tensor] = (),
        top: tuple[torch.Tensor, torch.Tensor] | None = None,
        nonfinite: torch.Tensor | None = None,
        values: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One float64 row per response, on the device: ``tokens`` [R], ``scores`` n_scores × [R]; on a read-out
        step (``nonfinite`` [R] given) also ``layers`` kinds × [R, L], ``top`` (ids, probabilities) [R, L, K] and
        ``values``: each of ``fields`` → [R, L] or [R, L, m]."""
        parts = [tokens.double()[:, None], *(s.double()[:, None] for s in scores)]
        if nonfinite is not None:
            parts += [layer.double() for layer in layers]
            if self.top_k:
                if top is None:
                    raise ValueError("StepLayout.pack: layer_top_k is set but no top-k was given")
                parts += [t.double().reshape(len(tokens), self._cube) for t in top]
            for name, _ in self.fields:
                if values is None or name not in values:
                    raise ValueError(f"StepLayout.pack: no {name} was given")
                parts.append(values[name].double().reshape(len(tokens), -1))
            parts.append(nonfinite.double()[:, None])
        packed = torch.cat(parts, dim=1)
        if packed.shape[1] != self.width(nonfinite is not None):
            raise ValueError(f"StepLayout.pack: {packed.shape[1]} columns for a layout of {self.width(True)}")
        return packed

    def token_ids(self, values: np.ndarray) -> np.ndarray:
        """[R] int64: each row's sampled token."""
        return values[:, 0].astype(np.int64)

    def scores(self, values: np.ndarray) -> np.ndarray:
        """[R, n_scores]: the final-layer values, ``PER_TOKEN``'s order."""
        return values[:, 1 : self._layers_at]

    def nonfinite(self, values: np.ndarray) -> np.ndarray:
        """[R]: each row's first non-finite layer (0: none), from a read-out step's rows."""
        return values[:, self.width(True) - 1]

    def layers(self, values: np.ndarray) -> np.ndarray:
        """[R, kinds, L]: each divergence kind's layers, from read-out steps' rows."""
        return values[:, self._layers_at : self._top_at].reshape(len(values), len(self.kinds), self.n_layers)

    def top(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64, probabilities) [R, L, K]: each layer's top-k, from read-out steps' rows."""
        shape = (len(values), self.n_layers, self.top_k)
        at = self._top_at
        ids = values[:, at : at + self._cube].astype(np.int64).reshape(shape)
        probs = values[:, at + self._cube : at + 2 * self._cube].reshape(shape)
        return ids, probs

    def values(self, values: np.ndarray) -> dict[str, np.ndarray]:
        """Each per-layer quantity, field → [R, L] (or [R, L, m]), from read-out steps' rows (ranks as float64)."""
        out, at = {}, self._values_at
        for name, width in self.fields:
            span = self._field_width(width)
            shape = (len(values), self.n_layers, width) if width else (len(values), self.n_layers)
            out[name] = values[:, at : at + span].reshape(shape)
            at += span
        return out
