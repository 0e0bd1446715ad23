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
from depthlens.viz import grid

_NEEDED = ("tokens", "divergence", "settling_depth", "deep")
_SHALLOW, _DEEP = "#2ca02c", "#1f77b4"  # green: settles before the deep regime; blue: a deep-thinking token
_HEATMAP_PANEL, _LENS_PANEL = (
    48,
    32,
)  # tokens per panel of a new figure: a 64-token record reads at one glance


def _needs(record: dict[str, Any], fields: tuple[str, ...], column: str, how: str) -> None:
    missing = [k for k in fields if k not in record]
    if missing:
        raise InputError(f"record {record.get('id')!r} lacks {missing}; score it with {how}")
    if len(record[column]) == 0:  # a list, or a (T, L) array from depthlens.to_pandas
        raise InputError(f"record {record.get('id')!r} has no completion tokens to draw")


def draw_divergence_heatmap(
    record: dict[str, Any],
    path: str | Path | None = None,
    title: str | None = None,
    *,
    ax: Any = None,
    layers: grid.Selection = None,
    tokens: grid.Selection = None,
    format: str | None = None,
    dpi: int = 150,
) -> Any:
    """Draw D_{t,l} (tokens across, layers up) with each token's settling depth marked; return the Figure.

    ``record``: a scored record (``table.to_pylist()[i]``, ``record.json``) or a row of ``depthlens.to_pandas``.
    ``ax``: draw into this matplotlib Axes (its figure is returned; a colour bar is added beside it); else a new
    figure, its tokens wrapped into panels of about 48 (at most 4 panels, 40 inches wide: past that the cells narrow
    and the labels thin out) so that a long record stays readable. ``layers`` (1..L)
    and ``tokens`` (0..T−1): which to draw — one index, a range or a list (default: all); a settling depth is
    marked where its layer is drawn. ``path``: also write the figure there, as ``format`` (png, svg, pdf) or as
    the path's suffix says."""
    _needs(record, _NEEDED, "divergence", f"{named('tokens', True)} to draw a heatmap")
    import numpy as np

    table = np.asarray(record["divergence"], dtype=float)  # [T, L]
    rows = grid.chosen(layers, 1, table.shape[1], "layers", "layer")
    cols = grid.chosen(tokens, 0, table.shape[0], "tokens", "token")
    parts = grid.panels(cols, _HEATMAP_PANEL)
    if ax is None:
        width = grid.panel_width(max(map(len, parts)), 0.3, 2.4)
        fig, axes = grid.new_figure(width, len(parts) * (0.16 * len(rows) + 1.6) + 0.5, len(parts))
    else:
        fig, axes, parts = ax.figure, [ax], [cols]
    labels = [str(t) for t in record["tokens"]]
    depth, deep = np.asarray(record["settling_depth"]), np.asarray(record["deep"], dtype=bool)
    for panel, part in zip(axes, parts, strict=True):
        image = panel.imshow(
            table[np.ix_(part, [r - 1 for r in rows])].T,
            cmap="magma_r",
            vmin=0.0,
            vmax=1.0,
            **_cells(part, rows),
        )
        _settling_marks(panel, part, rows, depth, deep)
        _axes_labels(panel, part, rows, labels)
    dtr = record.get("dtr")
    heading = title or f"{record.get('id')}: JSD to the final layer (bits)" + (
        f"; DTR = {dtr:.2f}" if dtr is not None else ""
    )
    axes[0].set_title(heading, fontsize=10, loc="left", pad=16)
    # Above the axes, so it never hides the top layers' dots; one marker per colour, as the caption says.
    axes[0].legend(
        loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=7, frameon=False, borderaxespad=0.2
    )
    fig.colorbar(image, ax=axes, fraction=0.025 if ax is None else 0.05, pad=0.01, label="divergence")
    grid.save(fig, path, format, dpi)
    return fig


def _cells(cols: list[int], rows: list[int]) -> dict[str, Any]:
    """imshow's settings for a grid of cells centred on 0..len − 1 both ways, layers up."""
    extent = (-0.5, len(cols) - 0.5, -0.5, len(rows) - 0.5)
    return {"aspect": "auto", "origin": "lower", "extent": extent, "interpolation": "nearest"}


def _settling_marks(ax: Any, cols: list[int], rows: list[int], depth: Any, deep: Any) -> None:
    """Each drawn token's settling depth as a dot in its layer's row (where that layer is drawn)."""
    row_of = {layer: i for i, layer in enumerate(rows)}
    shown = [(x, row_of[int(depth[t])], bool(deep[t])) for x, t in enumerate(cols) if int(depth[t]) in row_of]
    for want, colour, label in (
        (False, _SHALLOW, "settling depth"),
        (True, _DEEP, "settling depth, deep-thinking"),
    ):
        points = [(x, y) for x, y, is_deep in shown if is_deep == want]
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.scatter(xs, ys, s=14, c=colour, edgecolors="white", linewidths=0.5, zorder=3, label=label)


def _axes_labels(ax: Any, cols: list[int], rows: list[int], labels: list[str]) -> None:
    """Token labels across and layer numbers up, thinned to what the cells leave room for; white lines where the
    drawn tokens skip some."""
    width_pt, height_pt = grid.cell_points(ax, len(cols), len(rows))
    grid.label_tokens(ax, [labels[t] if t < len(labels) else str(t) for t in cols], width_pt)
    grid.label_layers(ax, rows, height_pt)
    for x in grid.gaps(cols):
        ax.axvline(x, color="white", linewidth=2.0)
    ax.set_ylabel("layer")


def draw_logit_lens(
    record: dict[str, Any],
    path: str | Path | None = None,
    title: str | None = None,
    *,
    ax: Any = None,
    layers: grid.Selection = None,
    tokens: grid.Selection = None,
    format: str | None = None,
    dpi: int = 150,
) -> Any:
    """Draw the logit lens's classic grid and return the Figure: tokens across, layers up, each cell the layer's
    most probable next token, shaded by its probability. Needs ``layer_top_tokens`` and ``layer_top_probs``
    ([T][L][K]: ``score --tokens --layer-top-k K`` with a tokenizer at hand).

    ``ax``, ``layers``, ``tokens``, ``path``, ``format``: as ``draw_divergence_heatmap`` (a new figure wraps the
    tokens into panels of about 32). Each cell's text is sized to its cell and cut to fit (…); cells too small
    for legible text are left as colour only — choose fewer ``tokens`` or a larger Axes to read them."""
    _needs(
        record,
        ("tokens", "layer_top_tokens", "layer_top_probs"),
        "layer_top_tokens",
        f"{named('tokens', True)} {named('layer_top_k', Written('K'))} to draw the logit lens",
    )
    import numpy as np

    probs = np.asarray(record["layer_top_probs"], dtype=float)[:, :, 0]  # [T, L]: top-1 probability
    rows = grid.chosen(layers, 1, probs.shape[1], "layers", "layer")
    cols = grid.chosen(tokens, 0, probs.shape[0], "tokens", "token")
    parts = grid.panels(cols, _LENS_PANEL)
    if ax is None:
        width = grid.panel_width(max(map(len, parts)), 0.5, 1.8)
        fig, axes = grid.new_figure(width, len(parts) * (0.21 * len(rows) + 1.3) + 0.6, len(parts))
    else:
        fig, axes, parts = ax.figure, [ax], [cols]
    labels = [str(t) for t in record["tokens"]]
    for panel, part in zip(axes, parts, strict=True):
        image = panel.imshow(
            probs[np.ix_(part, [r - 1 for r in rows])].T,
            cmap="Blues",
            vmin=0.0,
            vmax=1.0,
            **_cells(part, rows),
        )
        _cell_tokens(panel, record["layer_top_tokens"], probs, part, rows)
        _axes_labels(panel, part, rows, labels)
    axes[-1].set_xlabel("completion token (each cell: what that layer predicted in its place)")
    heading = title or f"{record.get('id')}: each layer's top-1 token (logit lens)"
    axes[0].set_title(heading, fontsize=10, loc="left")
    fig.colorbar(image, ax=axes, fraction=0.025 if ax is None else 0.05, pad=0.01, label="top-1 probability")
    grid.save(fig, path, format, dpi)
    return fig


def _cell_tokens(ax: Any, top_tokens: Any, probs: Any, cols: list[int], rows: list[int]) -> None:
    """Each cell's top-1 token, as large as the cell lets it be read and cut to fit; none where no size fits."""
    texts = [[str(top_tokens[t][layer - 1][0]) for layer in rows] for t in cols]
    longest = max((len(x) for column in texts for x in column), default=1)
    size, chars = grid.cell_text(*grid.cell_points(ax, len(cols), len(rows)), longest)
    if not size:
        return
    for x, (t, column) in enumerate(zip(cols, texts, strict=True)):
        for y, (layer, text) in enumerate(zip(rows, column, strict=True)):
            shown = text if len(text) <= chars else text[: max(chars - 1, 1)] + "…"
            colour = "white" if probs[t, layer - 1] > 0.6 else "black"
            ax.text(x, y, shown, ha="center", va="center", fontsize=size, color=colour, family="monospace")


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
