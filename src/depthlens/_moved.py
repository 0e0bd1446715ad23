"""Import paths from before the one-room-per-concern layout (docs/architecture.md) keep working, for now.

``from depthlens.studies.records import iter_jsonl`` or ``depthlens.sampling.generate.HFGenerator`` still resolve:
each old module's names are looked up, in order, in the modules they moved to, with a DeprecationWarning naming
the new home. Old modules that still exist with other contents (``studies.thinkn``, ``studies.correlation``,
``viz.report``) forward the names they lost the same way (``moved_attribute``). Nothing in depthlens itself uses
these paths; they go away in a later release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

HOMES: dict[str, tuple[str, ...]] = {
    "depthlens.sampling.generate": ("depthlens.sampling.backend", "depthlens.sampling.hf", "depthlens.sampling.choose"),
    "depthlens.sampling.vllm_backend": ("depthlens.sampling.vllm.backend",),
    "depthlens.sampling.vllm_scores": ("depthlens.sampling.vllm.scores",),
    "depthlens.voting.answers": ("depthlens.evals.answers",),
    "depthlens.studies.tasks": ("depthlens.evals.tasks", "depthlens.evals.loading", "depthlens.evals.grading"),
    "depthlens.studies.gold": ("depthlens.evals.gold",),
    "depthlens.studies.store_answers": ("depthlens.evals.grading",),
    "depthlens.studies.records": (
        "depthlens.stores.inputs", "depthlens.stores.files", "depthlens.stores.jsonl", "depthlens.stores.samples",
    ),
    "depthlens.studies.parquet_store": ("depthlens.stores.parquet",),
    "depthlens.studies.stores": ("depthlens.stores.formats", "depthlens.config"),
    "depthlens.studies.ray_score": ("depthlens.scale.ray", "depthlens.scale.score"),
    "depthlens.studies.ray_generate": ("depthlens.scale.generate",),
    # modules that still exist: the names they lost
    "depthlens.studies.thinkn": (
        "depthlens.stores.samples", "depthlens.studies.generate", "depthlens.metrics.dtr", "depthlens.sampling.backend",
    ),
    "depthlens.studies.correlation": (
        "depthlens.studies.stored", "depthlens.stores.samples", "depthlens.studies.sweeps", "depthlens.studies.tables",
    ),
    "depthlens.viz.report": ("depthlens.studies.report",),
    "depthlens.viz.study": ("depthlens.viz.cost",),
}  # fmt: skip
RENAMED = {"damaged_record": "damaged", "_generate_question": "generate_question"}


def moved_attribute(module: str, name: str) -> Any:
    """``module.name`` from where it lives now; AttributeError as usual where it never existed."""
    if name.startswith("__"):  # a module's own dunders (``__file__``, ``__path__``) are never forwarded
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    for home in HOMES.get(module, ()):
        target = importlib.import_module(home)
        new = RENAMED.get(name, name)
        if hasattr(target, new):
            warnings.warn(
                f"{module}.{name} moved to {home}.{new}; import it from there",
                DeprecationWarning,
                stacklevel=3,
            )
            return getattr(target, new)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        module.__getattr__ = lambda attr: moved_attribute(name, attr)  # type: ignore[method-assign]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the old modules that no longer exist as files (asked only after every real finder failed)."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in HOMES:
            return importlib.machinery.ModuleSpec(fullname, _Loader())
        return None


def install() -> None:
    """Put the finder at the end of ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
