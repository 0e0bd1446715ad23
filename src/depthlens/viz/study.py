"""Figures of the deep-thinking studies: metric vs accuracy by bins (Fig 1), one token's settling (Fig 3),
the sensitivity sweeps (Fig 4); Figure 5 (accuracy vs cost per Think@n method) is viz/cost.py. Drawing only:
every number arrives computed; PNG or SVG by the path's suffix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from depthlens.errors import InputError


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    _pyplot().close(fig)
    return path


def _one_value_axes(ax: Any, xs: list[float], ys: list[float]) -> None:
    """Where every bin has the same metric value (a DTR of 0 throughout) matplotlib pads the axis to ±0.04 around
    it, inventing negative values: show that one value as the only tick, and say so. An accuracy that is the same
    in every bin keeps its axis on 0–100 %."""
    if xs and min(xs) == max(xs):
        ax.set_xticks([xs[0]], [f"{xs[0]:g}"])
        ax.text(0.5, 0.04, f"every bin at {xs[0]:g}", transform=ax.transAxes, ha="center", fontsize=7)
    if ys and min(ys) == max(ys):
        ax.set_ylim(-5.0, 105.0)


def draw_metric_bins(
    profiles: dict[str, list[dict[str, float]]], labels: dict[str, str], path: str | Path, title: str = ""
) -> Path:
    """Figure 1: per metric, accuracy of each quantile bin against the bin's mean metric value."""
    path = Path(path)
    shown = {k: v for k, v in profiles.items() if v}
    if not shown:
        raise InputError("no metric has a bin profile to draw (every question has fewer responses than bins)")
    plt = _pyplot()
    cols = min(3, len(shown))
    rows = (len(shown) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False)
    for ax, (name, points) in zip(axes.flat, shown.items(), strict=False):
        xs = [p["metric"] for p in points]
        ys = [100 * p["accuracy"] for p in points]
        err = [100 * p["accuracy_se"] for p in points]
        ax.errorbar(
            xs, ys, yerr=err, marker="o", color="#1f77b4" if name.startswith("dtr") else "#7f7f7f", capsize=3
        )
        for p, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(str(p["bin"]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        _one_value_axes(ax, xs, ys)
        ax.set_title(labels.get(name, name), fontsize=9)
        ax.set_xlabel("bin mean", fontsize=8)
        ax.set_ylabel("accuracy %", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(shown) :]:
        ax.axis("off")
    questions = next(iter(shown.values()))[0]["questions"]
    fig.suptitle(
        title or f"accuracy by within-question quantile bin ({questions} questions; ±1 s.e.)", fontsize=10
    )
    return _save(fig, path)


def draw_token_settling(
    divergence: Sequence[float],
    g: float,
    deep_from: int,
    path: str | Path,
    token: str = "",
    unit: str = "bits",
) -> Path:
    """Figure 3: one token's divergence per layer, its cumulative minimum, the threshold g and the deep band."""
    path = Path(path)
    import numpy as np

    d = np.asarray(divergence, dtype=float)
    if d.size == 0:
        raise InputError("no layers to draw for this token")
    layers = np.arange(1, d.size + 1)
    running = np.minimum.accumulate(d)
    settled = int(np.argmax(running <= g)) + 1 if (running <= g).any() else d.size
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.axvspan(
        deep_from - 0.5, d.size + 0.5, color="#1f77b4", alpha=0.12, label=f"deep regime (≥ {deep_from})"
    )
    ax.plot(layers, d, marker="o", ms=3, color="#444444", label="divergence to the final layer")
    ax.step(layers, running, where="mid", color="#d62728", label="cumulative minimum")
    ax.axhline(g, ls="--", color="#2ca02c", label=f"g = {g:g}")
    ax.axvline(settled, ls=":", color="#9467bd", label=f"settling depth c = {settled}")
    ax.set_xlabel("layer")
    ax.set_ylabel(f"divergence ({unit})")
    ax.set_xlim(0.5, d.size + 0.5)
    ax.set_title(
        f"token {token!r}: {'deep-thinking' if settled >= deep_from else 'settles early'}", fontsize=10
    )
    ax.legend(fontsize=7, loc="center left", framealpha=0.9)
    return _save(fig, path)


_SWEEP_TITLES = {"g": "settling threshold g", "rho": "depth fraction ρ", "prefix": "ℓ_prefix (tokens)"}


def draw_sweeps(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Figure 4: mean DTR and its correlation with accuracy as g, ρ and ℓ_prefix vary; divergence/rule as bars."""
    path = Path(path)
    if not rows:
        raise InputError("no sweep rows to draw")
    plt = _pyplot()
    # 2 × 2 at the page's width (a row of four was shrunk to a third of its size in the HTML, too small to read)
    fig, grid = plt.subplots(2, 2, figsize=(10, 7))
    axes = grid.ravel()
    for ax, param in zip(axes[:3], ("g", "rho", "prefix"), strict=True):
        points = [r for r in rows if r["param"] == param]
        if not points:
            ax.axis("off")
            continue
        labels = [str(r["value"]) for r in points]
        xs = list(range(len(points))) if param == "prefix" else [float(r["value"]) for r in points]
        ax.plot(xs, [r["mean_dtr"] for r in points], marker="o", color="#1f77b4", label="mean DTR")
        ax.set_xlabel(_SWEEP_TITLES[param])
        ax.set_ylabel("mean DTR", color="#1f77b4")
        twin = ax.twinx()
        twin.plot(xs, [r["binned_r"] for r in points], marker="s", color="#d62728", label="binned r")
        twin.plot(
            xs, [r["point_biserial"] for r in points], marker="^", color="#ff7f0e", label="point-biserial r"
        )
        twin.axhline(0, color="#999999", lw=0.5)
        twin.set_ylim(-1, 1)
        twin.set_ylabel("r with accuracy")
        if param == "prefix":
            ax.set_xticks(xs, labels)
        if param == "g":
            twin.legend(fontsize=9, loc="upper right")  # mean DTR falls with g: that corner is free
    ax = axes[3]
    bars = [r for r in rows if r["param"] in ("divergence", "deep_rule")]
    names = [f"{r['value']}" for r in bars]
    xs = list(range(len(bars)))
    ax.bar([x - 0.2 for x in xs], [r["binned_r"] or 0 for r in bars], 0.4, color="#d62728", label="binned r")
    ax.bar(
        [x + 0.2 for x in xs],
        [r["point_biserial"] or 0 for r in bars],
        0.4,
        color="#ff7f0e",
        label="point-biserial r",
    )
    ax.set_xticks(xs, names, rotation=20, fontsize=10)
    ax.axhline(0, color="#999999", lw=0.5)
    ax.set_ylim(-1, 1)
    ax.set_title("divergence kind · deep rule", fontsize=11)
    ax.legend(fontsize=9)
    fig.suptitle(title, fontsize=12)
    return _save(fig, path)
