"""The deep-thinking paper's correlation study (definitions.md §4, Table 1, Figures 1 and 4), from sample stores only.

A store written by ``depthlens generate --readout-tokens all`` holds, per response, its grade and per-token
log p, entropy, self-certainty and per-layer divergences (``--also-divergences kl,cosine`` adds the other
kinds). Everything here is recomputed from those: DTR at any g, ρ, deep rule, prefix or divergence kind, and
the six baselines — no model is loaded.

Per metric: the paper's binned r (per question, ``bins`` quantile bins of the metric, Pearson r of bin mean
metric vs bin accuracy; averaged over questions, then over seeds), and beside it the unbinned per-response
Spearman ρ and point-biserial r with question-level bootstrap 95 % intervals; then the within-question ones:
the question-centred point-biserial r with its within-question permutation p, and the metric's question-centred
r with response length (is it a length proxy?).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from depthlens.config import CorrelationConfig, DTRConfig
from depthlens.errors import InputError, named
from depthlens.metrics.baselines import sequence_baselines
from depthlens.metrics.dtr import (
    deep_flags,
    deep_thinking_ratio,
    deep_threshold,
    matched_threshold,
    settling_depth,
)
from depthlens.stats.correlation import (
    binned_correlation,
    point_biserial_test,
    quantile_bins,
    spearman_test,
    within_question_permutation,
    within_question_r,
)
from depthlens.stats.resampling import cluster_correlation_bootstrap, mean_bootstrap
from depthlens.studies.stored import Store, StoredResponse

# ---------------------------------------------------------------------------------------------------------
# Metrics: one row each. ``compute(response, settings)`` → the response's value (None when undefined).


@dataclasses.dataclass(frozen=True)
class DTRSettings:
    """DTR as computed from stored divergences: kind, g per kind, ρ, rule, prefix."""

    dtr: DTRConfig
    g_by_kind: dict[str, float]
    n_layers: int

    def ratio(self, response: StoredResponse, kind: str, prefix: int | None = None) -> float | None:
        table = response.divergence.get(kind)
        if table is None or table.shape[0] == 0:
            return None
        settling = settling_depth(table, self.g_by_kind[kind])
        deep = deep_flags(settling, self.n_layers, self.dtr.rho, self.dtr.deep_rule)
        return deep_thinking_ratio(deep, prefix if prefix is not None else self.dtr.dtr_prefix_tokens)


def _baseline(name: str) -> Callable[[StoredResponse, DTRSettings], float | None]:
    def compute(r: StoredResponse, _: DTRSettings) -> float | None:
        scores = sequence_baselines(
            torch.from_numpy(r.log_prob), torch.from_numpy(r.entropy), torch.from_numpy(r.self_certainty)
        )
        value = scores[name]
        return None if value is None else float(value)

    return compute


@dataclasses.dataclass(frozen=True)
class StudyMetric:
    name: str
    label: str  # as in the paper's Table 1
    compute: Callable[[StoredResponse, DTRSettings], float | None]
    kind: str | None = None  # divergence kind, for the DTR rows


METRICS: tuple[StudyMetric, ...] = (
    StudyMetric("dtr", "DTR (JSD)", lambda r, s: s.ratio(r, "jsd"), "jsd"),
    StudyMetric("dtr_kl", "DTR (KL)", lambda r, s: s.ratio(r, "kl"), "kl"),
    StudyMetric("dtr_cosine", "DTR (cosine)", lambda r, s: s.ratio(r, "cosine"), "cosine"),
    StudyMetric("token_count", "Token count", _baseline("token_count")),
    StudyMetric("reverse_token_count", "Reverse token count", _baseline("reverse_token_count")),
    StudyMetric("log_prob", "Log probability", _baseline("log_prob")),
    StudyMetric("neg_perplexity", "Negative perplexity", _baseline("neg_perplexity")),
    StudyMetric("neg_entropy", "Negative entropy", _baseline("neg_entropy")),
    StudyMetric("self_certainty", "Self-certainty", _baseline("self_certainty")),
)
METRIC_NAMES = tuple(m.name for m in METRICS)


def dtr_settings(
    store: Store, dtr: DTRConfig, g_by_kind: dict[str, float | None] | None = None
) -> DTRSettings:
    """Thresholds per stored kind: JSD's g from ``dtr``; others given, or matched to flag as many deep tokens."""
    if "jsd" not in store.kinds:
        raise InputError(
            f"{store.path}: the store holds {list(store.kinds)} divergences; the study needs jsd (the primary "
            f"kind) — generate with {named('divergence', 'jsd')}"
        )
    given = {k: g for k, g in (g_by_kind or {}).items() if g is not None}
    never = sorted(k for k in given if k not in store.kinds)
    if never:  # an option the store cannot honour is an error, never silently ignored
        raise InputError(
            f"{named('g_')}{never[0]}: {store.path} holds no {never[0]} divergence (it holds "
            f"{', '.join(store.kinds)}); "
            f"leave out {named('g_')}{never[0]}, or generate with {named('also_divergences')} {never[0]}"
        )
    thresholds = {"jsd": dtr.g, "jsd-nat": dtr.g * math.log(2.0)}
    unmatched = [k for k in store.kinds if k not in thresholds and k not in given]
    if unmatched:  # match each to JSD's share of deep tokens, over every stored token
        jsd = torch.cat([r.divergence["jsd"] for r in store.responses])
        deep_from = deep_threshold(store.n_layers, dtr.rho, dtr.deep_rule)
        for kind in unmatched:
            other = torch.cat([r.divergence[kind] for r in store.responses])
            given[kind] = matched_threshold(jsd, dtr.g, other, deep_from) if jsd.shape[0] else 0.0
    thresholds.update({k: g for k, g in given.items() if k in store.kinds and k not in thresholds})
    return DTRSettings(dtr, thresholds, store.n_layers)


# ---------------------------------------------------------------------------------------------------------
# The statistics.


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


TABLE_ONE_P = ("point_biserial_p", "spearman_p", "binned_r_p", "p_within_perm")
"""The p-value columns of Table 1 (and of the sweeps): Benjamini–Hochberg takes each as a family of its own."""


def metric_table(
    store: Store, metric: StudyMetric, settings: DTRSettings
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per question: (metric values, correct 0/1, token counts) of the responses whose metric is defined."""
    out = []
    for responses in store.questions().values():
        rows = [(metric.compute(r, settings), float(r.correct), float(r.token_count)) for r in responses]
        rows = [row for row in rows if row[0] is not None and math.isfinite(row[0])]
        out.append(tuple(np.array([row[i] for row in rows], dtype=np.float64) for i in range(3)))
    return out  # type: ignore[return-value]


def metric_values(
    store: Store, metric: StudyMetric, settings: DTRSettings
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per question: (metric values, correct 0/1) of the responses whose metric is defined."""
    return [(v, c) for v, c, _ in metric_table(store, metric, settings)]


def correlate(
    name: str,
    groups: Sequence[tuple[np.ndarray, np.ndarray]],
    cfg: CorrelationConfig,
    lengths: Sequence[np.ndarray] | None = None,
) -> Correlation:
    """The statistics of one metric from its per-question (values, correct) groups; ``lengths`` (per question,
    the same responses' token counts) adds the metric's within-question correlation with length."""
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


def _row(store: Store, c: Correlation, settings: DTRSettings | None, metric: StudyMetric) -> dict[str, Any]:
    return {
        "model": store.model,
        "task": store.task,
        "metric": c.metric,
        "label": metric.label,
        "g": settings.g_by_kind.get(metric.kind) if settings and metric.kind else None,
        "binned_r": c.binned_r,
        "binned_r_sd": c.binned_r_sd,
        "binned_r_lo": c.binned_r_ci[0],
        "binned_r_hi": c.binned_r_ci[1],
        "binned_r_p": c.binned_r_p,
        "questions_used": c.questions_used,
        "questions": len(store.questions()),
        "spearman": c.spearman,
        "spearman_lo": c.spearman_ci[0],
        "spearman_hi": c.spearman_ci[1],
        "spearman_p": c.spearman_p,
        "spearman_p_iid": c.spearman_p_iid,
        "point_biserial": c.point_biserial,
        "point_biserial_lo": c.point_biserial_ci[0],
        "point_biserial_hi": c.point_biserial_ci[1],
        "point_biserial_p": c.point_biserial_p,
        "point_biserial_p_iid": c.point_biserial_p_iid,
        "r_within": c.r_within,
        "p_within_perm": c.p_within_perm,
        "n_questions_within": c.n_questions_within,
        "r_length_within": c.r_length_within,
        "responses": c.responses,
        "accuracy": store.accuracy,
        "note": c.note,
    }


def store_correlations(
    store: Store,
    cfg: CorrelationConfig = CorrelationConfig(),
    dtr: DTRConfig = DTRConfig(),
    g_by_kind: dict[str, float | None] | None = None,
    metrics: Sequence[str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, float]]]]:
    """Table-1 rows of one store (one per metric it holds) and Figure 1's bin profiles per metric."""
    if not store.responses:
        raise InputError(f"{store.path}: no usable responses (failed: {store.failed})")
    if store.readout_tokens is not None and dtr.dtr_prefix_tokens is None:
        raise InputError(
            f"{store.path}: only the first {store.readout_tokens} tokens of each response were read out, so "
            f"DTR over whole responses cannot be computed; pass a prefix ≤ that ({named('dtr_prefix_tokens')}) or "
            f"regenerate with {named('readout_tokens')} all"
        )
    settings = dtr_settings(store, dtr, g_by_kind)
    wanted = [
        m
        for m in METRICS
        if (metrics is None or m.name in metrics) and (m.kind is None or m.kind in store.kinds)
    ]
    rows, profiles = [], {}
    for metric in wanted:
        table = metric_table(store, metric, settings)
        groups = [(v, c) for v, c, _ in table]
        lengths = [n for _, _, n in table]
        rows.append(_row(store, correlate(metric.name, groups, cfg, lengths), settings, metric))
        profiles[metric.name] = bin_profile(groups, cfg)
    return rows, profiles
