"""Paired comparison of methods over the same questions, and the power of such a comparison. Pure, scipy.stats.

Each question q gives one number per method — its accuracy there (1/0, or a mean over trials) — so the unit of
pairing is the question and the data are the differences d_q = a_q − b_q. Questions are the independent draws;
responses and trials within a question are not (see ``studies.thinkn.compare_methods`` for why trials are averaged
first).

- **Test**: the sign-flip permutation test of mean d (``scipy.stats.permutation_test``, ``permutation_type=
  "samples"``): under "the two methods are exchangeable on every question" each d_q is as likely to be −d_q.
  It makes no normality assumption, is exact when every sign pattern is enumerated (up to 13 non-zero
  differences here) and a Monte-Carlo estimate otherwise; and when every d_q is −1, 0 or +1 (one trial, 0/1
  outcomes) it *is* the exact McNemar test (the sign test on the discordant questions). Unlike the sign test it
  also weighs how much a method wins by, which matters once outcomes are averaged over trials.
- **Interval**: the percentile bootstrap of mean d over resampled questions (a paired bootstrap).
- **Power**: of the paired t-test, from the non-central t (``scipy.stats.nct``), for an effect Δ and the s.d. of
  d_q: the chance of p < α with Q questions, and the fewest questions reaching a target power. The permutation
  test's power is close to the t-test's at these sizes; the figure is a planning number, not a measurement.

Which methods are compared, against which baseline, and the paper's gaps they are judged by are the study's:
``studies.comparisons``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy import stats

from depthlens.stats.resampling import Seed, mean_bootstrap

EXACT_UP_TO = 13
"""Non-zero differences up to which every sign pattern is enumerated (2^13 = 8,192 ≤ the default resamples)."""


@dataclasses.dataclass(frozen=True)
class PairedTest:
    """Method a against method b on the same questions."""

    questions: int
    difference: float  # mean over questions of a_q − b_q (accuracy as a fraction)
    low: float | None  # 95 % paired-bootstrap interval of the difference
    high: float | None
    p: float  # two-sided sign-flip permutation p (1 when a and b never differ)
    wins: int  # questions where a > b
    losses: int  # questions where a < b
    sd: float  # s.d. of d_q (ddof = 1): what the power depends on
    exact: bool  # the permutation distribution was enumerated

    def to_dict(self) -> dict[str, float | int | bool | None]:
        return dataclasses.asdict(self)


def paired_test(
    a: Sequence[float] | npt.NDArray[np.float64],
    b: Sequence[float] | npt.NDArray[np.float64],
    resamples: int = 10_000,
    rng: Seed = 0,
) -> PairedTest:
    """Mean of a − b over questions, its paired-bootstrap interval and the sign-flip permutation p-value."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.size == 0:
        raise ValueError("a paired comparison needs at least one question")
    sd = float(np.std(d, ddof=1)) if d.size > 1 else 0.0
    nonzero = d[np.abs(d) > 1e-12]  # trial means of 0/1 outcomes: a tie is exactly 0 up to float rounding
    wins, losses = int((nonzero > 0).sum()), int((nonzero < 0).sum())
    interval = mean_bootstrap(d, resamples, rng)
    if nonzero.size == 0:
        return PairedTest(d.size, 0.0, 0.0, 0.0, 1.0, 0, 0, sd, True)
    if nonzero.size == 1:  # its two sign patterns are equally extreme: p = 1 exactly (scipy needs two values)
        return PairedTest(d.size, float(d.mean()), interval.low, interval.high, 1.0, wins, losses, sd, True)
    # Zeros flip to themselves, so they are left out of the permutations (the statistic's scale changes, its
    # ordering does not: the p-value is the same).
    exact = nonzero.size <= EXACT_UP_TO
    result = stats.permutation_test(
        (nonzero,),
        lambda x, axis=-1: np.mean(x, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=2**nonzero.size if exact else resamples,
        alternative="two-sided",
        rng=np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng,
    )
    return PairedTest(
        d.size,
        float(d.mean()),
        interval.low,
        interval.high,
        float(min(1.0, result.pvalue)),
        wins,
        losses,
        sd,
        exact,
    )


def paired_power(effect: float, sd: float, questions: int, alpha: float = 0.05) -> float | None:
    """Power of a two-sided paired t-test at level ``alpha`` to detect a mean difference ``effect`` with
    ``questions`` pairs whose differences have s.d. ``sd``; None when sd is 0 or there are fewer than 2 pairs."""
    if sd <= 0 or questions < 2:
        return None
    df = questions - 1
    ncp = abs(effect) / sd * math.sqrt(questions)
    crit = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp))


def questions_needed(
    effect: float, sd: float, alpha: float = 0.05, power: float = 0.8, most: int = 10_000_000
) -> int | None:
    """The fewest questions for which ``paired_power`` reaches ``power``; None when sd is 0 or it would take
    more than ``most``."""
    if sd <= 0 or effect == 0:
        return None
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    guess = max(2, math.floor((z * sd / abs(effect)) ** 2))  # the normal approximation; t needs a few more
    if guess > most:
        return None
    q = guess
    while (paired_power(effect, sd, q, alpha) or 0.0) < power:
        q += max(1, q // 100)  # coarse steps far out, then back up to the first that reaches it
    while q > 2 and (paired_power(effect, sd, q - 1, alpha) or 0.0) >= power:
        q -= 1
    return q
