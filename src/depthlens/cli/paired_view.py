"""How ``thinkn`` prints the paired comparisons with Cons@n (``voting.paired``): two table cells per method and a
line on the power to see the paper's gap."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from depthlens.studies.inference import format_p
from depthlens.voting.paired import PAPER_GAPS, Comparison


def paired_cells(paired: Sequence[Comparison], method: str) -> tuple[str, str]:
    """The method's difference from Cons@n in points with its paired-bootstrap interval, and its p-values."""
    c = next((c for c in paired if c.method == method), None)
    if c is None:
        return "—", "—"
    t = c.test
    interval = "" if t.low is None or t.high is None else f" [{100 * t.low:+.1f}, {100 * t.high:+.1f}]"
    flag = "†" if c.p_bh < 0.05 else ""
    return f"{100 * t.difference:+.1f}{interval}", f"{format_p(t.p)} · {format_p(c.p_bh)}{flag}"


def paired_table(paired: Sequence[Comparison]) -> Table:
    """Each method against Cons@n on the same questions: difference in points [95 %], p · p_BH, won / lost."""
    table = Table(title=f"vs {paired[0].baseline} on the same questions (paired)", title_justify="left")
    table.add_column("method", no_wrap=True)
    for column in ("Δ points [95 %]", "p · p_BH", "won / lost"):
        table.add_column(column, justify="right", no_wrap=True)
    for c in paired:
        table.add_row(c.method, *paired_cells(paired, c.method), f"{c.test.wins} / {c.test.losses}")
    return table


def power_line(paired: Sequence[Comparison], method: str = "think@n") -> str | None:
    """``think@n vs cons@n: …`` — the questions, the spread of per-question differences, the power to detect the
    paper's gaps at this size and the questions 80 % power would take."""
    c = next((c for c in paired if c.method == method), None)
    if c is None:
        return None
    t = c.test
    gaps = " / ".join(f"+{g}" for g in PAPER_GAPS)
    power = " / ".join("—" if c.power[g] is None else f"{c.power[g]:.2f}" for g in PAPER_GAPS)
    needed = " / ".join("—" if c.questions_for[g] is None else f"{c.questions_for[g]:,}" for g in PAPER_GAPS)
    diff, p = paired_cells(paired, method)
    if t.sd == 0:
        return (f"{method} vs {c.baseline} over {t.questions} question(s): {diff} points, the same outcome on every "
                "question, so no spread to plan a study's power from.")  # fmt: skip
    return (
        f"{method} vs {c.baseline} over {t.questions} questions: {diff} points, p {p} ({t.wins} won, {t.losses} "
        f"lost; s.d. of the per-question difference {100 * t.sd:.1f} points). Power to detect the paper's {gaps} "
        f"points: {power}; 80 % power needs {needed} questions. p: sign-flip permutation test over questions "
        "(trials averaged per question); p_BH: Benjamini–Hochberg over the methods; † p_BH < 0.05."
    )
