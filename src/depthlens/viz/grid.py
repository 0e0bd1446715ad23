"""What the token × layer drawers share: which layers and tokens to draw (``layers=`` / ``tokens=``), a layout that
stays readable at any length (tokens wrapped into panels, each cell's text sized from the cell, tick labels thinned
where they would overlap), and where the figure goes (the caller's Axes, a PNG or an SVG).

Figures are built with ``matplotlib.figure.Figure``, not pyplot: nothing is left open in pyplot's registry and the
caller's backend (a notebook's inline one) is never switched.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from depthlens.errors import InputError

Selection = int | Iterable[int] | None  # layers= / tokens=: one index, a range, a list or an array of them
FORMATS = ("png", "svg", "pdf")
LABEL_PT = 8.0  # tick labels: the size a printed figure's labels have
MIN_TEXT_PT = 4.5  # cell text smaller than this cannot be read at any zoom a reader uses: left out
MAX_TEXT_PT = 8.0
MAX_PANELS, MAX_WIDTH = 4, 40.0  # a new figure's rows of tokens and its width (inches): a page, not a banner
CHAR_EM = 0.62  # a monospace glyph's advance, in em (DejaVu Sans Mono: 0.602)


def chosen(selection: Selection, first: int, count: int, setting: str, unit: str) -> list[int]:
    """The indices ``selection`` names (one, or an iterable), ascending, each in ``first`` .. ``first + count − 1``
    (layers 1..L, tokens 0..T−1); refused naming ``setting`` where one is outside, repeated or not a whole number."""
    last = first + count - 1
    if selection is None:
        return list(range(first, last + 1))
    items = [selection] if isinstance(selection, numbers.Integral) else selection
    if isinstance(items, str | bytes | dict) or not isinstance(items, Iterable):
        raise _refused(
            setting, selection, f"give a {unit} index, a range or a list of them ({first}..{last})"
        )
    picked = list(items)
    wrong = [i for i in picked if isinstance(i, bool) or not isinstance(i, numbers.Integral)]
    if wrong:
        raise _refused(
            setting, selection, f"{wrong[0]!r} is not a {unit} index; give whole numbers {first}..{last}"
        )
    outside = [int(i) for i in picked if not first <= int(i) <= last]
    if outside:
        where = f"the record's {unit}s are {first}..{last}"
        raise _refused(setting, selection, f"{unit} {outside[0]} is outside the record: {where}")
    if not picked:
        raise _refused(setting, selection, f"names no {unit}; give at least one of {first}..{last}")
    if len(set(map(int, picked))) < len(picked):
        raise _refused(setting, selection, f"names a {unit} twice; give each once")
    return sorted(int(i) for i in picked)


def _refused(setting: str, value: Any, requirement: str) -> InputError:
    shown = value if isinstance(value, range | int | str | bytes) else _short(value)
    return InputError(setting=setting, value=shown, requirement=requirement)


def _short(value: Any) -> Any:
    try:
        items = list(value)
    except TypeError:
        return value
    return items if len(items) <= 8 else [*items[:8], "…"]


def panels(tokens: Sequence[int], per_panel: int, most: int = MAX_PANELS) -> list[list[int]]:
    """``tokens`` cut into at most ``most`` rows of about ``per_panel`` (64 at 32 a row: 32 + 32), as even as they
    can be; past ``most`` rows the rows grow longer instead (a 1,000-token record: 4 rows of 250)."""
    rows = min(max(1, math.ceil(len(tokens) / per_panel)), most)
    size = math.ceil(len(tokens) / rows)
    return [list(tokens[i : i + size]) for i in range(0, len(tokens), size)]


def panel_width(tokens: int, inch_per_token: float, margin: float) -> float:
    """A new figure's width: ``inch_per_token`` a token, within 6 .. ``MAX_WIDTH`` inches (cells narrow past it,
    and labels thin out)."""
    return min(max(6.0, inch_per_token * tokens + margin), MAX_WIDTH)


def every(room_pt: float, need_pt: float) -> int:
    """Label every k-th tick so that labels ``need_pt`` tall (across) fit in slots ``room_pt`` apart."""
    return max(1, math.ceil(need_pt / max(room_pt, 1e-9)))


def label_tokens(ax: Any, labels: Sequence[str], room_pt: float) -> None:
    """A tick under every token, labelled (rotated) at every k-th so that no two labels overlap (``room_pt``: the
    distance between neighbouring tokens on the page)."""
    step = every(room_pt, LABEL_PT * 1.25)
    shown = [label if i % step == 0 else "" for i, label in enumerate(labels)]
    ax.set_xticks(range(len(labels)), shown, rotation=90, fontsize=LABEL_PT)


def label_layers(ax: Any, layers: Sequence[int], room_pt: float) -> None:
    """Layer numbers up the side: every one where they fit and are few, else round ones (5, 10, …) for a run of
    consecutive layers, every k-th of a hand-picked list."""
    need = every(room_pt, LABEL_PT * 1.25)
    consecutive = all(b == a + 1 for a, b in itertools.pairwise(layers))
    if consecutive and len(layers) > 12:
        step = next(
            (s for s in (2, 5, 10, 20, 50, 100) if s >= need and len(layers) / s <= 12), max(need, 100)
        )
        shown = [str(layer) if layer % step == 0 else "" for layer in layers]
    else:
        shown = [str(layer) if i % need == 0 else "" for i, layer in enumerate(layers)]
    ax.set_yticks(range(len(layers)), shown, fontsize=LABEL_PT)


def cell_points(ax: Any, columns: int, rows: int) -> tuple[float, float]:
    """One cell's width and height in points, from the Axes' size on its figure now."""
    box = ax.get_position()  # in figure fractions
    width_in, height_in = ax.figure.get_size_inches()
    return 72 * width_in * box.width / max(columns, 1), 72 * height_in * box.height / max(rows, 1)


def cell_text(width_pt: float, height_pt: float, longest: int) -> tuple[float, int]:
    """The cell text's size (points) and how many characters of it fit; size 0 where no legible size fits."""
    size = min(MAX_TEXT_PT, 0.62 * height_pt, width_pt / (CHAR_EM * max(min(longest, 6), 1)))
    if size < MIN_TEXT_PT:
        return 0.0, 0
    return size, max(1, int(width_pt / (CHAR_EM * size)))


def gaps(indices: Sequence[int]) -> list[float]:
    """Where a chosen run of indices skips some (``tokens=[0, 1, 2, 40]``): x of a separator between the two."""
    return [i + 0.5 for i, (a, b) in enumerate(itertools.pairwise(indices)) if b != a + 1]


def new_figure(width: float, height: float, rows: int = 1) -> tuple[Any, list[Any]]:
    """A figure of ``rows`` stacked Axes (panels of tokens) laid out by matplotlib's constrained layout."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(rows, 1, squeeze=False)[:, 0]
    return fig, list(axes)


def save(fig: Any, path: str | Path | None, fmt: str | None, dpi: int) -> None:
    """Write ``fig`` to ``path`` where one is given: as ``fmt`` (png, svg, pdf), else as the path's suffix says.
    An SVG keeps its text as text (searchable, a fraction of the size of glyphs drawn as paths)."""
    if path is None:
        if fmt is not None:
            raise InputError(
                setting="format", value=fmt, requirement="a format needs a path to write to (path=)"
            )
        return
    path = Path(path)
    suffix = path.suffix.lower().lstrip(".")
    if fmt is not None and fmt.lower() not in FORMATS:
        raise InputError(setting="format", value=fmt, requirement=f"must be one of {', '.join(FORMATS)}")
    if fmt is None and suffix not in FORMATS:
        raise InputError(
            setting="path",
            value=str(path),
            requirement=f"end it in .{', .'.join(FORMATS)}, or give format='png' (or svg, pdf)",
        )
    fmt = (fmt or suffix).lower()
    if suffix in FORMATS and suffix != fmt:
        raise InputError(
            setting="format", value=fmt, requirement=f"the path {path.name} says {suffix}; make them agree"
        )
    import matplotlib

    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(path, format=fmt, dpi=dpi)
