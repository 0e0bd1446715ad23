"""The deep-thinking paper's correlation study (definitions.md §4, Table 1, Figures 1 and 4), from sample stores only.

A store written by ``depthlens generate --readout-tokens all`` holds, per response, its grade and per-token
log p, entropy, self-certainty and per-layer divergences (``--also-divergences kl,cosine`` adds the other
kinds). Everything here is recomputed from those: DTR at any g, ρ, deep rule, prefix or divergence kind, and
the six baselines — no model is loaded.

Per metric: the paper's binned r (per question, ``bins`` quantile bins of the metric, Pearson r of bin mean
metric vs bin accuracy; averaged over questions, then over seeds), and beside it the unbinned per-response
Spearman ρ and point-biserial r with question-level bootstrap 95 % intervals; then the within-question ones:
the question-centred point-biserial r with its within-question permutation p, and the metric's question-centred
r with response length (is it a length proxy?); then with length held fixed (``stats.length``): the within-question
partial r holding token count and the cut at the cap fixed, with its permutation p, and the length-matched AUC.
"""

from __future__ import annotations

import collections
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
from depthlens.studies.correlation_stats import TABLE_ONE_P as TABLE_ONE_P  # the fronts find them here
from depthlens.studies.correlation_stats import Correlation as Correlation
from depthlens.studies.correlation_stats import bin_profile as bin_profile
from depthlens.studies.correlation_stats import correlate as correlate
from depthlens.studies.footprint import check_correlation
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


def metric_table(
    store: Store, metric: StudyMetric, settings: DTRSettings
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per question: (metric values, correct 0/1, token counts, cut at the cap 0/1) of the responses whose metric
    is defined."""
    out = []
    for responses in store.questions().values():
        rows = [
            (metric.compute(r, settings), float(r.correct), float(r.token_count), float(r.cut))
            for r in responses
        ]
        rows = [row for row in rows if row[0] is not None and math.isfinite(row[0])]
        values, correct, lengths, cut = (
            np.array([row[i] for row in rows], dtype=np.float64) for i in range(4)
        )
        out.append((values, correct, lengths, cut))
    return out


def metric_values(
    store: Store, metric: StudyMetric, settings: DTRSettings
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per question: (metric values, correct 0/1) of the responses whose metric is defined."""
    return [(v, c) for v, c, _, _ in metric_table(store, metric, settings)]


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
        "r_within_partial": c.r_within_partial,
        "p_within_partial": c.p_within_partial,
        "auc_length_matched": c.auc_length_matched,
        "auc_length_matched_lo": c.auc_length_matched_ci[0],
        "auc_length_matched_hi": c.auc_length_matched_ci[1],
        "auc_length_matched_p": c.auc_length_matched_p,
        "pairs_length_matched": c.pairs_length_matched,
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
    pools = collections.Counter(r.question_id for r in store.responses)
    check_correlation(cfg, len(pools), max(pools.values()))  # its seeds' and permutations' arrays fit
    settings = dtr_settings(store, dtr, g_by_kind)
    wanted = [
        m
        for m in METRICS
        if (metrics is None or m.name in metrics) and (m.kind is None or m.kind in store.kinds)
    ]
    rows, profiles = [], {}
    for metric in wanted:
        table = metric_table(store, metric, settings)
        groups = [(v, c) for v, c, _, _ in table]
        lengths, cuts = [n for _, _, n, _ in table], [k for _, _, _, k in table]
        rows.append(_row(store, correlate(metric.name, groups, cfg, lengths, cuts), settings, metric))
        profiles[metric.name] = bin_profile(groups, cfg)
    return rows, profiles
