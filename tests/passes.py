"""Count the passes an eager computation makes over large tensors (PyTorch's dispatcher sees every op), so a test
can say which work a feature adds — e.g. that each layer's top-k adds one reduction over the vocabulary and no
elementwise pass (tests/test_layer_top.py), and benchmarks/readout_passes.py can print the counts.

A *pass* is an op that reads or writes a tensor of at least ``numel`` elements, except views and allocations (no
data moves) and indexed reads and writes (``gather``, ``index``, ``scatter``: they touch the indexed entries only).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

INDEXED = frozenset(
    {"gather", "index", "index_select", "take_along_dim", "scatter", "scatter_", "index_put_"}
)
ALLOCATIONS = frozenset({"empty", "new_empty", "empty_like", "empty_strided"})


def _is_view(func: Any) -> bool:
    returns = func._schema.returns
    info = returns[0].alias_info if returns else None
    return info is not None and not info.is_write


class WidePasses(TorchDispatchMode):
    """Within the ``with`` block, ``counts`` holds each op's name → how many times it passed over a tensor of at
    least ``numel`` elements; ``ops`` counts every op called (the dispatcher's view of launches)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel = numel
        self.counts: Counter[str] = Counter()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        name = func.overloadpacket.__name__
        if name in INDEXED or name in ALLOCATIONS or _is_view(func):
            return out
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        if any(t.numel() >= self.numel for t in tensors):
            self.counts[name] += 1
        return out
