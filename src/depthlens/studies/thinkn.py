"""Think@n over a sample store: the store's pools as voting sees them, the summary files of each voting setting,
and Think@n as deployed, live on a backend (docs/definitions.md §5).

Summaries: ``thinkn-n<n>-eta<η>-l<ℓ>.json`` / ``.csv`` (and ``-ablation.csv``) beside the store's responses, one per
voting setting (see ``summary_stem``); a summary of other settings under the same name is replaced only with
``overwrite``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import DTRConfig, VotingConfig
from depthlens.errors import InputError, StoreError
from depthlens.evals.grading import ANSWER_FIELDS, AnswerSummary
from depthlens.metrics.dtr import deep_from_divergence
from depthlens.sampling.backend import GenerationBackend, Trace
from depthlens.stores.files import read_json, settings_differ, write_json
from depthlens.stores.samples import damaged, read_manifest, read_responses
from depthlens.stores.state import stale, store_state
from depthlens.studies.tables import write_csv
from depthlens.voting.methods import Response, think_at_n
from depthlens.voting.paired import Comparison, accuracy_intervals, compare_methods, per_question_table
from depthlens.voting.trials import MethodSummary, ablation, trial_outcomes


@dataclasses.dataclass(frozen=True)
class StoreInfo:
    manifest: dict[str, Any]
    questions: int
    responses: int
    failed: list[str]  # ids of failed responses
    excluded: list[str]  # questions left out of voting (fewer usable responses than n)
    grades: dict[str, int]
    answers: AnswerSummary


def response_from_record(record: dict[str, Any], n_layers: int, dtr: DTRConfig) -> Response:
    """A stored response as voting sees it: deep flags from its stored divergences with ``dtr``."""
    return Response(
        key=record["vote_key"],
        correct=bool(record["correct"]),
        length=int(record["n_tokens"]),
        deep=deep_from_divergence(record["divergence"], n_layers, dtr).numpy(),
        self_certainty=np.asarray(record["self_certainty"], dtype=np.float64),
        confidence=np.asarray(record["confidence"], dtype=np.float64),
    )


def load_pools(out_dir: Path, dtr: DTRConfig, n: int = 1) -> tuple[dict[str, list[Response]], StoreInfo]:
    """Every question's usable responses as ``Response``s (deep flags from the stored divergences with ``dtr``).

    Questions with fewer than ``n`` usable responses (because generation failed) are left out and listed.
    """
    manifest = read_manifest(out_dir)
    n_layers = int(manifest["n_layers"])
    pools: dict[str, list[Response]] = {q: [] for q in manifest["questions"]}
    failed, grades, usable_records = [], Counter(), []
    for where, record in read_responses(out_dir):
        if record.get("status") == "failed":
            failed.append(str(record.get("id")))
            continue
        try:
            response = response_from_record(record, n_layers, dtr)
        except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
            raise damaged(where, exc) from None
        grades[str(record.get("grade", "?"))] += 1
        usable_records.append({k: record.get(k) for k in ANSWER_FIELDS})
        pools.setdefault(str(record["question_id"]), []).append(response)
    excluded = sorted(q for q, p in pools.items() if len(p) < n)
    usable = {q: p for q, p in pools.items() if len(p) >= n}
    info = StoreInfo(
        manifest,
        len(pools),
        sum(len(p) for p in pools.values()),
        failed,
        excluded,
        dict(grades),
        AnswerSummary.of(manifest, usable_records),
    )
    return usable, info


@dataclasses.dataclass(frozen=True)
class ThinkReport:
    summaries: list[MethodSummary]
    info: StoreInfo
    voting: VotingConfig
    dtr: DTRConfig
    ablation: list[dict[str, Any]] | None = None
    # Each method against Cons@n over questions, and each method's 95 % accuracy interval over questions.
    paired: list[Comparison] = dataclasses.field(default_factory=list)
    intervals: dict[str, tuple[float | None, float | None]] = dataclasses.field(default_factory=dict)
    per_question: dict[str, Any] | None = None  # accuracy per method per question (trial means): for pooling


def summarise(
    out_dir: Path,
    voting: VotingConfig = VotingConfig(),
    dtr: DTRConfig | None = None,
    methods: Sequence[str] | None = None,
    with_ablation: bool = False,
    overwrite: bool = False,
) -> ThinkReport:
    """Vote over the store's pools (``voting.trials`` draws of n) and write the summary files.

    A summary named like this one's (``summary_stem``) but voted with other settings raises StoreError unless
    ``overwrite``.
    """
    manifest = read_manifest(out_dir)
    dtr = dtr or DTRConfig.from_dict(manifest["dtr"])
    pools, info = load_pools(out_dir, dtr, voting.n)
    if not pools:
        raise InputError(
            f"{out_dir}: no question has {voting.n} usable responses (pool {manifest['pool']}, "
            f"{len(info.failed)} failed); lower --n or generate more"
        )
    outcomes = trial_outcomes(pools, voting, methods)
    table = ablation(pools, voting) if with_ablation else None
    report = ThinkReport(outcomes.summaries(), info, voting, dtr, table, compare_methods(outcomes, seed=voting.seed),
                         accuracy_intervals(outcomes, seed=voting.seed), per_question_table(outcomes))  # fmt: skip
    _write_summary(out_dir, report, methods, overwrite)
    return report


def summary_stem(voting: VotingConfig) -> str:
    """The file stem of a summary, from the settings most runs vary: ``thinkn-n16-eta0.5-l50``."""
    prefix = "full" if voting.prefix is None else voting.prefix
    return f"thinkn-n{voting.n}-eta{voting.eta:g}-l{prefix}"


def summary_files(out_dir: Path) -> list[Path]:
    """The store's summaries, the most recently written last."""
    return sorted(out_dir.glob("thinkn-*.json"), key=lambda p: (p.stat().st_mtime_ns, p.name))


def _write_summary(
    out_dir: Path, report: ThinkReport, methods: Sequence[str] | None, overwrite: bool
) -> None:
    stem = summary_stem(report.voting)
    path = out_dir / f"{stem}.json"
    settings = {
        "voting": report.voting.to_dict(),
        "dtr": report.dtr.to_dict(),
        "methods_asked": list(methods or []),
        "ablation_asked": report.ablation is not None,
    }
    state = store_state(out_dir)
    if path.exists() and not overwrite:
        earlier = read_json(
            path, "summary", "it is derived from the store: pass --overwrite to vote it again"
        )
        differ = settings_differ({k: earlier.get(k) for k in settings}, settings, ())
        if differ:
            old = stale(earlier, out_dir)
            raise StoreError(
                f"{path} holds a summary voted with other settings ({'; '.join(differ)})"
                + (f", and {old}" if old else "")
                + "; pass --overwrite to replace it, or vote with its settings"
            )
    cons = next((s for s in report.summaries if s.method == "cons@n"), None)
    rows = []
    paired = {c.method: c.row() for c in report.paired}
    blank = dict.fromkeys(next(iter(paired.values()), {}))  # the baseline's row: the same columns, empty
    for s in report.summaries:
        row = s.to_dict()
        row["cost_vs_cons"] = s.cost_mean / cons.cost_mean if cons and cons.cost_mean else None
        row["accuracy_lo"], row["accuracy_hi"] = report.intervals.get(s.method, (None, None))
        rows.append({**row, **paired.get(s.method, blank)})
    payload = {
        "store": str(out_dir),
        "store_state": state,  # which committed state of the store this summary was voted over
        "model": report.info.manifest["model"],
        "task": report.info.manifest.get("task"),
        **settings,
        "questions_used": report.info.questions - len(report.info.excluded),
        "questions_excluded": report.info.excluded,
        "responses": report.info.responses,
        "failed_responses": report.info.failed,
        "grades": report.info.grades,
        "answers": report.info.answers.to_dict(),
        "methods": rows,
        "ablation": report.ablation,
        "per_question": report.per_question,
        "command": " ".join(sys.argv),
    }
    write_csv(out_dir / f"{stem}.csv", rows)
    if report.ablation:
        write_csv(out_dir / f"{stem}-ablation.csv", report.ablation)
    write_json(path, payload)  # last: the summary's JSON stands for a whole set of files


def think_at_n_live(
    backend: GenerationBackend,
    prompt: Sequence[int],
    seeds: Sequence[int],
    voting: VotingConfig,
    dtr: DTRConfig,
    answer_key: Callable[[Trace], str | None],
) -> tuple[str | None, list[Trace], int]:
    """Think@n as deployed: prefixes for all n, keep the top η by prefix DTR, finish only those, vote.

    Returns (the voted answer key, every trace — rejected ones stop at their prefix —, generated tokens).
    """
    if voting.prefix is None:
        raise InputError(
            "live Think@n needs a finite --prefix (the full-length ranking is an offline ablation)"
        )
    paused = backend.start(prompt, seeds, stop_after=voting.prefix)
    responses = [response_from_trace(t, backend.n_layers, dtr) for t in paused.traces]
    ranked = think_at_n(responses, voting)
    traces = backend.resume(paused, list(ranked.kept))
    final = [
        dataclasses.replace(response_from_trace(t, backend.n_layers, dtr), key=answer_key(t)) for t in traces
    ]
    outcome = think_at_n(final, dataclasses.replace(voting, eta=1.0))  # a plain vote among the kept
    return outcome.answer, paused.traces, sum(len(t) for t in paused.traces)


def response_from_trace(trace: Trace, n_layers: int, dtr: DTRConfig) -> Response:
    """A trace as voting sees it (no answer key or grade yet): deep flags from its read-out divergences."""
    deep = deep_from_divergence(trace.divergence, n_layers, dtr)
    return Response(
        None, False, len(trace), deep.numpy(), np.asarray(trace.self_certainty), np.asarray(trace.confidence)
    )
