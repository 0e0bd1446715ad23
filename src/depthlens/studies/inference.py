"""Multiple-comparison control over a study's tables: Benjamini–Hochberg adjusted p-values beside the raw ones.

A Table 1 asks one question per cell (does this metric track accuracy on this store?) — 9 metrics × every store,
and the sweeps 30-odd settings per store — so some intervals exclude zero by chance alone. Each table is one
family per statistic (point-biserial r, Spearman ρ, binned r): its p-values are adjusted together and written as
``<statistic>_p_bh`` beside ``<statistic>_p``.

Why Benjamini–Hochberg and not Holm: a table is read as a screen (which cells are real?), and BH bounds the
expected share of false ones among the cells it flags (the false-discovery rate) at the level, where Holm bounds
the chance of even one and, over 50–100 cells, would hide every moderate effect. BH needs the tests to be
independent or positively dependent (PRDS); the cells here share responses and include mirror metrics (token count
and its reverse test the same thing), a positive dependence. The verdicts in docs/findings.md that rest on one
pre-stated comparison use its own p; the adjusted p guards what the eye picks out of the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from depthlens.metrics.resampling import fdr_adjust

FDR_FIELDS = ("point_biserial_p", "spearman_p", "binned_r_p")
"""The p-value columns of Table 1 (and of the sweeps), each a family of its own."""

PAIRED_FIELDS = ("p",)
"""The p-value column of the paired Think@n comparisons."""


def add_fdr(rows: Sequence[dict[str, Any]], fields: Sequence[str] = FDR_FIELDS) -> None:
    """Add ``<field>_bh`` (Benjamini–Hochberg over ``rows``) beside each p-value field the rows carry, in place.

    ``rows`` must be one table: the family is every row given.
    """
    for field in fields:
        if not any(field in row for row in rows):
            continue
        adjusted = fdr_adjust([row.get(field) for row in rows])
        for row, value in zip(rows, adjusted, strict=True):
            row[f"{field}_bh"] = value


def format_p(p: float | None) -> str:
    """A p-value as a reader scans it: 2 significant digits, '<0.001' below."""
    if p is None:
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.2g}" if p < 0.1 else f"{p:.2f}"
