"""Token × layer divergence heatmap of one scored record (the paper's Figure 2), from its saved JSON; with each
layer's top-k (``--layer-top-k``), the logit lens's own picture too: every cell's top-1 token (``draw_logit_lens``)
and each cell's top-k listed on the page.

Needs a record written with ``depthlens score --tokens`` (fields ``tokens``, ``divergence``,
``settling_depth``, ``deep``); its ``tokens`` are already readable labels (``models.tokens.token_texts``), and so are
its ``layer_top_tokens`` where it has them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthlens.errors import InputError, Written, named

_NEEDED = ("tokens", "divergence", "settling_depth", "deep")
_SHALLOW, _DEEP = "#2ca02c", "#1f77b4"  # green: settles before the deep regime; blue: a deep-thinking token


def draw_divergence_heatmap(record: dict[str, Any], path: str | Path, title: str | None = None) -> Path:
    """Write a PNG/SVG (by ``path``'s suffix) of D_{t,l} with each token's settling depth marked. ``record``: a
    scored record (``table.to_pylist()[i]``, ``record.json``) or a row of ``depthlens.to_pandas(table)``."""
    path = Path(path)
    missing = [k for k in _NEEDED if k not in record]
    if missing:
        raise InputError(
            f"record {record.get('id')!r} lacks {missing}; score it with {named('tokens', True)} to draw a heatmap"
        )
    if len(record["divergence"]) == 0:  # a list, or a (T, L) array from depthlens.to_pandas
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
    depth, deep = np.asarray(record["settling_depth"]), np.asarray(record["deep"], dtype=bool)
    for mask, colour, label in (
        (~deep, _SHALLOW, "settling depth"),
        (deep, _DEEP, "settling depth, deep-thinking"),
    ):
        ax.scatter(
            xs[mask], depth[mask], s=14, c=colour, edgecolors="white", linewidths=0.5, zorder=3, label=label
        )
    ax.set_xticks(xs, list(record["tokens"]), rotation=90, fontsize=8)
    ax.set_ylabel("layer")
    dtr = record.get("dtr")
    ax.set_title(
        title or f"{record.get('id')}: JSD to the final layer (bits); DTR = {dtr:.2f}",
        fontsize=10,
        loc="left",
        pad=16,
    )
    fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01, label="divergence")
    # Above the axes, so it never hides the top layers' dots; one marker per colour, as the caption says.
    ax.legend(
        loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=7, frameon=False, borderaxespad=0.2
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def draw_logit_lens(record: dict[str, Any], path: str | Path, title: str | None = None) -> Path:
    """Write the logit lens's classic grid (PNG/SVG by ``path``'s suffix): tokens across, layers up, each cell the
    layer's most probable next token, shaded by its probability. Needs ``layer_top_tokens`` and
    ``layer_top_probs`` ([T][L][K]: ``score --tokens --layer-top-k K`` with a tokenizer at hand)."""
    path = Path(path)
    missing = [k for k in ("tokens", "layer_top_tokens", "layer_top_probs") if k not in record]
    if missing:
        raise InputError(
            f"record {record.get('id')!r} lacks {missing}; score it with {named('tokens', True)} "
            f"{named('layer_top_k', Written('K'))} to draw the logit lens"
        )
    if len(record["layer_top_tokens"]) == 0:
        raise InputError(f"record {record.get('id')!r} has no completion tokens to draw")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    probs = np.asarray(record["layer_top_probs"], dtype=float)[:, :, 0].T  # [L, T]: top-1 probability
    n_layers, n_tokens = probs.shape
    fig, ax = plt.subplots(figsize=(min(max(6.0, 0.7 * n_tokens + 2), 60.0), 0.28 * n_layers + 2.2))
    extent = (-0.5, n_tokens - 0.5, 0.5, n_layers + 0.5)
    image = ax.imshow(probs, aspect="auto", origin="lower", cmap="Blues", vmin=0.0, vmax=1.0, extent=extent)
    for t, layers in enumerate(record["layer_top_tokens"]):
        for layer, top in enumerate(layers, start=1):
            colour = "white" if probs[layer - 1, t] > 0.6 else "black"
            ax.text(
                t, layer, top[0][:8], ha="center", va="center", fontsize=5.5, color=colour, family="monospace"
            )
    ax.set_xticks(np.arange(n_tokens), list(record["tokens"]), rotation=90, fontsize=8)
    ax.set_xlabel("completion token (each cell: what that layer predicted in its place)")
    ax.set_ylabel("layer")
    ax.set_title(
        title or f"{record.get('id')}: each layer's top-1 token (logit lens)", fontsize=10, loc="left"
    )
    fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01, label="top-1 probability")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def _top_list(record: dict[str, Any], t: int, layer: int) -> str:
    """The cell's top-k as its tooltip lists them (`` · top: ␣Paris 0.412, ␣the 0.101``), or "" without them."""
    if "layer_top_tokens" not in record or "layer_top_probs" not in record:
        return ""
    pairs = zip(
        record["layer_top_tokens"][t][layer - 1], record["layer_top_probs"][t][layer - 1], strict=True
    )
    return " · top: " + ", ".join(f"{tok} {p:.3f}" for tok, p in pairs)


def _colour(value: float, vmax: float) -> str:
    # The magma_r look without matplotlib: light (settled) → dark purple (far from the final layer).
    x = min(max(value / vmax, 0.0), 1.0) if vmax > 0 else 0.0
    stops = [(252, 253, 191), (254, 159, 109), (222, 73, 104), (140, 41, 129), (59, 15, 112), (0, 0, 4)]
    pos = x * (len(stops) - 1)
    i = min(int(pos), len(stops) - 2)
    f = pos - i
    r, g, b = (round(a + (c - a) * f) for a, c in zip(stops[i], stops[i + 1], strict=True))
    return f"rgb({r},{g},{b})"


_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{heading}</title>
<style>
body {{ font: 13px system-ui, sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; }}
td {{ width: 16px; height: 9px; padding: 0; }}
td.settle {{ outline: 2px solid #2ca02c; outline-offset: -2px; }}
td.deep {{ outline-color: #1f77b4; }}
th.tok {{ writing-mode: vertical-rl; transform: rotate(180deg); font: 11px ui-monospace, monospace;
  font-weight: normal; padding: 2px 0; text-align: left; white-space: pre; }}
th.layer {{ font: 10px ui-monospace, monospace; font-weight: normal; padding-right: 4px; text-align: right; }}
td:hover {{ outline: 2px solid #000; }}
.scale span.bar {{ display: inline-block; width: 240px; height: 12px; vertical-align: middle; margin: 0 6px;
  border: 1px solid #ccc; }}
</style></head><body>
<h3>{heading}</h3>
<p>Rows: layers (top = final). Columns: generated tokens. Hover a cell for its value (and that layer's most probable
next tokens, where the record has them: <code>--layer-top-k</code>). Outlined: the layer where
the token settles (green; blue when it settles only in the deep regime, a deep-thinking token).</p>
<table><tr><th></th>{head}</tr>
{rows}
</table>
<p class="scale">{scale}</p></body></html>
"""
"""The page ``write_heatmap_html`` fills in: one table, styles inline, no script."""


def colour_scale(vmax: float, unit: str) -> str:
    """The page's colour key: a bar from 0 (settled: the final layer's distribution) to ``vmax`` in ``unit``, drawn
    with the cells' own colours."""
    stops = ", ".join(_colour(vmax * i / 10, vmax) for i in range(11))
    return (
        f'divergence ({unit}): 0 <span class="bar" style="background:linear-gradient(to right, {stops})"></span> '
        f"{vmax:.3g}"
    )


def write_heatmap_html(
    record: dict[str, Any], path: str | Path, title: str | None = None, unit: str = "bits"
) -> Path:
    """A self-contained HTML page of the heatmap: hover a cell for token, layer and divergence; settling depths
    outlined (blue = deep-thinking token). No script or network access needed to view it."""
    path = Path(path)
    import html

    missing = [k for k in _NEEDED if k not in record]
    if missing:
        raise InputError(
            f"record {record.get('id')!r} lacks {missing}; score it with {named('tokens', True)} to draw a heatmap"
        )
    table = record["divergence"]
    if not table:
        raise InputError(f"record {record.get('id')!r} has no completion tokens to draw")
    n_layers = len(table[0])
    vmax = 1.0 if unit == "bits" else max(max(row) for row in table) or 1.0
    tokens = list(record["tokens"])
    head = "".join(
        f'<th class="tok" title="token {t}">{html.escape(tok)}</th>' for t, tok in enumerate(tokens)
    )
    rows = []
    for layer in range(n_layers, 0, -1):
        cells = []
        for t, row in enumerate(table):
            value = row[layer - 1]
            settled = record["settling_depth"][t] == layer
            mark = (' class="settle deep"' if record["deep"][t] else ' class="settle"') if settled else ""
            tip = (
                f"{tokens[t]} · layer {layer} · D = {value:.3f} {unit}"
                + (" · settles here" if settled else "")
                + _top_list(record, t, layer)
            )
            cells.append(
                f'<td{mark} style="background:{_colour(value, vmax)}" title="{html.escape(tip)}"></td>'
            )
        rows.append(f'<tr><th class="layer">{layer}</th>{"".join(cells)}</tr>')
    dtr = record.get("dtr")
    heading = title or f"{record.get('id')}: divergence to the final layer ({unit})" + (
        f"; DTR = {dtr:.2f}" if dtr is not None else ""
    )
    page = _PAGE.format(
        heading=html.escape(heading), head=head, rows=chr(10).join(rows), scale=colour_scale(vmax, unit)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
