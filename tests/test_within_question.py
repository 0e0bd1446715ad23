"""Within-question statistics (definitions.md §4): the question-centred point-biserial r, its permutation test
with correctness shuffled inside each question, and a metric's question-centred r with response length."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from depthlens.config import CorrelationConfig
from depthlens.stats.correlation import pearson, within_question_permutation, within_question_r
from depthlens.studies.correlation import correlate


def test_question_centred_r_by_hand():
    x = [np.array([1.0, 2.0, 4.0]), np.array([10.0, 11.0, 15.0, 12.0])]
    y = [np.array([0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0, 1.0])]
    got = within_question_r(x, y)
    xc = np.concatenate([g - g.mean() for g in x])
    yc = np.concatenate([g - g.mean() for g in y])
    assert got.r == pytest.approx(float(np.corrcoef(xc, yc)[0, 1]), abs=1e-12)
    assert (got.questions, got.responses, got.p) == (2, 7, None)


def test_between_question_variation_is_removed():
    """Hard questions are long and wrong, easy ones short and right; within each, length says nothing."""
    rng = np.random.default_rng(0)
    xs, ys = [], []
    for q in range(20):
        y = np.tile([0.0, 1.0], 8) if q % 2 else np.tile([0.0, 0.0, 0.0, 1.0], 4)  # accuracy 50 % or 25 %
        xs.append(100.0 * (q % 2 == 0) + rng.normal(0, 1, y.size))  # the 25 % questions are 100 tokens longer
        ys.append(y)
    pooled = pearson(np.concatenate(xs), np.concatenate(ys))
    within = within_question_permutation(xs, ys, 999, np.random.default_rng(1))
    assert pooled < -0.2  # the pooled r is all between-question variation
    assert abs(within.r) < 0.1 and within.p > 0.05


def test_questions_without_variance_are_dropped_and_counted():
    x = [np.array([1.0, 2.0, 3.0]), np.array([5.0, 6.0, 7.0]), np.array([1.0, 1.0, 1.0]), np.array([9.0])]
    y = [np.array([0.0, 0.0, 1.0]), np.array([1.0, 1.0, 1.0]), np.array([0.0, 1.0, 1.0]), np.array([1.0])]
    got = within_question_r(x, y)
    assert (got.questions, got.responses) == (1, 3)
    assert got.r == pytest.approx(within_question_r(x[:1], y[:1]).r)
    assert within_question_r(x[1:], y[1:]) == within_question_r([], [])
    assert within_question_r([], []).r is None
    with pytest.raises(ValueError, match="pair them per response"):
        within_question_r([np.zeros(3)], [np.zeros(2)])


def test_permutation_p_matches_the_exact_distribution():
    """Two questions of four responses: all 4!·4! relabellings enumerated give the exact p the sampled test
    approaches."""
    x = [np.array([0.3, 1.2, 2.5, 0.1]), np.array([4.0, 3.1, 5.2, 6.0])]
    y = [np.array([0.0, 1.0, 1.0, 0.0]), np.array([0.0, 0.0, 1.0, 1.0])]
    observed = within_question_r(x, y).r
    null = [
        within_question_r(x, [y[0][list(a)], y[1][list(b)]]).r
        for a in itertools.permutations(range(4))
        for b in itertools.permutations(range(4))
    ]
    exact = float(np.mean(np.abs(null) >= abs(observed) - 1e-12))
    got = within_question_permutation(x, y, 20_000, np.random.default_rng(0))
    assert got.r == pytest.approx(observed)
    assert got.p == pytest.approx(exact, abs=0.01)  # binomial s.e. at B = 20,000: ≤ 0.0035
    again = within_question_permutation(x, y, 20_000, np.random.default_rng(0))
    assert again == got  # seeded


def test_permutation_p_bounds_and_a_planted_signal():
    rng = np.random.default_rng(2)
    ys = [(rng.random(16) < 0.5).astype(float) for _ in range(30)]
    for y in ys:
        y[:2] = [0.0, 1.0]
    strong = [y + rng.normal(0, 0.3, y.size) for y in ys]
    got = within_question_permutation(strong, ys, 199, np.random.default_rng(3))
    assert got.r > 0.7 and got.p == pytest.approx(1 / 200) and got.questions == 30
    noise = [rng.normal(0, 1, y.size) for y in ys]
    p_values = [within_question_permutation(noise, ys, 199, np.random.default_rng(s)).p for s in range(3)]
    assert all(1 / 200 <= p <= 1.0 for p in p_values) and max(p_values) > 0.05


def test_correlate_reports_within_question_columns():
    rng = np.random.default_rng(4)
    groups, lengths = [], []
    for q in range(12):
        c = (rng.random(8) < 0.5).astype(float)
        c[:2] = [0.0, 1.0]
        n = rng.integers(20, 200, 8).astype(float)
        groups.append((n + 1000.0 * q, c))  # a metric that is length plus a per-question offset
        lengths.append(n)
    result = correlate("m", groups, CorrelationConfig(seeds=2, bootstrap=50, permutations=99), lengths)
    assert result.r_length_within == pytest.approx(1.0)  # a pure length proxy, once questions are centred
    assert result.n_questions_within == 12 and result.p_within_perm is not None
    assert result.r_within == pytest.approx(
        within_question_r([v for v, _ in groups], [c for _, c in groups]).r
    )
    everyone_right = [(v, np.ones_like(c)) for v, c in groups]
    lonely = correlate("m", everyone_right, CorrelationConfig(seeds=2, bootstrap=50), lengths)
    assert lonely.r_within is None and lonely.r_length_within == pytest.approx(1.0)  # length needs no outcome
