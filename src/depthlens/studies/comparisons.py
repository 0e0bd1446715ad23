"""Think@n's paired comparisons as the study makes them (``stats.paired`` holds the tests): every method against one
baseline, and Think@n against its control, over the same questions.

- **A table of them** (``paired_comparisons``): every method against one baseline (Cons@n), Benjamini–Hochberg
  over the methods compared, and where the interval lies against the deep-thinking paper's gaps (``gap_verdict``)
  — the verdict; the power to see them stays as a planning number. The paper's Table 2 (AIME25, n = 48;
  docs/definitions.md §5): Think@n − Cons@n = +2.0 points (GPT-OSS-120B, 94.7 vs 92.7) and +3.3 points
  (Qwen3-4B-Thinking, 90.0 vs 86.7). ``questions_for`` says how many questions a study like this one — same spread
  of per-question differences — would need to detect each at α = 0.05 with 80 % power.
- **The control** (``control_comparison``): Think@n − random@n, Think@n against a random vote of its own size —
  the study's primary contrast (does DTR select well?), tested on its own, outside the table's family, and judged
  against 0 (no selection effect): the paper's +2.0 / +3.3 are Think@n − Cons@n gaps, not a control's. Its power
  for a +2.0 / +3.3-point effect stays as a planning number (the questions a selection effect of that size needs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from depthlens.stats.fdr import fdr_adjust
from depthlens.stats.paired import PairedTest, paired_power, paired_test, questions_needed

BASELINE = "cons@n"
CONTROL = "random@n"
"""Think@n's control: a vote over a random ⌈η·n⌉ of the same draw (``voting.methods.random_at_n``)."""
PAPER_GAPS: dict[str, float] = {"2.0": 0.020, "3.3": 0.033}
"""The paper's Think@n − Cons@n on AIME25 in accuracy points (key) and as a fraction (value)."""
ALPHA = 0.05
POWER = 0.8
PAIRED_P = ("p",)
"""The p-value column of a paired comparison's row (``Comparison.row``): Table 2's family for Benjamini–Hochberg."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One method against the baseline over the same questions."""

    method: str
    baseline: str
    test: PairedTest
    p_bh: float  # Benjamini–Hochberg over every method compared in one table
    power: dict[str, float | None]  # per paper gap: power of this many questions (t-test, α = 0.05)
    questions_for: dict[str, int | None]  # per paper gap: questions for 80 % power

    def row(self) -> dict[str, Any]:
        """Flat columns for a summary CSV row (accuracy differences as fractions, like the accuracies)."""
        t = self.test
        out: dict[str, Any] = {
            "vs": self.baseline,
            "diff": t.difference,
            "diff_lo": t.low,
            "diff_hi": t.high,
            "p": t.p,
            "p_bh": self.p_bh,
            "wins": t.wins,
            "losses": t.losses,
            "sd_diff": t.sd,
            "p_exact": t.exact,
        }
        if (
            self.baseline == CONTROL
        ):  # the control's verdict is against no effect; the paper's gaps are not its
            out["excludes_0"] = None if t.low is None or t.high is None else not (t.low <= 0.0 <= t.high)
        excludes = gap_verdict(t)
        for gap in PAPER_GAPS:
            if self.baseline != CONTROL:
                out[f"excludes_gap{gap}"] = excludes[gap]
            out[f"power_gap{gap}"] = self.power[gap]  # a planning number, not the verdict
            out[f"questions_for_gap{gap}"] = self.questions_for[gap]
        return out


def gap_verdict(test: PairedTest) -> dict[str, bool | None]:
    """Per paper gap (``PAPER_GAPS``' keys): whether the 95 % interval of the difference excludes it; None without
    an interval. An interval that excludes +2.0 says this study's data are unlike the paper's gap, whatever p is."""
    if test.low is None or test.high is None:
        return dict.fromkeys(PAPER_GAPS)
    return {g: not (test.low <= effect <= test.high) for g, effect in PAPER_GAPS.items()}


def control_comparison(
    per_question: Mapping[str, Sequence[float] | np.ndarray],
    method: str = "think@n",
    control: str = CONTROL,
    resamples: int = 10_000,
    seed: int = 0,
) -> Comparison | None:
    """``method`` against ``control`` over the same questions (one test: p_BH is p); None when either was not
    voted."""
    if method not in per_question or control not in per_question:
        return None
    a, b = per_question[method], per_question[control]
    test = paired_test(a, b, resamples, np.random.default_rng([seed, 7_919]))
    return Comparison(
        method,
        control,
        test,
        test.p,
        {g: paired_power(effect, test.sd, test.questions, ALPHA) for g, effect in PAPER_GAPS.items()},
        {g: questions_needed(effect, test.sd, ALPHA, POWER) for g, effect in PAPER_GAPS.items()},
    )


def paired_comparisons(
    per_question: Mapping[str, Sequence[float] | np.ndarray],
    baseline: str = BASELINE,
    resamples: int = 10_000,
    seed: int = 0,
) -> list[Comparison]:
    """Every method in ``per_question`` (aligned arrays over the same questions) against ``baseline``, with the
    Benjamini–Hochberg adjustment over the methods compared (one table, one family)."""
    if baseline not in per_question:
        raise KeyError(f"the baseline {baseline!r} was not voted; it is what every method is compared with")
    base = np.asarray(per_question[baseline], dtype=np.float64)
    tests = {
        m: paired_test(v, base, resamples, np.random.default_rng([seed, i]))
        for i, (m, v) in enumerate(per_question.items())
        if m != baseline
    }
    adjusted = fdr_adjust([t.p for t in tests.values()])
    return [
        Comparison(
            m,
            baseline,
            t,
            float(q) if q is not None else 1.0,
            {g: paired_power(effect, t.sd, t.questions, ALPHA) for g, effect in PAPER_GAPS.items()},
            {g: questions_needed(effect, t.sd, ALPHA, POWER) for g, effect in PAPER_GAPS.items()},
        )
        for (m, t), q in zip(tests.items(), adjusted, strict=True)
    ]
