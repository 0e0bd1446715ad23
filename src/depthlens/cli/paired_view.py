"""How ``thinkn`` prints its methods: the paper's first, DeepConf's twelve offline variants folded into one line
per filter unless ``--methods all`` (or a list) asks for each; the paired comparisons with Cons@n and Think@n's with
random@n, its control (``stats.paired``): the cells of ``studies.tables`` per method, and a verdict line — the
interval against the paper's gaps, with the power as a planning number only where the result is not significant."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

from depthlens.errors import InputError
from depthlens.studies.comparisons import CONTROL, PAPER_GAPS, Comparison
from depthlens.studies.tables import paired_cells, paired_title
from depthlens.voting.methods import DEEPCONF_FILTERS, in_order


def method_list(methods: str | None) -> list[str] | None:
    """``--methods`` as names of ``voting.methods.METHODS`` (None or ``all``: all), unknown ones refused."""
    if not methods or methods.strip() == "all":
        return None
    from depthlens.voting.methods import METHODS

    names = [m.strip() for m in methods.split(",")]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise InputError(f"--methods {methods}: unknown {', '.join(unknown)}; known: {', '.join(METHODS)}")
    return names


def deepconf_group(method: str) -> str | None:
    """The filter group of a DeepConf variant (``deepconf-low-tail@n`` → ``deepconf-low``; the filters are
    ``voting.methods.DEEPCONF_FILTERS``'); None for other methods."""
    for name in sorted(
        DEEPCONF_FILTERS, key=len, reverse=True
    ):  # "low-" and "high-" before the unfiltered ""
        if method.startswith(f"deepconf-{name}"):
            return f"deepconf-{name}".rstrip("-")
    return None


def folded(rows: Sequence[Any], method: Callable[[Any], str]) -> tuple[list[Any], dict[str, list[Any]]]:
    """``rows`` in print order, DeepConf's taken out into their groups: (the other rows, group → its rows)."""
    order = in_order([method(r) for r in rows])
    by_name = {method(r): r for r in rows}
    groups: dict[str, list[Any]] = {}
    plain = []
    for name in order:
        group = deepconf_group(name)
        if group is None:
            plain.append(by_name[name])
        else:
            groups.setdefault(group, []).append(by_name[name])
    return plain, groups


def span(values: Sequence[float], fmt: str) -> str:
    """``lo–hi`` of ``values`` in ``fmt`` (one value when they are all the same)."""
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}–{hi:{fmt}}"


NARROW = 100
"""Below this many columns the paired table wraps its cells (at spaces: every number stays whole) to fit 80."""


def paired_table(paired: Sequence[Comparison], control: Comparison | None = None, width: int = 80) -> Table:
    """Each method against Cons@n on the same questions — difference in points [95 %], p · p_BH, won / lost, the
    interval against the paper's Think@n − Cons@n gaps — and under a line Think@n against random@n, its control
    (one test, its interval against 0). On a terminal narrower than ``NARROW`` (``width``) each cell wraps at its
    spaces to a set width, so the table fits 80 columns with every number whole."""
    title = paired_title(paired[0].baseline, (control.method, control.baseline) if control else None)
    table = Table(title=title, title_justify="left")
    table.add_column("method", no_wrap=True)
    gaps = " / ".join(f"+{g}" for g in PAPER_GAPS)
    narrow = width < NARROW
    # Each column's width when narrow: its longest unbreakable word (a number with its bracket), so a wrap at a
    # space never splits one.
    for column, words in (
        ("Δ points\n[95 %]" if narrow else "Δ points [95 %]", 13),
        ("p · p_BH", 8),
        ("won / lost", 7),
        (f"95 % vs {gaps}", 14),
    ):
        limit: dict[str, Any] = {"min_width": words, "max_width": words} if narrow else {"no_wrap": True}
        table.add_column(column, justify="right", **limit)
    for c in paired:
        cells = paired_cells(c.row())
        table.add_row(c.method, cells.difference, cells.tests, f"{c.test.wins} / {c.test.losses}", cells.gaps)
    if control is not None:
        cells = paired_cells(control.row())
        table.add_section()
        table.add_row(
            f"{control.method} − {control.baseline}",
            cells.difference,
            cells.p,
            f"{control.test.wins} / {control.test.losses}",
            cells.gaps,  # against 0: no selection effect
        )
    return table


def verdict_line(paired: Sequence[Comparison], method: str = "think@n") -> str | None:
    """``think@n vs cons@n: …`` — the questions, the difference and its test, and where its 95 % interval lies
    against the paper's gaps (the verdict); where p ≥ 0.05, the power at this size and the questions 80 % power
    would take, as planning numbers (post-hoc power says nothing about a significant result)."""
    c = next((c for c in paired if c.method == method), None)
    if c is None:
        return None
    t = c.test
    gaps = " / ".join(f"+{g}" for g in PAPER_GAPS)
    cells = paired_cells(c.row())
    family = c.baseline != CONTROL  # the control is one test, outside the table's BH family
    diff, p, power, needed = (
        cells.difference,
        cells.tests if family else cells.p,
        cells.power,
        cells.needed,
    )
    if t.sd == 0:
        return (
            f"{method} vs {c.baseline} over {t.questions} question(s): {diff} points, the same outcome on every "
            "question, so no spread to plan a study's power from."
        )
    planning = (
        ""
        if t.p < 0.05
        else f" For planning, not a verdict: s.d. of the per-question difference {100 * t.sd:.1f} points; power to "
        f"detect a difference of {gaps} points here {power}; 80 % power needs {needed} questions."
    )
    against = (
        f"(the paper's Think@n − Cons@n on AIME25, {gaps} points)"
        if family
        else "(0: no selection effect; the paper's gaps are Think@n − Cons@n's, not a control's)"
    )
    return (
        f"{method} vs {c.baseline} over {t.questions} questions: {diff} points, p {p} ({t.wins} won, {t.losses} "
        f"lost); the 95 % interval {cells.gaps} {against}.{planning} p: sign-flip permutation test over questions "
        "(each question's exact expectation over every draw)"
        + ("; p_BH: Benjamini–Hochberg over the methods; † p_BH < 0.05." if family else ".")
    )
