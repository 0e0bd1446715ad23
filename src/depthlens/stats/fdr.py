"""Multiple-comparison control over a study's tables: Benjamini–Hochberg adjusted p-values beside the raw ones.

A Table 1 asks one question per cell (does this metric track accuracy on this store?) — 9 metrics × every store,
and the sweeps 30-odd settings per store — so some intervals exclude zero by chance alone. Each table is one
family per statistic (point-biserial r, Spearman ρ, binned r, within-question r): its p-values are adjusted
together and written as ``<statistic>_p_bh`` beside ``<statistic>_p``. Which columns those are is the
study's to say (``studies.correlation.TABLE_ONE_P``, ``studies.comparisons.PAIRED_P``).

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

import numpy as np
from scipy import stats


def fdr_adjust(p_values: Sequence[float | None]) -> list[float | None]:
    """Benjamini–Hochberg adjusted p-values (``scipy.stats.false_discovery_control``) over one table's tests;
    None stays None (a cell without a test is not counted in the family)."""
    tested = [(i, p) for i, p in enumerate(p_values) if p is not None and np.isfinite(p)]
    present = [i for i, _ in tested]
    out: list[float | None] = [None] * len(p_values)
    if present:
        adjusted = stats.false_discovery_control([float(p) for _, p in tested], method="bh")
        for i, q in zip(present, np.atleast_1d(adjusted), strict=True):
            out[i] = float(q)
    return out


def add_fdr(rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> None:
    """Add ``<field>_bh`` (Benjamini–Hochberg over ``rows``) beside each p-value field the rows carry, in place.

    ``rows`` must be one table: the family is every row given; each of ``fields`` (the table's p-value columns,
    its study's to name) is a family of its own.
    """
    for field in fields:
        if not any(field in row for row in rows):
            continue
        adjusted = fdr_adjust([row.get(field) for row in rows])
        for row, value in zip(rows, adjusted, strict=True):
            row[f"{field}_bh"] = value
