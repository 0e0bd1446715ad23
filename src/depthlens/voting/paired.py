"""Every voting method against Cons@n on the same questions: paired tests, and the power to see the paper's gap.

**The unit of pairing is the question.** In trial t every method votes on the same draw of n responses from
question q's pool, so the methods are paired on (t, q). But the trials re-draw from one pool — 10 trials of n = 8
from the same 16 responses — so they are not independent replications: 10 trials × 30 questions are not 300
observations, and a test over them would be falsely sure. Each question's outcome is therefore its mean over
trials (the method's expected accuracy on that question's pool under random draws of n: exactly the number the
accuracy column averages), and the test runs over questions, the independent draws from the task
(``metrics.paired``: sign-flip permutation test, paired bootstrap interval, t-test power).

The deep-thinking paper's gaps (its Table 2, AIME25, n = 48; docs/definitions.md §5): Think@n − Cons@n = +2.0
points (GPT-OSS-120B, 94.7 vs 92.7) and +3.3 points (Qwen3-4B-Thinking, 90.0 vs 86.7). ``questions_for`` says how
many questions a study like this one — same spread of per-question differences — would need to detect each at
α = 0.05 with 80 % power.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from depthlens.metrics.paired import PairedTest, paired_power, paired_test, questions_needed
from depthlens.metrics.resampling import fdr_adjust, mean_bootstrap
from depthlens.voting.trials import TrialOutcomes

BASELINE = "cons@n"
PAPER_GAPS: dict[str, float] = {"2.0": 0.020, "3.3": 0.033}
"""The paper's Think@n − Cons@n on AIME25 in accuracy points (key) and as a fraction (value)."""
ALPHA = 0.05
POWER = 0.8


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
            "vs": self.baseline, "diff": t.difference, "diff_lo": t.low, "diff_hi": t.high, "p": t.p,
            "p_bh": self.p_bh, "wins": t.wins, "losses": t.losses, "sd_diff": t.sd, "p_exact": t.exact,
        }  # fmt: skip
        for gap in PAPER_GAPS:
            out[f"power_gap{gap}"] = self.power[gap]
            out[f"questions_for_gap{gap}"] = self.questions_for[gap]
        return out


def per_question_accuracy(outcomes: TrialOutcomes) -> dict[str, np.ndarray]:
    """Each method's accuracy per question, averaged over trials ([questions], in ``outcomes.questions`` order)."""
    return {m: a.mean(axis=0) for m, a in outcomes.accuracy.items()}


def paired_comparisons(
    per_question: Mapping[str, Sequence[float]],
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


def compare_methods(outcomes: TrialOutcomes, baseline: str = BASELINE, seed: int = 0) -> list[Comparison]:
    """``paired_comparisons`` of one vote's methods; none when the baseline was not among them."""
    accuracy = per_question_accuracy(outcomes)
    return paired_comparisons(accuracy, baseline, seed=seed) if baseline in accuracy else []


def accuracy_intervals(
    outcomes: TrialOutcomes, resamples: int = 10_000, seed: int = 0
) -> dict[str, tuple[float | None, float | None]]:
    """Each method's 95 % interval of accuracy over resampled questions (trials averaged per question, as above):
    what Figure 5's bars show; within [0, 1] by construction."""
    out = {}
    for i, (m, per_q) in enumerate(per_question_accuracy(outcomes).items()):
        b = mean_bootstrap(per_q, resamples, [seed, 1_000 + i])
        out[m] = (b.low, b.high)
    return out


def per_question_table(outcomes: TrialOutcomes) -> dict[str, Any]:
    """The per-question accuracies as a summary stores them (6 decimals: trial means of 0/1 are exact to 1e-6 for
    up to 10⁶ trials), so stores of one model can be pooled later without voting again."""
    return {
        "questions": list(outcomes.questions),
        "accuracy": {m: [round(float(v), 6) for v in a] for m, a in per_question_accuracy(outcomes).items()},
    }
