"""Tables out of study rows: CSV files, Markdown, and the cells every table of inference results prints.

The formatting of a p-value (``format_p``) and of one paired comparison with Cons@n (``paired_cells``: the
difference and its interval, p and p_BH, the power) lives only here; the report's Markdown (``viz.cost``),
``thinkn``'s rich table (``cli/paired_view.py``) and ``view``'s paired table take their cells from it.
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import io
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from depthlens.errors import StoreError
from depthlens.studies.comparisons import CONTROL, PAPER_GAPS


def format_p(p: float | None) -> str:
    """A p-value as a reader scans it: 2 significant digits, '<0.001' below."""
    if p is None:
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.2g}" if p < 0.1 else f"{p:.2f}"


def write_whole(path: str | Path, text: str) -> Path:
    """Write a study's file whole or not at all: to a temporary name beside it, fsynced, then renamed over ``path``
    — a full disk leaves no 0-byte or half-written file (and an older one as it was), and the error names it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise StoreError(
                f"{path}: the disk is full, so it was not written (nothing half-written is left); free some "
                "space, then run the command again"
            ) from exc
        raise StoreError(
            f"{path}: could not write ({exc.strerror or exc}); check the path and its permissions"
        ) from exc
    return path


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Rows as CSV, written whole (``write_whole``); the header is every key, in the order first met (a row
    without one leaves its cell empty)."""
    path = Path(path)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
    writer.writeheader()
    writer.writerows(rows)
    return write_whole(path, text.getvalue())


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.3f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table of ``rows`` (all keys of the first row, or ``columns``)."""
    if not rows:
        return "(no rows)\n"
    columns = list(columns or rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_study(out_dir: str | Path, name: str, result: dict[str, Any], command: str) -> list[Path]:
    """``<name>.csv`` (rows), ``<name>.json`` (summary + command) and ``<name>.md`` (the summary table)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = result["summary"]
    paths = [write_csv(out_dir / f"{name}.csv", result["rows"])]
    write_whole(
        out_dir / f"{name}.json", json.dumps({"summary": summary, "command": command}, indent=2) + "\n"
    )
    table = markdown_table(summary if isinstance(summary, list) else [summary])
    write_whole(out_dir / f"{name}.md", f"# {name}\n\n`{command}`\n\n{table}")
    return [*paths, out_dir / f"{name}.json", out_dir / f"{name}.md"]


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:+.{digits}f}"


def _ci(lo: float | None, hi: float | None) -> str:
    return "" if lo is None or hi is None else f" [{lo:+.2f}, {hi:+.2f}]"


P_LEGEND = (
    "p: two-sided p of r = 0 from the same question resamples; p_BH: Benjamini–Hochberg adjusted over every cell "
    "of this table (one family per statistic); † marks p_BH < 0.05"
)


def _p(row: dict[str, Any], field: str, lead: str = "; ") -> str:
    """`` p 0.012, p_BH 0.04†`` for a cell with a test; nothing for one without (older rows, no statistic)."""
    if row.get(field) is None:
        return ""
    adjusted = row.get(f"{field}_bh")
    text = f"{lead}p {format_p(row[field])}"
    if adjusted is not None:
        text += f", p_BH {format_p(adjusted)}" + ("†" if adjusted < 0.05 else "")
    return text


def _binned_cell(r: dict[str, Any]) -> str:
    """Table 1's binned-r cell: r ± its s.d. over seeds [interval] (questions; p)."""
    if r["binned_r"] is None:
        return "—"
    return (
        f"{r['binned_r']:+.2f} ± {r['binned_r_sd']:.2f}{_ci(r.get('binned_r_lo'), r.get('binned_r_hi'))} "
        f"(q={r['questions_used']:.0f}{_p(r, 'binned_r_p')})"
    )


def _unbinned_cell(r: dict[str, Any]) -> str:
    """Table 1's per-response cell: the point-biserial r and Spearman ρ with their intervals and p."""
    if r["point_biserial"] is None:
        return "—"
    pb = f"{_fmt(r['point_biserial'])}{_ci(r['point_biserial_lo'], r['point_biserial_hi'])}"
    rho = f"{_fmt(r['spearman'])}{_ci(r['spearman_lo'], r['spearman_hi'])}"
    return f"r_pb {pb}{_p(r, 'point_biserial_p', ' ')}; ρ {rho}{_p(r, 'spearman_p', ' ')}"


def _within_cell(r: dict[str, Any]) -> str:
    """Table 1's within-question cell: r with correctness (p, questions) and r with length."""
    if r.get("r_within") is None and r.get("r_length_within") is None:
        return "—"
    accuracy = (
        "—"
        if r.get("r_within") is None
        else f"{_fmt(r['r_within'])}{_p(r, 'p_within_perm', ' ')} (q={r['n_questions_within']})"
    )
    return f"{accuracy}; length {_fmt(r.get('r_length_within'))}"


def _length_fixed_cell(r: dict[str, Any]) -> str:
    """Table 1's length-held-fixed cell: the within-question partial r (p) and the length-matched AUC [interval]
    (pairs); — for a row without them (a metric or a table from before they were computed)."""
    if r.get("r_within_partial") is None and r.get("auc_length_matched") is None:
        return "—"
    partial = (
        "—"
        if r.get("r_within_partial") is None
        else f"{_fmt(r['r_within_partial'])}{_p(r, 'p_within_partial', ' ')}"
    )
    auc = r.get("auc_length_matched")
    matched = (
        "—"
        if auc is None
        else f"{auc:.2f}{_ci(r.get('auc_length_matched_lo'), r.get('auc_length_matched_hi'))} "
        f"({r.get('pairs_length_matched', 0)} pairs{_p(r, 'auc_length_matched_p')})"
    )
    return f"partial {partial}; AUC {matched}"


def table_one(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: the paper's binned r (metrics × model · task), then the unbinned statistics with 95 % CIs."""
    columns = list(dict.fromkeys(f"{r['model']} · {r['task']}" for r in rows))
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    labels = {r["metric"]: r["label"] for r in rows}
    cell = {(r["metric"], f"{r['model']} · {r['task']}"): r for r in rows}

    def table(render: Callable[[dict[str, Any]], str]) -> list[str]:
        out = ["| metric | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        for m in metrics:
            out.append(
                f"| {labels[m]} | "
                + " | ".join(render(cell[m, c]) if (m, c) in cell else "n/a" for c in columns)
                + " |"
            )
        return out

    counts = {f"{r['model']} · {r['task']}": r for r in rows}
    lines = [
        "**Binned r** (definitions.md §4: 5 quantile bins per question, Pearson r of bin metric vs bin accuracy, "
        "averaged over questions and seeds; ± is the s.d. over seeds — 0 when each seed bins the whole pool and only "
        "ties are re-broken —, [95 % interval] over question resamples of the per-question r, q the questions with a "
        f"defined r; {P_LEGEND})",
        "",
        *table(_binned_cell),
        "",
        f"**Unbinned, per response**: point-biserial r and Spearman ρ with question-bootstrap 95 % CIs; {P_LEGEND}",
        "",
        *table(_unbinned_cell),
        "",
        "**Within questions**: metric and correctness centred on each question's means, then the point-biserial r "
        "over all responses (q: questions with both right and wrong responses); p from shuffling correctness within "
        "each question (p_BH over the table; † < 0.05); length: the metric's question-centred r with token count "
        "(near ±1: a length proxy)",
        "",
        *table(_within_cell),
        "",
        "**Length held fixed** (definitions.md §4): partial — the within-question partial r with correctness, both "
        "residualised by least squares on question indicators, token count and the cut at the cap (p from shuffling "
        "correctness within each question, p_BH over the table); AUC — right against wrong responses to one question "
        "of similar length (token counts within 10 % of the longer) and the same ending (both cut or neither), the "
        "share of pairs where the right one scores higher (0.5: no signal; [95 %] and p vs 0.5 over resampled "
        "questions)",
        "",
        *table(_length_fixed_cell),
        "",
        "Samples: "
        + "; ".join(
            f"{c}: {r['responses']} responses, {r['questions']} questions, accuracy {100 * r['accuracy']:.0f} %"
            for c, r in counts.items()
        )
        + ".",
    ]
    notes = sorted({f"{r['model']} · {r['task']} · {r['label']}: {r['note']}" for r in rows if r["note"]})
    if notes:
        lines += ["", "Notes:", "", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# One paired comparison with the baseline, as every table prints it.


@dataclasses.dataclass(frozen=True)
class PairedCells:
    """A comparison's cells: ``—`` in each where the row has no comparison (the baseline's own row)."""

    difference: str  # ``+1.2 [-3.0, +5.4]``: points, with the 95 % paired-bootstrap interval
    p: str  # ``0.012``: the sign-flip permutation p
    p_bh: str  # ``0.04†``: Benjamini–Hochberg over the table, † below 0.05
    power: str  # ``0.07 / 0.12``: power to see each of the paper's gaps (PAPER_GAPS), for planning
    needed: str  # ``1,530 / 560``: questions for 80 % power, per gap
    compared: bool
    gaps: str = (
        "—"  # ``excludes +2.0, +3.3``: where the 95 % interval lies against the paper's gaps (the verdict)
    )

    @property
    def tests(self) -> str:
        """``p · p_BH``."""
        return f"{self.p} · {self.p_bh}"

    @property
    def planning(self) -> str:
        """``0.07 / 0.12 (1,530 / 560)``: the power and the questions for 80 % power, or — without a comparison."""
        return f"{self.power} ({self.needed})" if self.compared else "—"


def paired_cells(row: Mapping[str, Any]) -> PairedCells:
    """The cells of a comparison's row (``stats.paired.Comparison.row()``, or a summary's method row)."""
    p, p_bh = row.get("p"), row.get("p_bh")
    flag = "†" if p_bh is not None and p_bh < 0.05 else ""
    tests = format_p(p), "—" if p is None else format_p(p_bh) + flag  # a row without a test: — in both
    if row.get("diff") is None:
        return PairedCells("—", *tests, "—", "—", compared=False)
    lo, hi = row.get("diff_lo"), row.get("diff_hi")
    interval = "" if lo is None or hi is None else f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    power = " / ".join(_number(row.get(f"power_gap{g}"), ".2f") for g in PAPER_GAPS)
    needed = " / ".join(_number(row.get(f"questions_for_gap{g}"), ",") for g in PAPER_GAPS)
    return PairedCells(
        f"{100 * row['diff']:+.1f}{interval}", *tests, power, needed, compared=True, gaps=gap_cell(row)
    )


def paired_title(baseline: str, control: tuple[str, str] | None = None) -> str:
    """The paired table's title (``thinkn``'s, the explorer's); ``control``: (method, its control), the row under
    the line."""
    title = f"vs {baseline} on the same questions (paired)"
    return title + (f"; under the line {control[0]} vs {control[1]}, the control" if control else "")


def gap_cell(row: Mapping[str, Any]) -> str:
    """``excludes +2.0, +3.3`` / ``includes +2.0; excludes +3.3`` / ``includes +2.0, +3.3``: the comparison's 95 %
    interval against the paper's Think@n − Cons@n gaps (``stats.paired.gap_verdict``, or from the interval of a
    row written before ``excludes_gap*`` was kept); against 0 (``excludes 0`` / ``includes 0``) for the control,
    Think@n − random@n, whose question is whether there is any selection effect; — without an interval."""
    lo, hi = row.get("diff_lo"), row.get("diff_hi")
    if lo is None or hi is None:
        return "—"
    if row.get("vs") == CONTROL:
        return "excludes 0" if not (lo <= 0.0 <= hi) else "includes 0"
    out: dict[bool, list[str]] = {True: [], False: []}
    for g, effect in PAPER_GAPS.items():
        stored = row.get(f"excludes_gap{g}")
        out[bool(stored) if stored is not None else not (lo <= effect <= hi)].append(f"+{g}")
    parts = [
        f"includes {', '.join(out[False])}" if out[False] else "",
        f"excludes {', '.join(out[True])}" if out[True] else "",
    ]
    return "; ".join(p for p in parts if p)


def _number(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


# ---------------------------------------------------------------------------------------------------------
# One method's row of a vote's table, as ``thinkn`` and the explorer print it.

METHOD_COLUMNS = ("method", "exact %", "trials % ± s.d.", "tokens/q", "vs Cons@n", "paper")
"""The vote table's columns: the exact expectation over every draw (what the paired tests use), the trials' mean ±
draw s.d. (the spread of re-draws from one pool, not an error bar), tokens per question (exact where computed),
against Cons@n, and the paper's printed cost formula."""


def _tokens(s: Any, paper: bool = False) -> float:
    """Tokens per question: the expectation over every draw where computed, else the trials' mean."""
    exact = s.cost_paper_exact if paper else s.cost_exact
    return exact if exact is not None else (s.cost_paper_mean if paper else s.cost_mean)


def method_cells(s: Any, cons: Any | None) -> list[str]:
    """A ``MethodSummary``'s cells in ``METHOD_COLUMNS`` order; ``cons``: Cons@n's summary (None: not voted)."""
    return [
        s.method,
        "—" if s.accuracy_exact is None else f"{100 * s.accuracy_exact:.1f}",
        f"{100 * s.accuracy_mean:.1f} ± {100 * s.accuracy_std:.1f}",
        f"{_tokens(s):,.0f}",
        f"{_tokens(s) / _tokens(cons):.0%}" if cons is not None and _tokens(cons) else "—",
        f"{_tokens(s, paper=True):,.0f}",
    ]


def folded_cells(group: str, rows: Sequence[Any], cons: Any | None) -> list[str]:
    """One line for a group of methods (DeepConf's variants of one filter): each cell the range over them."""

    def span(values: Sequence[float], fmt: str) -> str:
        if not values:
            return "—"
        lo, hi = min(values), max(values)
        return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}–{hi:{fmt}}"

    ratios = [100 * _tokens(s) / _tokens(cons) for s in rows] if cons is not None and _tokens(cons) else []
    return [
        f"{group}-*@n ({len(rows)})",
        span([100 * s.accuracy_exact for s in rows if s.accuracy_exact is not None], ".1f"),
        span([100 * s.accuracy_mean for s in rows], ".1f"),
        span([_tokens(s) for s in rows], ",.0f"),
        span(ratios, ".0f") + ("%" if ratios else ""),
        span([_tokens(s, paper=True) for s in rows], ",.0f"),
    ]
