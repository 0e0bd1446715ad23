"""Length held fixed (stats.length): the within-question partial correlation against a direct least-squares
computation, its permutation p, and the length-matched AUC against a loop over every pair."""

from __future__ import annotations

import numpy as np
import pytest

from depthlens.stats.length import LENGTH_TOLERANCE, length_matched_auc, within_question_partial


def _study(seed: int, questions: int = 12, effect: float = 0.0):
    """Per question: a metric that grows with length, correctness that falls with length (and with ``effect``
    rises with the metric beyond length), token counts, and the cut flag at a cap of 60."""
    rng = np.random.default_rng(seed)
    metric, correct, lengths, cuts = [], [], [], []
    for _ in range(questions):
        n = int(rng.integers(4, 10))
        length = rng.integers(10, 61, n).astype(float)
        m = 0.01 * length + rng.normal(0, 0.1, n)
        noise = rng.normal(0, 0.1, n)
        right = (-(length - length.mean()) / 50 + effect * (m - m.mean()) + noise > 0).astype(float)
        metric.append(m)
        correct.append(right)
        lengths.append(length)
        cuts.append((length >= 60).astype(float))
    return metric, correct, lengths, cuts


def _direct(metric, correct, lengths, cuts) -> float:
    """Residuals of both on question indicators, token count and the cut flag by ``np.linalg.lstsq``, then r."""
    q = np.concatenate([np.full(len(m), i) for i, m in enumerate(metric)])
    design = np.column_stack([np.eye(len(metric))[q], np.concatenate(lengths), np.concatenate(cuts)])
    x, y = np.concatenate(metric), np.concatenate(correct)
    ex = x - design @ np.linalg.lstsq(design, x, rcond=None)[0]
    ey = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    return float(ex @ ey / np.sqrt((ex @ ex) * (ey @ ey)))


@pytest.mark.parametrize(("seed", "effect"), [(0, 0.0), (1, 0.0), (2, 3.0), (3, -3.0)])
def test_partial_r_is_the_r_of_the_least_squares_residuals(seed, effect):
    metric, correct, lengths, cuts = _study(seed, effect=effect)
    covariates = [np.column_stack([n, k]) for n, k in zip(lengths, cuts, strict=True)]
    got = within_question_partial(metric, correct, covariates, 0, np.random.default_rng(0))
    assert got.r == pytest.approx(_direct(metric, correct, lengths, cuts), abs=1e-10)
    assert (got.questions, got.responses, got.p) == (len(metric), sum(len(m) for m in metric), None)


def test_partial_r_holds_length_fixed_where_the_plain_r_does_not():
    """A metric that only tracks length: the question-centred r with correctness is clearly negative, the partial
    r near 0 and its permutation p large; a metric with an effect beyond length keeps a small p."""
    metric, correct, lengths, cuts = _study(5, questions=40)
    covariates = [np.column_stack([n, k]) for n, k in zip(lengths, cuts, strict=True)]
    centred = np.concatenate([m - m.mean() for m in metric]) @ np.concatenate([c - c.mean() for c in correct])
    assert centred < 0  # through length alone
    none = within_question_partial(metric, correct, covariates, 500, np.random.default_rng(1))
    assert abs(none.r) < 0.1 and none.p > 0.05
    assert none == within_question_partial(
        metric, correct, covariates, 500, np.random.default_rng(1)
    )  # seeded
    metric, correct, lengths, cuts = _study(6, questions=40, effect=5.0)
    covariates = [np.column_stack([n, k]) for n, k in zip(lengths, cuts, strict=True)]
    some = within_question_partial(metric, correct, covariates, 500, np.random.default_rng(1))
    assert some.r > 0.2 and some.p < 0.01


def test_partial_r_is_undefined_without_residual_variance():
    metric = [np.array([1.0, 2.0, 3.0])]
    same = within_question_partial(
        metric, [np.ones(3)], [np.array([1.0, 2.0, 3.0])[:, None]], 10, np.random.default_rng(0)
    )
    assert same.r is None and same.p is None  # correctness constant, and the metric is the covariate itself


def test_length_matched_auc_is_the_share_of_matched_pairs_won():
    rng = np.random.default_rng(4)
    metric, correct, lengths, cuts = _study(7)
    for i in range(3):  # ties in the metric count one half
        metric[i] = np.round(metric[i], 1)
    got = length_matched_auc(metric, correct, lengths, cuts, 200, rng)
    wins = pairs = 0.0
    for m, c, n, k in zip(metric, correct, lengths, cuts, strict=True):
        for a in np.flatnonzero(c == 1):
            for b in np.flatnonzero(c == 0):
                if abs(n[a] - n[b]) <= LENGTH_TOLERANCE * max(n[a], n[b]) and k[a] == k[b]:
                    pairs += 1
                    wins += 1.0 if m[a] > m[b] else 0.5 if m[a] == m[b] else 0.0
    assert got.pairs == pairs > 0 and got.auc == pytest.approx(wins / pairs)
    assert got.low <= got.auc <= got.high and 0 < got.p <= 1
    assert length_matched_auc([np.ones(2)], [np.ones(2)], [np.ones(2)], [np.zeros(2)], 10, 0).auc is None
