"""depthlens: how deeply and how stably a causal language model thinks.

>>> import depthlens
>>> lm = depthlens.load("smollm2-135m-instruct")                         # doctest: +SKIP
>>> depthlens.score(lm, [{"id": "a", "prompt": "2+3=", "completion": "5"}]).to_pandas()  # doctest: +SKIP
>>> pool = depthlens.generate(lm, "reasoning_gym:chain_sum", pool=4, questions=3)  # doctest: +SKIP
>>> depthlens.think_at_n(pool, methods=["think@n", "cons@n"])  # doctest: +SKIP

Every call returns a pyarrow Table with the stores' columns (docs/python.md).

Heavy modules (torch, transformers) load on first use of a name below, so importing depthlens is instant.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load": "depthlens.models.load",
    "wrap": "depthlens.models.load",
    "LoadedModel": "depthlens.models.load",
    "score": "depthlens.api.score",
    "generate": "depthlens.api.pools",
    "think_at_n": "depthlens.api.votes",
    "online": "depthlens.api.pools",
    "responses": "depthlens.api.pools",
    "notes": "depthlens.api.tables",
    "to_pandas": "depthlens.stores.arrow",
    "from_pandas": "depthlens.stores.arrow",
    "matrices": "depthlens.stores.arrow",
    "draw_divergence_heatmap": "depthlens.viz.heatmap",
    "draw_logit_lens": "depthlens.viz.heatmap",
    "draw_target_trajectory": "depthlens.viz.trajectory",
    "ReadoutConfig": "depthlens.config",
    "DTRConfig": "depthlens.config",
    "DepthlensError": "depthlens.errors",
}
__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'depthlens' has no attribute {name!r}")


def __dir__() -> list[str]:
    """Every public name, the lazy ones included (``depthlens.<TAB>`` offers the verbs), and the module's own."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
