"""Figure 5 for online Think@n: accuracy against tokens per question, one line per method family and β.
Drawing only: every number arrives computed (``studies.online.budget_sweep`` rows)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from depthlens.errors import InputError
from depthlens.viz.study import _pyplot, _save

COLOURS = {
    "cons@n": "#1f77b4",
    "think@n": "#d62728",
    "online think@n": "#ff7f0e",
    "online deepconf": "#2ca02c",
}
STYLES = {0.6: ":", 0.8: "--", 1.0: "-"}


def draw_budget_curves(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """One line per method (budgets joined in order), ±1 std over trials as error bars; PNG or SVG by suffix."""
    path = Path(path)
    if not rows:
        raise InputError("no sweep rows to draw")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    methods: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        methods.setdefault(r["method"], []).append(r)
    for method, points in methods.items():
        points = sorted(points, key=lambda r: r["budget"])
        family = points[0]["family"]
        beta = points[0]["consensus"]
        ax.errorbar(
            [p["cost_mean"] for p in points],
            [100 * p["accuracy_mean"] for p in points],
            yerr=[100 * p["accuracy_std"] for p in points],
            xerr=[p["cost_std"] for p in points],
            marker="o",
            ms=4,
            capsize=2,
            label=method,
            color=COLOURS.get(family, "#7f7f7f"),
            linestyle=STYLES.get(beta, "-") if beta is not None else "-",
            alpha=0.9,
        )
    ax.set_xlabel("tokens generated per question")
    ax.set_ylabel("accuracy %")
    ax.set_title(title or "accuracy vs tokens", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)
