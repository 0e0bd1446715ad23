"""Table 1's statistics of one metric from its per-question values (definitions.md §4): the paper's binned r, the
unbinned per-response Spearman ρ and point-biserial r with question-bootstrap intervals, the within-question r with
its permutation p and its r with length, and with length held fixed (``stats.length``) the within-question partial r
and the length-matched AUC. ``studies.correlation`` computes the metrics from a store and lays out the rows."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from depthlens.config import CorrelationConfig
from depthlens.stats.correlation import (
    binned_correlation,
    point_biserial_test,
    quantile_bins,
    spearman_test,
    within_question_permutation,
    within_question_r,
)
from depthlens.stats.length import length_matched_auc, within_question_partial
from depthlens.stats.resampling import cluster_correlation_bootstrap, mean_bootstrap


@dataclasses.dataclass(frozen=True)
class Correlation:
    """One metric on one store: the paper's binned r and the unbinned statistics, or why there are none."""

    metric: str
    binned_r: float | None
    binned_r_sd: float | None  # across seeds
    questions_used: float  # questions with a defined binned r, averaged over seeds
    spearman: float | None
    spearman_ci: tuple[float | None, float | None]
    point_biserial: float | None
    point_biserial_ci: tuple[float | None, float | None]
    responses: int
    note: str = ""
    # Question-level inference (definitions.md §4): two-sided bootstrap p of r = 0, from the interval's resamples;
    # scipy's p (every response independent) beside it; the binned r's interval over questions.
    spearman_p: float | None = None
    point_biserial_p: float | None = None
    spearman_p_iid: float | None = None
    point_biserial_p_iid: float | None = None
    binned_r_ci: tuple[float | None, float | None] = (None, None)
    binned_r_p: float | None = None
    # Within questions (definitions.md §4): the question-centred point-biserial r, its permutation p (correctness
    # shuffled within each question), the questions with both right and wrong responses it used, and the
    # question-centred r of the metric with response length.
    r_within: float | None = None
    p_within_perm: float | None = None
    n_questions_within: int = 0
    r_length_within: float | None = None
    # Length held fixed (definitions.md §4, ``stats.length``): the within-question partial r with correctness holding
    # token count and the cut at the cap fixed, its within-question permutation p; the AUC of right against wrong
    # responses of similar length and ending within questions, its question-bootstrap interval and p (vs 0.5).
    r_within_partial: float | None = None
    p_within_partial: float | None = None
    auc_length_matched: float | None = None
    auc_length_matched_ci: tuple[float | None, float | None] = (None, None)
    auc_length_matched_p: float | None = None
    pairs_length_matched: int = 0


TABLE_ONE_P = (
    "point_biserial_p",
    "spearman_p",
    "binned_r_p",
    "p_within_perm",
    "p_within_partial",
    "auc_length_matched_p",
)
"""The p-value columns of Table 1 (and of the sweeps): Benjamini–Hochberg takes each as a family of its own."""


def correlate(
    name: str,
    groups: Sequence[tuple[np.ndarray, np.ndarray]],
    cfg: CorrelationConfig,
    lengths: Sequence[np.ndarray] | None = None,
    cuts: Sequence[np.ndarray] | None = None,
) -> Correlation:
    """The statistics of one metric from its per-question (values, correct) groups; ``lengths`` (per question,
    the same responses' token counts) adds the metric's within-question correlation with length, and with ``cuts``
    (whether each was cut at the token cap) the statistics with length held fixed."""
    values = np.concatenate([v for v, _ in groups]) if groups else np.zeros(0)
    correct = np.concatenate([c for _, c in groups]) if groups else np.zeros(0)
    mixed = [g for g in groups if g[0].size >= cfg.bins and 0 < g[1].sum() < g[1].size]
    # Correctness plays no part in it, so it is reported even where no accuracy statistic is.
    length_r = within_question_r([v for v, _ in groups], lengths).r if lengths is not None else None
    none = Correlation(
        name,
        None,
        None,
        0.0,
        None,
        (None, None),
        None,
        (None, None),
        int(values.size),
        r_length_within=length_r,
    )
    if values.size < cfg.min_responses:
        return dataclasses.replace(
            none, note=f"too few responses ({values.size} < {cfg.min_responses}): no statistic"
        )
    if correct.min() == correct.max():
        return dataclasses.replace(
            none, note=f"every response is {'right' if correct[0] else 'wrong'}: accuracy cannot correlate"
        )
    right = int(correct.sum())
    if min(right, correct.size - right) < cfg.min_outcome:
        minority = f"{right} right" if right < correct.size - right else f"{correct.size - right} wrong"
        return dataclasses.replace(
            none,
            note=f"only {minority} of {correct.size} responses (< {cfg.min_outcome}): an r would hinge on them",
        )
    if np.ptp(values) == 0:
        return dataclasses.replace(none, note="the metric is constant over all responses")

    result = dataclasses.replace(none, **_unbinned(groups, values, correct, cfg))
    if lengths is not None and cuts is not None:
        result = dataclasses.replace(result, **_length_fixed(groups, lengths, cuts, cfg))

    if len(mixed) < cfg.min_questions:
        return dataclasses.replace(
            result,
            note=f"binned r needs ≥ {cfg.min_questions} questions with both right and wrong responses "
            f"and ≥ {cfg.bins} responses; {len(mixed)} have them",
        )
    return _binned(result, mixed, cfg)


def _unbinned(
    groups: Sequence[tuple[np.ndarray, np.ndarray]],
    values: np.ndarray,
    correct: np.ndarray,
    cfg: CorrelationConfig,
) -> dict[str, Any]:
    """Spearman ρ and point-biserial r over all responses, each with scipy's p (responses independent) and the
    question-bootstrap interval and p (the honest ones: responses to one question are not independent)."""
    rho, pb = spearman_test(values, correct), point_biserial_test(values, correct)
    rho_boot = cluster_correlation_bootstrap(groups, "spearman", cfg.bootstrap, [cfg.seed, 1])
    pb_boot = cluster_correlation_bootstrap(groups, "pearson", cfg.bootstrap, [cfg.seed, 2])
    within = within_question_permutation(
        [v for v, _ in groups], [c for _, c in groups], cfg.permutations, np.random.default_rng([cfg.seed, 4])
    )
    return {
        "r_within": within.r,
        "p_within_perm": within.p,
        "n_questions_within": within.questions,
        "spearman": rho.r if rho else None,
        "spearman_p_iid": rho.p if rho else None,
        "spearman_ci": (rho_boot.low, rho_boot.high),
        "spearman_p": rho_boot.p,
        "point_biserial": pb.r if pb else None,
        "point_biserial_p_iid": pb.p if pb else None,
        "point_biserial_ci": (pb_boot.low, pb_boot.high),
        "point_biserial_p": pb_boot.p,
    }


def _length_fixed(
    groups: Sequence[tuple[np.ndarray, np.ndarray]],
    lengths: Sequence[np.ndarray],
    cuts: Sequence[np.ndarray],
    cfg: CorrelationConfig,
) -> dict[str, Any]:
    """The within-question partial r holding token count and the cut fixed, and the length-matched AUC."""
    metric, correct = [v for v, _ in groups], [c for _, c in groups]
    covariates = [np.column_stack([n, k]) for n, k in zip(lengths, cuts, strict=True)]
    partial = within_question_partial(
        metric, correct, covariates, cfg.permutations, np.random.default_rng([cfg.seed, 5])
    )
    matched = length_matched_auc(metric, correct, lengths, cuts, cfg.bootstrap, [cfg.seed, 6])
    return {
        "r_within_partial": partial.r,
        "p_within_partial": partial.p,
        "auc_length_matched": matched.auc,
        "auc_length_matched_ci": (matched.low, matched.high),
        "auc_length_matched_p": matched.p,
        "pairs_length_matched": matched.pairs,
    }


def _binned(
    result: Correlation, mixed: Sequence[tuple[np.ndarray, np.ndarray]], cfg: CorrelationConfig
) -> Correlation:
    """``result`` with the paper's binned r over the questions with both right and wrong responses."""
    per_seed, used = [], []
    per_question = np.full((cfg.seeds, len(mixed)), np.nan)  # [seed, question] binned r
    for s in range(cfg.seeds):
        seed_rng = np.random.default_rng([cfg.seed, 0, s])
        rs = []
        for q, (v, c) in enumerate(mixed):
            if cfg.n is not None and cfg.n < v.size:
                pick = seed_rng.choice(v.size, cfg.n, replace=False)
                v, c = v[pick], c[pick]
            r = binned_correlation(v, c, cfg.bins, seed_rng)
            if r is not None:
                rs.append(r)
                per_question[s, q] = r
        if rs:
            per_seed.append(float(np.mean(rs)))
            used.append(len(rs))
    if not per_seed:
        return dataclasses.replace(result, note="binned r undefined in every seed (constant bins)")
    # The paper's mean over questions, with its interval and p over question resamples of the per-question r
    # (averaged over seeds first: the seeds re-bin the same responses, they are not new questions).
    defined = ~np.isnan(per_question).all(axis=0)
    binned = mean_bootstrap(np.nanmean(per_question[:, defined], axis=0), cfg.bootstrap, [cfg.seed, 3])
    return dataclasses.replace(
        result,
        binned_r=float(np.mean(per_seed)),
        binned_r_sd=float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0,
        questions_used=float(np.mean(used)),
        binned_r_ci=(binned.low, binned.high),
        binned_r_p=binned.p,
    )


def bin_profile(
    groups: Sequence[tuple[np.ndarray, np.ndarray]], cfg: CorrelationConfig
) -> list[dict[str, float]]:
    """Figure 1's points: per bin rank (lowest metric first), mean metric value and accuracy, averaged over the
    questions with ≥ ``bins`` responses and the seeds; with the spread of accuracy across questions."""
    usable = [g for g in groups if g[0].size >= cfg.bins]
    if not usable:
        return []
    metric_sum = np.zeros((cfg.seeds, len(usable), cfg.bins))
    acc_sum = np.zeros_like(metric_sum)
    for s in range(cfg.seeds):
        rng = np.random.default_rng([cfg.seed, 2, s])
        for q, (v, c) in enumerate(usable):
            for b, idx in enumerate(quantile_bins(v, cfg.bins, rng)):
                metric_sum[s, q, b] = v[idx].mean()
                acc_sum[s, q, b] = c[idx].mean()
    per_question_acc = acc_sum.mean(axis=0)  # [Q, bins]
    return [
        {
            "bin": b + 1,
            "metric": float(metric_sum[:, :, b].mean()),
            "accuracy": float(per_question_acc[:, b].mean()),
            "accuracy_se": float(per_question_acc[:, b].std(ddof=1) / math.sqrt(len(usable)))
            if len(usable) > 1
            else 0.0,
            "questions": len(usable),
        }
        for b in range(cfg.bins)
    ]
