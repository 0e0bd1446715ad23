"""Figures of the four TCB studies, drawn from their rows (``studies.tcb_studies``) only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

_COLOURS = {"diverse": "#1f77b4", "low_veff": "#d62728"}


def draw_regimes(result: dict[str, Any], path: str | Path) -> Path:
    """δ against √V_eff and against the top-2 margin, one colour per prompt set (log δ)."""
    path = Path(path)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    summary = {s["set"]: s for s in result["summary"]}
    for name in summary:
        rows = [r for r in result["rows"] if r["set"] == name]
        s = summary[name]
        label_v = (
            f"{name} (r = {s['corr_tcb_sqrt_v_eff']:.2f})" if s["corr_tcb_sqrt_v_eff"] is not None else name
        )
        label_m = f"{name} (r = {s['corr_tcb_margin']:.2f})" if s["corr_tcb_margin"] is not None else name
        colour = _COLOURS.get(name)
        axes[0].scatter(
            [r["v_eff"] ** 0.5 for r in rows], [r["tcb"] for r in rows], s=14, c=colour, label=label_v
        )
        axes[1].scatter([r["margin"] for r in rows], [r["tcb"] for r in rows], s=14, c=colour, label=label_m)
    for ax, xlabel in zip(axes, ("√V_eff", "top-2 logit margin"), strict=True):
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("δ_TCB (ε = 1)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("TCB regimes: next-token position of each prompt")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def draw_geometry(result: dict[str, Any], path: str | Path) -> Path:
    """Share of positions with δ_cluster > δ_orig > δ_disperse, per V_eff band."""
    path = Path(path)
    summary = [s for s in result["summary"] if s["positions"]]
    fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
    labels = [f"{s['band']}\n(n = {s['positions']})" for s in summary]
    shares = [100 * s["ordered_share"] for s in summary]
    bars = ax.bar(labels, shares, color="#2ca02c")
    ax.bar_label(bars, fmt="%.0f%%")
    ax.axhline(90, color="grey", ls="--", lw=1, label="paper: ~90 %")
    ax.set_ylim(0, 105)
    ax.set_ylabel("δ_cluster > δ_orig > δ_disperse (%)")
    ax.set_xlabel("V_eff band")
    ax.legend(fontsize=8, loc="lower right")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def draw_prompt_variants(result: dict[str, Any], path: str | Path) -> Path:
    """Accuracy, perplexity and median δ per template × shots, side by side."""
    path = Path(path)
    summary = result["summary"]
    labels = [f"{s['template']}\n{s['shots']}-shot" for s in summary]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), constrained_layout=True)
    for ax, key, title in zip(
        axes,
        ("accuracy", "perplexity", "tcb_median"),
        ("accuracy", "answer perplexity", "median δ_TCB"),
        strict=True,
    ):
        ax.bar(range(len(summary)), [s[key] for s in summary], color="#9467bd")
        ax.set_xticks(range(len(summary)), labels, fontsize=7)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def draw_generation_trace(result: dict[str, Any], path: str | Path) -> Path:
    """δ (log) and perplexity per generated token, tokens on the x axis, sharp drops marked."""
    path = Path(path)
    rows = result["rows"]
    width = max(8.0, 0.22 * len(rows))
    fig, axes = plt.subplots(2, 1, figsize=(width, 5.5), sharex=True, constrained_layout=True)
    x = list(range(len(rows)))
    axes[0].plot(x, [r["tcb"] for r in rows], marker=".", color="#1f77b4")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("δ_TCB")
    drops = [r for r in rows if r["sharp_drop"]]
    axes[0].scatter(
        [r["position"] for r in drops],
        [r["tcb"] for r in drops],
        s=60,
        facecolors="none",
        edgecolors="red",
        label="sharp drop (≤ 1/10 of recent median, ppl ≤ 2)",
    )
    axes[0].legend(fontsize=8)
    axes[1].plot(x, [r["perplexity"] for r in rows], marker=".", color="#ff7f0e")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("token perplexity")
    axes[1].set_xticks(x, [repr(r["token"])[1:-1] for r in rows], rotation=90, fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
