"""Figure 4's sweeps: DTR's settings varied on a store's stored divergences, with its correlation at each."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from depthlens.config import CorrelationConfig, DTRConfig
from depthlens.errors import InputError
from depthlens.studies.correlation import DTRSettings, StudyMetric, correlate, dtr_settings, metric_values
from depthlens.studies.stored import Store, StoredResponse

SWEEPS: dict[str, tuple[Any, ...]] = {
    "g": (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    "rho": (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95),
    "prefix": (10, 25, 50, 100, 200, None),
    "divergence": ("jsd", "kl", "cosine"),
    "deep_rule": ("spec", "paper-literal"),
}


def _kind_ratio(kind: str, response: StoredResponse, settings: DTRSettings) -> float | None:
    """A response's DTR under divergence ``kind``."""
    return settings.ratio(response, kind)


def sweep(
    store: Store,
    cfg: CorrelationConfig = CorrelationConfig(),
    dtr: DTRConfig = DTRConfig(),
    grid: dict[str, Sequence[Any]] | None = None,
) -> list[dict[str, Any]]:
    """Mean DTR and its correlations with accuracy as one setting varies, the others at ``dtr``'s values."""
    grid = dict(grid or SWEEPS)
    base = dtr_settings(store, dtr)
    rows = []
    for param, values in grid.items():
        for value in values:
            kind = "jsd"
            settings = base
            if param == "g":
                settings = dtr_settings(store, dataclasses.replace(dtr, g=value))
            elif param == "rho":
                settings = dataclasses.replace(base, dtr=dataclasses.replace(dtr, rho=value))
            elif param == "prefix":
                window = store.readout_tokens
                if window is not None and (value is None or value > window):
                    continue  # beyond the read-out window the stored divergences end
                settings = dataclasses.replace(base, dtr=dataclasses.replace(dtr, dtr_prefix_tokens=value))
            elif param == "deep_rule":
                settings = dataclasses.replace(base, dtr=dataclasses.replace(dtr, deep_rule=value))
            elif param == "divergence":
                if value not in store.kinds:
                    continue
                kind = value
            else:
                raise InputError(f"unknown sweep parameter {param!r}; choose from {sorted(SWEEPS)}")
            metric = StudyMetric("dtr", "DTR", functools.partial(_kind_ratio, kind), kind)
            groups = metric_values(store, metric, settings)
            values_all = np.concatenate([v for v, _ in groups]) if groups else np.zeros(0)
            c = correlate("dtr", groups, cfg)
            rows.append(
                {
                    "model": store.model,
                    "task": store.task,
                    "param": param,
                    "value": "full" if value is None else value,
                    "g": settings.g_by_kind.get(kind),
                    "mean_dtr": float(values_all.mean()) if values_all.size else None,
                    "binned_r": c.binned_r,
                    "point_biserial": c.point_biserial,
                    "point_biserial_lo": c.point_biserial_ci[0],
                    "point_biserial_hi": c.point_biserial_ci[1],
                    "point_biserial_p": c.point_biserial_p,
                    "spearman": c.spearman,
                    "spearman_p": c.spearman_p,
                    "note": c.note,
                }
            )
    return rows
