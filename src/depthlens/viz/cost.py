"""Figure 5: accuracy against tokens per question, one point per voting method, labels a reader can read.

Methods that land on the same point (the DeepConf scores coincide on responses shorter than their window) share
one point and one label; labels sit in a column right of the plot, spread so none overlaps another, each with a
thin line to its point. The vertical bars are 95 % intervals of the accuracy over resampled questions (within
[0, 100] by construction); a summary written before those were stored shows mean ± draw s.d. over trials, clipped to
[0, 100] and said so in the axis label. Drawing only: every number arrives computed.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from depthlens.errors import InputError
from depthlens.viz.study import _pyplot

COLOURS = {"think@n": "#d62728", "cons@n": "#1f77b4", "random@n": "#2ca02c"}  # random@n: Think@n's control


def shown(row: dict[str, Any], field: str) -> float:
    """A method's ``accuracy`` or ``cost`` as drawn: its exact expectation over every draw where the summary has it
    (what the intervals and tests are on), else the trials' mean (an older summary, an online replay)."""
    exact = row.get(f"{field}_exact")
    return float(exact if exact is not None else row[f"{field}_mean"])


def merged_label(methods: Sequence[str]) -> str:
    """One label for methods that share a point: names differing only in their last ``-`` part are written once
    (``deepconf-low-{mean, tail}@n``), the rest joined by `` = ``."""
    families: dict[tuple[str, str], list[str]] = {}
    for m in methods:
        stem, at, rest = m.partition("@")
        head, _, last = stem.rpartition("-")
        families.setdefault((head, at + rest), []).append(last)
    parts = []
    for (head, ending), lasts in families.items():
        if len(lasts) == 1 or not head:
            parts += [f"{head}-{last}{ending}" if head else f"{last}{ending}" for last in lasts]
        else:
            parts.append(f"{head}-{{{', '.join(lasts)}}}{ending}")
    return " = ".join(parts)


def wrapped(label: str, width: int = 34) -> str:
    """The label broken at spaces into lines of at most ``width`` characters (a longer name stays whole)."""
    return "\n".join(textwrap.wrap(label, width, break_long_words=False, break_on_hyphens=False)) or label


def dodge(costs: Sequence[float], step: float) -> list[float]:
    """Points closer in cost than ``step`` drawn side by side, ``step`` apart around their mean cost, so their
    bars do not overprint (the axis label says so)."""
    order = sorted(range(len(costs)), key=lambda i: costs[i])
    clusters: list[list[int]] = []
    for i in order:
        if clusters and costs[i] - costs[clusters[-1][-1]] < step:
            clusters[-1].append(i)
        else:
            clusters.append([i])
    out = list(costs)
    for members in clusters:
        centre = sum(costs[i] for i in members) / len(members)
        for k, i in enumerate(members):
            out[i] = centre + (k - (len(members) - 1) / 2) * step
    return out


def group_points(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows at the same accuracy (0.05 points) and cost (0.5 tokens) merged into one point with every method."""
    groups: dict[tuple[float, float], dict[str, Any]] = {}
    for r in rows:
        key = (round(2000 * shown(r, "accuracy")), round(2 * shown(r, "cost")))
        if key in groups:
            groups[key]["methods"].append(r["method"])
        else:
            groups[key] = {**r, "methods": [r["method"]]}
    return list(groups.values())


def accuracy_interval(row: dict[str, Any]) -> tuple[float, float, bool]:
    """(low, high) in %, within [0, 100], and whether it is the stored 95 % interval (else ± draw s.d., clipped)."""
    if row.get("accuracy_lo") is not None and row.get("accuracy_hi") is not None:
        return 100 * row["accuracy_lo"], 100 * row["accuracy_hi"], True
    mean, std = 100 * shown(row, "accuracy"), 100 * (row.get("accuracy_std") or 0.0)
    return max(0.0, mean - std), min(100.0, mean + std), False


def spread_labels(
    wanted: Sequence[float],
    sizes: Sequence[float],
    low: float,
    high: float,
    xs: Sequence[float] | None = None,
) -> list[float]:
    """Label centres as near ``wanted`` as possible with no two overlapping (label i is ``sizes[i]`` tall), inside
    [low, high] when they fit there. Points at one height stack leftmost on top (``xs``), so the lines from the
    points to the labels on the right do not cross."""
    xs = xs if xs is not None else [0.0] * len(wanted)
    order = sorted(range(len(wanted)), key=lambda i: (wanted[i], -xs[i]))
    placed = [wanted[i] for i in order]
    size = [sizes[i] for i in order]
    for k in range(len(placed)):  # push up clear of the one below
        floor = low + size[k] / 2 if k == 0 else placed[k - 1] + (size[k - 1] + size[k]) / 2
        placed[k] = max(placed[k], floor)
    for k in range(len(placed) - 1, -1, -1):  # then down clear of the one above, and of the top
        ceiling = high - size[k] / 2 if k == len(placed) - 1 else placed[k + 1] - (size[k + 1] + size[k]) / 2
        placed[k] = min(placed[k], ceiling)
    out = [0.0] * len(wanted)
    for k, i in enumerate(order):
        out[i] = placed[k]
    return out


def draw_accuracy_cost(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Figure 5 (see the module docstring); PNG or SVG by the path's suffix."""
    path = Path(path)
    if not rows:
        raise InputError("no Think@n summary rows to draw")
    plt = _pyplot()
    points = group_points(rows)
    labels = [wrapped(merged_label(p["methods"])) for p in points]
    fig, ax = plt.subplots(figsize=(8.6, max(4.8, 0.16 * sum(1 + lb.count("\n") for lb in labels) + 1.2)))
    intervals = [accuracy_interval(p) for p in points]
    costs = [shown(p, "cost") for p in points]
    span = (max(costs) - min(costs)) or max(costs) or 1.0
    xs = dodge(costs, 0.025 * span)
    for p, x, (lo, hi, _) in zip(points, xs, intervals, strict=True):
        colour = next((COLOURS[m] for m in p["methods"] if m in COLOURS), "#555555")
        y = 100 * shown(p, "accuracy")
        ax.errorbar(
            x,
            y,
            yerr=[[y - lo], [hi - y]],
            fmt="o",
            capsize=3,
            color=colour,
            lw=1.2,
            ms=7 if colour != "#555555" else 5,
        )
    bottom = max(0.0, min(lo for lo, _, _ in intervals) - 5)
    top = min(100.0, max(hi for _, hi, _ in intervals) + 5)
    ax.set_ylim(bottom, top)
    fig.subplots_adjust(left=0.09, right=0.60, top=0.92, bottom=0.11)
    line = (top - bottom) * 0.16 / (fig.get_figheight() * 0.81)  # one 8-point text line, in data units
    sizes = [line * (1.25 + lb.count("\n")) for lb in labels]
    heights = spread_labels([100 * shown(p, "accuracy") for p in points], sizes, bottom, top, xs)
    for p, x, label, h in zip(points, xs, labels, heights, strict=True):
        bold = any(m in COLOURS for m in p["methods"])
        ax.annotate(
            label,
            xy=(x, 100 * shown(p, "accuracy")),
            xytext=(1.03, h),
            textcoords=("axes fraction", "data"),
            va="center",
            fontsize=8,
            weight="bold" if bold else "normal",
            annotation_clip=False,
            arrowprops={"arrowstyle": "-", "color": "#bbbbbb", "lw": 0.6},
        )
    stored = all(ok for _, _, ok in intervals)
    ax.margins(x=0.08)
    ax.set_xlabel(
        "tokens generated per question" + (" (equal costs drawn side by side)" if xs != costs else "")
    )
    ax.set_ylabel(
        "accuracy %  (" + ("95 % interval over questions" if stored else "± draw s.d. over trials") + ")"
    )
    ax.set_title(title or "accuracy vs cost per method", fontsize=10)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def _accuracy_cell(row: dict[str, Any]) -> str:
    if row.get("accuracy_lo") is None:
        return f"{100 * row['accuracy_mean']:.1f} ± {100 * (row.get('accuracy_std') or 0):.1f} (draw s.d.)"
    return (
        f"{100 * shown(row, 'accuracy'):.1f} [{100 * row['accuracy_lo']:.1f}, {100 * row['accuracy_hi']:.1f}]"
    )


def _trials_cell(row: dict[str, Any]) -> str:
    """The trials' mean ± draw s.d. beside an exact expectation (— where the accuracy shown is the trials')."""
    if row.get("accuracy_exact") is None:
        return "—"
    return f"{100 * row['accuracy_mean']:.1f} ± {100 * (row.get('accuracy_std') or 0):.1f}"


GAPS_COLUMN = "95 % interval vs the paper's +2.0 / +3.3"


TABLE_TWO_LEGEND = (
    "Accuracy: the exact expectation over every draw of n from each question's pool (definitions.md §5; a seeded "
    "sample of draws where there are more than 10⁵ per question, the summary's `draws_all`), [95 % interval over "
    "resampled questions]; trials: the mean ± draw s.d. of the seeded trials beside it (older summaries: the trials' "
    "mean alone). Δ: the method minus Cons@n on the same questions (each question's exact expectation), "
    "paired-bootstrap interval; p: sign-flip permutation test "
    "over questions (exact McNemar when outcomes are 0/1); p_BH: Benjamini–Hochberg over every comparison in "
    "these tables, † < 0.05. The last column: whether that 95 % interval includes or excludes the paper's "
    "Think@n − Cons@n gaps on AIME25 (+2.0 and +3.3 points) — the verdict on the paper's claim. random@n is "
    "Think@n's control: a vote over a random ⌈η·n⌉ of the same draw (the exact expectation over its subsets); "
    "Think@n − random@n is below, judged against 0. Short@n (length alone) and think-strata@n (prefix DTR ranked "
    "within the draw's length strata) stand beside them. The power to detect the gaps, and the questions 80 % "
    "power would take, are planning numbers kept in the summary CSVs (power_gap*, questions_for_gap*)."
)
POOLED_HEAD = (
    "**Pooled over each model's stores** (every question of every family; p_BH over the methods of one "
    "model):"
)
CONTROL_HEAD = (
    "**Think@n − random@n, the control** (does DTR select better than a random vote of the same size? one "
    "sign-flip test over questions per row, outside the families above, its interval against 0 — the paper's "
    "+2.0 / +3.3 are Think@n − Cons@n gaps, not a control's; pooled: every question of the model's stores):"
)


def _tested(r: dict[str, Any]) -> dict[str, str]:
    """The difference from Cons@n and its test, in column order."""
    from depthlens.studies.tables import paired_cells

    cells = paired_cells(r)
    return {"Δ vs Cons@n, points [95 %]": cells.difference, "p": cells.p, "p_BH": cells.p_bh}


def _store_row(r: dict[str, Any]) -> dict[str, str]:
    """A method's row of its store's Table 2."""
    from depthlens.studies.tables import paired_cells

    return {
        "method": r["method"],
        "accuracy % [95 %]": _accuracy_cell(r),
        "trials ± s.d.": _trials_cell(r),
        "tokens / question": f"{shown(r, 'cost'):,.0f}",
        "cost vs Cons@n": f"{r['cost_vs_cons']:.0%}" if r.get("cost_vs_cons") else "—",
        **_tested(r),
        GAPS_COLUMN: paired_cells(r).gaps,
    }


def _pooled_row(r: dict[str, Any]) -> dict[str, str]:
    """A method's row of the table pooled over a model's stores."""
    from depthlens.studies.tables import paired_cells

    return {
        "model": r["model"],
        "stores": r["stores"],
        "method": r["method"],
        **_tested(r),
        "won / lost": f"{r['wins']} / {r['losses']}",
        GAPS_COLUMN: paired_cells(r).gaps,
    }


def _control_row(r: dict[str, Any]) -> dict[str, str]:
    """Think@n − random@n on a store, or pooled over a model's stores."""
    from depthlens.studies.tables import paired_cells

    cells = paired_cells(r)
    return {
        "stores": r.get("store") or f"{r['model']} ({r['stores']} pooled)",
        "Δ points [95 %]": cells.difference,
        "p": cells.p,
        "won / lost": f"{r['wins']} / {r['losses']}",
        "95 % interval vs 0 (no selection effect)": cells.gaps,
    }


def table_two_markdown(
    rows: Sequence[dict[str, Any]],
    pooled: Sequence[dict[str, Any]],
    control: Sequence[dict[str, Any]] = (),
    pooled_control: Sequence[dict[str, Any]] = (),
) -> list[str]:
    """Table 2 (every store's methods with the paired test against Cons@n), the per-model pooled table, and
    Think@n − random@n per store and per model, as Markdown lines; ``p_bh`` must already be the adjustment over
    ``rows`` (and, per model, over ``pooled``)."""
    from depthlens.studies.tables import markdown_table

    by_store: dict[str, list[dict[str, str]]] = {}
    for r in rows:  # one table per store: its model and task said once above it, not in each of its rows
        by_store.setdefault(r["store"], []).append(_store_row(r))
    lines = ["## Think@n and the baselines (Table 2)", "", TABLE_TWO_LEGEND, ""]
    for store, table in by_store.items():
        lines += [f"**{store}**", "", markdown_table(table), ""]
    if pooled:
        lines += [POOLED_HEAD, "", markdown_table([_pooled_row(r) for r in pooled]), ""]
    if control or pooled_control:
        lines += [
            CONTROL_HEAD,
            "",
            markdown_table([_control_row(r) for r in [*control, *pooled_control]]),
            "",
        ]
    return lines
