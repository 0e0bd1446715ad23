"""The logit lens's classic plot: the probability and rank of the token actually read out, at every layer (the
target trajectory, ``layer_target``; tuned-lens's "prediction trajectory"), and, where the record tracks token ids
(``track``), each one's probability by layer.

Needs a record scored with ``tokens`` and ``layer_target`` (``layer_target_logprobs`` / ``layer_target_ranks``,
[T][L]): a ``score`` result, ``table.to_pylist()[i]``, a row of ``depthlens.to_pandas(table)`` or a sample store's
record.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from depthlens.errors import InputError, named
from depthlens.metrics.layer_names import TARGET_LOGPROBS, TARGET_RANKS, TRACK_LOGPROBS

_ANNOTATE = 40  # ranks are written in the cells up to this many tokens (beyond, the cells are too narrow)


def draw_target_trajectory(
    record: dict[str, Any],
    path: str | Path,
    title: str | None = None,
    tokens: Sequence[int] | None = None,
    track_labels: Sequence[str] | None = None,
) -> Path:
    """Write the target trajectory (PNG/SVG by ``path``'s suffix): left, tokens across and layers up, each cell the
    read-out token's probability at that layer (colour) and its rank (0 = the most probable, written in the cell);
    right, by layer, the median probability and median rank over the tokens drawn, with each token's probability
    faint behind; below, where the record tracks ids (``layer_track_logprobs``), each id's mean probability by
    layer (labelled by ``track_labels`` — e.g. the tokenizer's texts of the ids —, else ``#id`` where the record
    holds its ``track``, else ``track[m]``). ``tokens``: the read-out token indices to draw (default
    all)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    path = Path(path)
    logprobs, ranks = _trajectory(record)
    picked = list(range(len(logprobs))) if tokens is None else list(tokens)
    bad = [t for t in picked if not 0 <= t < len(logprobs)]
    if bad or not picked:
        raise InputError(
            setting="tokens",
            value=list(picked),
            requirement=f"must be read-out token indices in 0..{len(logprobs) - 1}",
        )
    probs, rank = np.exp(logprobs[picked]), ranks[picked]  # [T', L]
    n_tokens, n_layers = probs.shape
    track = np.asarray(record[TRACK_LOGPROBS], dtype=float)[picked] if _has(record, TRACK_LOGPROBS) else None
    rows = 2 if track is not None else 1
    height = 0.16 * n_layers + 2.6
    fig, axes = plt.subplots(
        rows,
        2,
        figsize=(min(max(8.0, 0.3 * n_tokens + 7), 40.0), height + (3.2 if rows == 2 else 0.0)),
        gridspec_kw={"width_ratios": [max(2.0, n_tokens / 8), 2.0], "height_ratios": [height, 3.2][:rows]},
        squeeze=False,
    )
    _grid(axes[0][0], probs, rank, _labels(record, picked))
    _lines(axes[0][1], probs, rank)
    if track is not None:
        _tracked(axes[1][0], np.exp(track), record, track_labels)
        axes[1][1].axis("off")
    axes[0][0].set_title(
        title or f"{record.get('id')}: the read-out token's probability and rank at every layer",
        fontsize=10,
        loc="left",
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def _has(record: dict[str, Any], field: str) -> bool:
    value = record.get(field)
    return value is not None and len(value) > 0


def _trajectory(record: dict[str, Any]) -> tuple[Any, Any]:
    """(log-probabilities, ranks) [T, L] of ``record``, or an error naming how to get them."""
    import numpy as np

    if not (_has(record, TARGET_LOGPROBS) and _has(record, TARGET_RANKS)):
        if TARGET_LOGPROBS in record:
            raise InputError(f"record {record.get('id')!r} has no read-out tokens to draw")
        raise InputError(
            f"record {record.get('id')!r} holds no target trajectory; score it with {named('tokens')} and "
            f"{named('layer_target')} to draw the probability and rank of each token at every layer"
        )
    return np.asarray(record[TARGET_LOGPROBS], dtype=float), np.asarray(record[TARGET_RANKS], dtype=np.int64)


def _labels(record: dict[str, Any], picked: list[int]) -> list[str]:
    tokens = record.get("tokens")
    if tokens is not None and len(tokens) > max(picked):
        return [str(tokens[t]) for t in picked]
    ids = record.get("token_ids")
    return [f"#{ids[t]}" if ids is not None else str(t) for t in picked]


def _grid(ax: Any, probs: Any, rank: Any, labels: list[str]) -> None:
    import numpy as np

    n_tokens, n_layers = probs.shape
    extent = (-0.5, n_tokens - 0.5, 0.5, n_layers + 0.5)
    image = ax.imshow(probs.T, aspect="auto", origin="lower", cmap="Blues", vmin=0.0, vmax=1.0, extent=extent)
    if n_tokens <= _ANNOTATE:
        for t in range(n_tokens):
            for layer in range(1, n_layers + 1):
                value = int(rank[t, layer - 1])
                colour = "white" if probs[t, layer - 1] > 0.6 else "black"
                said = str(value) if value < 1000 else f"{value / 1000:.0f}k"
                ax.text(
                    t, layer, said, ha="center", va="center", fontsize=5, color=colour, family="monospace"
                )
    ax.set_xticks(np.arange(n_tokens), labels, rotation=90, fontsize=8)
    ax.set_xlabel("read-out token (cell: its rank, 0 = most probable)")
    ax.set_ylabel("layer")
    ax.figure.colorbar(image, ax=ax, fraction=0.025, pad=0.01, label="probability of the read-out token")


def _lines(ax: Any, probs: Any, rank: Any) -> None:
    import numpy as np

    layers = np.arange(1, probs.shape[1] + 1)
    for row in probs:
        ax.plot(layers, row, color="#1f77b4", alpha=min(0.5, 3.0 / len(probs)), linewidth=0.6)
    ax.plot(layers, np.median(probs, axis=0), color="#1f77b4", linewidth=2, label="median probability")
    ax.set_ylim(0, 1)
    ax.set_xlabel("layer")
    ax.set_ylabel("probability", color="#1f77b4")
    twin = ax.twinx()
    twin.plot(layers, np.median(rank, axis=0) + 1, color="#d62728", linewidth=1.5, label="median rank + 1")
    twin.set_yscale("log")
    twin.set_ylabel("rank + 1 (log)", color="#d62728")
    top = max(2.0, float(rank.max()) + 1)
    twin.set_ylim(top * 1.5, 0.8)  # rank 0 on top, as a probability near 1 is
    ax.legend(loc="upper left", fontsize=7, frameon=False)
    twin.legend(loc="lower right", fontsize=7, frameon=False)


def _tracked(ax: Any, probs: Any, record: dict[str, Any], labels: Sequence[str] | None) -> None:
    """Each tracked id's mean probability over the tokens drawn, by layer; probs [T', L, M]."""
    import numpy as np

    layers = np.arange(1, probs.shape[1] + 1)
    names = list(labels) if labels is not None else _track_names(record, probs.shape[2])
    if len(names) != probs.shape[2]:
        raise InputError(
            setting="track_labels",
            value=list(names),
            requirement=f"must name each of the {probs.shape[2]} tracked ids, in the order of the track",
        )
    for m, name in enumerate(names):
        ax.plot(layers, probs[:, :, m].mean(axis=0), linewidth=1.2, label=name)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean probability")
    ax.set_title("tracked token ids", fontsize=9, loc="left")
    ax.legend(fontsize=7, frameon=False, ncol=max(1, math.ceil(len(names) / 8)))


def _track_names(record: dict[str, Any], count: int) -> list[str]:
    """``#id`` of each tracked id where the record says them (``track``), else ``track[m]``."""
    track = record.get("track")
    if track is not None and len(track) == count:
        return [f"#{i}" for i in track]
    return [f"track[{m}]" for m in range(count)]
