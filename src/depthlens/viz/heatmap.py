"""Token × layer divergence heatmap of one scored record (the paper's Figure 2), from its saved JSON.

Needs a record written with ``depthlens score --tokens`` (fields ``tokens``, ``divergence``,
``settling_depth``, ``deep``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthlens.errors import InputError

_NEEDED = ("tokens", "divergence", "settling_depth", "deep")


def _clean(token: str) -> str:
    # Byte-level BPE marks a leading space with Ġ and SentencePiece with ▁; show them as spaces.
    return token.replace("Ġ", "␣").replace("▁", "␣").replace("Ċ", "⏎")


def draw_divergence_heatmap(record: dict[str, Any], path: Path, title: str | None = None) -> Path:
    """Write a PNG/SVG (by ``path``'s suffix) of D_{t,l} with each token's settling depth marked."""
    missing = [k for k in _NEEDED if k not in record]
    if missing:
        raise InputError(
            f"record {record.get('id')!r} lacks {missing}; score it with --tokens to draw a heatmap"
        )
    if not record["divergence"]:
        raise InputError(f"record {record.get('id')!r} has no completion tokens to draw")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    table = np.asarray(record["divergence"], dtype=float).T  # [L, T]: layers up, tokens across
    n_layers, n_tokens = table.shape
    width = min(max(6.0, 0.32 * n_tokens + 2), 40.0)
    fig, ax = plt.subplots(figsize=(width, 0.16 * n_layers + 2.2))
    extent = (-0.5, n_tokens - 0.5, 0.5, n_layers + 0.5)
    image = ax.imshow(table, aspect="auto", origin="lower", cmap="magma_r", vmin=0.0, vmax=1.0, extent=extent)
    xs = np.arange(n_tokens)
    colours = ["#1f77b4" if deep else "#2ca02c" for deep in record["deep"]]
    ax.scatter(xs, record["settling_depth"], s=14, c=colours, edgecolors="white", linewidths=0.5, zorder=3,
               label="settling depth (blue = deep)")  # fmt: skip
    ax.set_xticks(xs, [_clean(t) for t in record["tokens"]], rotation=90, fontsize=8)
    ax.set_ylabel("layer")
    dtr = record.get("dtr")
    ax.set_title(title or f"{record.get('id')}: JSD to the final layer (bits); DTR = {dtr:.2f}", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01, label="divergence")
    ax.legend(loc="upper right", fontsize=7, framealpha=0.8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
