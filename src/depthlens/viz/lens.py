"""The lens comparison's figure (``depthlens lens compare``): held-out KL per layer, logit against a fitted lens (the
tuned-lens paper's figure), and the settling-depth distribution under each lens and rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from depthlens.viz.study import _pyplot, _save


def draw_lens_comparison(
    kl: Mapping[str, Mapping[str, Sequence[float]]],
    depths: Mapping[str, Sequence[float] | np.ndarray],
    n_layers: int,
    path: str | Path,
) -> Path:
    """Left: per fitted lens, the held-out KL(p_L ‖ p_l) per layer 1..L−1 of the logit and the fitted lens (nats,
    log scale); right: each arm's settling depths as a histogram over layers 1..L."""
    path = Path(path)
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, curves in kl.items():
        layers = range(1, len(curves["logit"]) + 1)
        short = Path(name.partition(":")[2] or name).name
        fitted = next(k for k in curves if k != "logit")  # tuned, or jacobian
        left.plot(layers, curves["logit"], "o-", ms=3, label=f"logit lens ({short} held-out)")
        left.plot(layers, curves[fitted], "s-", ms=3, label=f"{fitted} lens {short}")
    left.set(xlabel="layer", ylabel="held-out KL(p_L ‖ p_l), nats", title="lens bias per layer")
    if kl:
        left.set_yscale("log")
        left.legend(fontsize=7)
    else:
        left.text(0.5, 0.5, "no fitted lens among the stores", ha="center", transform=left.transAxes)
    bins = [b + 0.5 for b in range(n_layers + 1)]
    for label, values in depths.items():
        right.hist(list(values), bins=bins, histtype="step", density=True, label=label)
    right.set(xlabel="settling depth (layer)", ylabel="share", title="settling depths")
    right.legend(fontsize=7)
    return _save(fig, path)
