"""How ``thinkn`` prints the paired comparisons with Cons@n (``stats.paired``): the cells of ``studies.tables``
per method and a line on the power to see the paper's gap."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from depthlens.stats.paired import PAPER_GAPS, Comparison
from depthlens.studies.tables import paired_cells


def paired_table(paired: Sequence[Comparison]) -> Table:
    """Each method against Cons@n on the same questions: difference in points [95 %], p · p_BH, won / lost."""
    table = Table(title=f"vs {paired[0].baseline} on the same questions (paired)", title_justify="left")
    table.add_column("method", no_wrap=True)
    for column in ("Δ points [95 %]", "p · p_BH", "won / lost"):
        table.add_column(column, justify="right", no_wrap=True)
    for c in paired:
        cells = paired_cells(c.row())
        table.add_row(c.method, cells.difference, cells.tests, f"{c.test.wins} / {c.test.losses}")
    return table


def power_line(paired: Sequence[Comparison], method: str = "think@n") -> str | None:
    """``think@n vs cons@n: …`` — the questions, the spread of per-question differences, the power to detect the
    paper's gaps at this size and the questions 80 % power would take."""
    c = next((c for c in paired if c.method == method), None)
    if c is None:
        return None
    t = c.test
    gaps = " / ".join(f"+{g}" for g in PAPER_GAPS)
    cells = paired_cells(c.row())
    diff, p, power, needed = cells.difference, cells.tests, cells.power, cells.needed
    if t.sd == 0:
        return (
            f"{method} vs {c.baseline} over {t.questions} question(s): {diff} points, the same outcome on every "
            "question, so no spread to plan a study's power from."
        )
    return (
        f"{method} vs {c.baseline} over {t.questions} questions: {diff} points, p {p} ({t.wins} won, {t.losses} "
        f"lost; s.d. of the per-question difference {100 * t.sd:.1f} points). Power to detect the paper's {gaps} "
        f"points: {power}; 80 % power needs {needed} questions. p: sign-flip permutation test over questions "
        "(trials averaged per question); p_BH: Benjamini–Hochberg over the methods; † p_BH < 0.05."
    )
