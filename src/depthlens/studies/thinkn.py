"""Think@n over a sample store: the store's pools as voting sees them, the summary files of each voting setting,
and Think@n as deployed, live on a backend (docs/definitions.md §5).

Summaries: ``thinkn-n<n>-eta<η>-l<ℓ>.json`` / ``.csv`` (and ``-ablation.csv``) beside the store's responses, one per
voting setting (see ``summary_stem``); a summary of other settings under the same name is replaced only with
``overwrite``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import DTRConfig, VotingConfig
from depthlens.errors import InputError, StoreError, named
from depthlens.evals.grading import ANSWER_FIELDS, AnswerSummary
from depthlens.metrics.dtr import deep_from_divergence
from depthlens.sampling.backend import GenerationBackend, Trace
from depthlens.stats.resampling import mean_bootstrap
from depthlens.stores.files import read_json, settings_differ
from depthlens.stores.samples import damaged, read_manifest, read_responses
from depthlens.stores.state import stale, store_state
from depthlens.studies.comparisons import BASELINE, Comparison, control_comparison, paired_comparisons
from depthlens.studies.footprint import check_trials
from depthlens.studies.tables import write_csv, write_whole
from depthlens.studies.vote_notes import vote_notes as vote_notes  # where the fronts have always found it
from depthlens.voting.exact import ExactOutcomes, exact_outcomes
from depthlens.voting.methods import METHODS, Response, think_at_n
from depthlens.voting.trials import (
    MethodSummary,
    TrialOutcomes,
    ablation,
    per_question_accuracy,
    trial_outcomes,
)


@dataclasses.dataclass(frozen=True)
class StoreInfo:
    manifest: dict[str, Any]
    questions: int
    responses: int
    failed: list[str]  # ids of failed responses
    excluded: list[str]  # questions left out of voting (fewer usable responses than n)
    grades: dict[str, int]
    answers: AnswerSummary
    most_usable: int = 0  # the most usable responses any question has
    first_error: str = ""  # why the first failed response failed


def response_from_record(record: dict[str, Any], n_layers: int, dtr: DTRConfig) -> Response:
    """A stored response as voting sees it: deep flags from its stored divergences with ``dtr``."""
    return Response(
        key=record["vote_key"],
        correct=bool(record["correct"]),
        length=int(record["token_count"]),
        deep=deep_from_divergence(record["divergence"], n_layers, dtr, record.get("layer_top_ids")).numpy(),
        self_certainty=np.asarray(record["self_certainty"], dtype=np.float64),
        confidence=np.asarray(record["confidence"], dtype=np.float64),
    )


def load_pools(out_dir: Path, dtr: DTRConfig, n: int = 1) -> tuple[dict[str, list[Response]], StoreInfo]:
    """Every question's usable responses as ``Response``s (deep flags from the stored divergences with ``dtr``).

    Questions with fewer than ``n`` usable responses (because generation failed) are left out and listed.
    """
    return pools_from_records(read_manifest(out_dir), read_responses(out_dir), dtr, n)


def pools_from_records(
    manifest: dict[str, Any], records: Iterable[tuple[str, dict[str, Any]]], dtr: DTRConfig, n: int = 1
) -> tuple[dict[str, list[Response]], StoreInfo]:
    """``load_pools`` over (where, record) pairs of a store (``manifest``: its ``n_layers`` and ``questions``) —
    read from disk, or the rows of ``depthlens.generate``'s table."""
    n_layers = int(manifest["n_layers"])
    pools: dict[str, list[Response]] = {q: [] for q in manifest["questions"]}
    failed, grades, usable_records, first_error = [], Counter[str](), [], ""
    for where, record in records:
        if record.get("status") == "failed":
            failed.append(str(record.get("id")))
            first_error = first_error or str(record.get("error", ""))
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
        max((len(p) for p in pools.values()), default=0),
        first_error,
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
    per_question: dict[str, Any] | None = None  # accuracy per method per question (exact): for pooling
    control: Comparison | None = None  # Think@n − random@n over questions: the study's primary contrast


def too_few(out_dir: Path | str, info: StoreInfo, n: int) -> str:
    """Why no question can be voted on with ``n`` responses, and the remedy that works: a smaller ``n`` where
    some are usable; a store generated again where every response failed (``resume`` does not retry those)."""
    pool = info.manifest["pool"]
    if info.most_usable == 0 and info.failed:
        cause = f" (the first: {info.first_error})" if info.first_error else ""
        return (
            f"{out_dir}: all {len(info.failed)} of its responses failed to generate{cause}, so there is nothing "
            f"to vote on; fix that, then generate the store again with {named('overwrite', True)}"
        )
    if info.most_usable == 0:
        return (
            f"{out_dir}: it holds no responses yet (pool {pool}); finish it first by rerunning the command that "
            f"wrote it with {named('resume', True)}"
        )
    return (
        f"{out_dir}: no question has {n} usable responses (pool {pool}, {len(info.failed)} failed; the most "
        f"any question has is {info.most_usable}); use {named('n', info.most_usable)} or less, or generate a "
        f"store with a larger {named('pool')}"
    )


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
    report = vote_pools(pools, info, voting, dtr, methods, with_ablation, where=str(out_dir))
    _write_summary(out_dir, report, methods, overwrite)
    return report


def vote_pools(
    pools: dict[str, list[Response]],
    info: StoreInfo,
    voting: VotingConfig,
    dtr: DTRConfig,
    methods: Sequence[str] | None = None,
    with_ablation: bool = False,
    where: str = "the pool",
    on_trial: Callable[[int], None] = lambda n: None,
) -> ThinkReport:
    """``summarise``'s vote, in memory: ``voting.trials`` draws of n from each usable pool and the expectation over
    every draw (``voting.exact``), every method against Cons@n per question on the latter (``where`` names the
    pool in the error when no question has n usable responses; ``on_trial`` is told each finished trial)."""
    if not pools:
        raise InputError(too_few(where, info, voting.n))
    check_trials(voting, len(pools), list(methods or METHODS))  # the trials' arrays, before the first trial
    outcomes = trial_outcomes(pools, voting, methods, on_trial)
    exact = exact_outcomes(pools, voting, methods)
    table = ablation(pools, voting) if with_ablation else None
    return ThinkReport(
        outcomes.summaries(exact),
        info,
        voting,
        dtr,
        table,
        compare_methods(exact, seed=voting.seed),
        accuracy_intervals(exact, seed=voting.seed),
        per_question_table(outcomes, exact),
        control_comparison(exact.accuracy, seed=voting.seed),
    )


# ---------------------------------------------------------------------------------------------------------
# One vote's methods against Cons@n, question by question (the statistics: ``stats.paired``).
#
# The unit of pairing is the question. Each question's outcome is the method's expected accuracy on that question's
# pool under random draws of n — exactly, over every draw (``voting.exact``), where the trials' mean would carry
# their draw noise (10 trials of n = 8 from the same 16 responses are not 10 replications, and 10 trials × 30
# questions are not 300 observations) — and the test runs over questions, the independent draws from the task.


def question_accuracy(outcomes: TrialOutcomes | ExactOutcomes) -> dict[str, np.ndarray]:
    """Each method's accuracy per question: its exact expectation, or (trials) its mean over trials."""
    if isinstance(outcomes, ExactOutcomes):
        return outcomes.accuracy
    return per_question_accuracy(outcomes)


def compare_methods(
    outcomes: TrialOutcomes | ExactOutcomes, baseline: str = BASELINE, seed: int = 0
) -> list[Comparison]:
    """``paired_comparisons`` of one vote's methods; none when the baseline was not among them."""
    accuracy = question_accuracy(outcomes)
    return paired_comparisons(accuracy, baseline, seed=seed) if baseline in accuracy else []


def accuracy_intervals(
    outcomes: TrialOutcomes | ExactOutcomes, resamples: int = 10_000, seed: int = 0
) -> dict[str, tuple[float | None, float | None]]:
    """Each method's 95 % interval of accuracy over resampled questions (per question as above): what Figure 5's
    bars show; within [0, 1] by construction."""
    out = {}
    for i, (m, per_q) in enumerate(question_accuracy(outcomes).items()):
        b = mean_bootstrap(per_q, resamples, [seed, 1_000 + i])
        out[m] = (b.low, b.high)
    return out


def per_question_table(outcomes: TrialOutcomes, exact: ExactOutcomes | None = None) -> dict[str, Any]:
    """The per-question accuracies as a summary stores them, so stores of one model can be pooled later without
    voting again: ``accuracy`` the exact expectations where computed (``basis`` says which), ``accuracy_trials``
    the trials' means (what an online replay's Cons@n is matched against). 6 decimals: far below a point."""

    def rounded(table: dict[str, np.ndarray]) -> dict[str, list[float]]:
        return {m: [round(float(v), 6) for v in a] for m, a in table.items()}

    trials = rounded(per_question_accuracy(outcomes))
    return {
        "questions": list(outcomes.questions),
        "basis": "trials" if exact is None else "exact",
        "accuracy": trials if exact is None else rounded(exact.accuracy),
        "accuracy_trials": trials,
    }


def control_row(control: Comparison | None) -> dict[str, Any] | None:
    """Think@n − random@n as a summary stores it: the method, then ``Comparison.row()``'s columns; None when
    either was not voted."""
    return None if control is None else {"method": control.method, **control.row()}


def stored_voting(settings: dict[str, Any]) -> VotingConfig:
    """The voting settings a summary was voted with (its ``voting``): one written before ``tie_break`` existed was
    voted under ``summed-dtr``, the only rule then."""
    return VotingConfig.from_dict({"tie_break": "summed-dtr", **settings})


def summary_stem(voting: VotingConfig) -> str:
    """The file stem of a summary, from the settings most runs vary: ``thinkn-n16-eta0.5-l50``."""
    prefix = "full" if voting.rank_prefix is None else voting.rank_prefix
    return f"thinkn-n{voting.n}-eta{voting.eta:g}-l{prefix}"


def summary_files(out_dir: Path) -> list[Path]:
    """The store's summaries, the most recently written last."""
    return sorted(out_dir.glob("thinkn-*.json"), key=lambda p: (p.stat().st_mtime_ns, p.name))


def summary_rows(report: ThinkReport) -> list[dict[str, Any]]:
    """One row per method as the summary CSV holds it: accuracy and cost, cost against Cons@n, the 95 % accuracy
    interval over questions and the paired test against Cons@n (empty in Cons@n's own row)."""
    cons = next((s for s in report.summaries if s.method == "cons@n"), None)
    rows = []
    paired = {c.method: c.row() for c in report.paired}
    blank = dict.fromkeys(next(iter(paired.values()), {}))  # the baseline's row: the same columns, empty
    for s in report.summaries:
        row: dict[str, Any] = s.to_dict()
        row["cost_vs_cons"] = s.cost_mean / cons.cost_mean if cons and cons.cost_mean else None
        row["accuracy_lo"], row["accuracy_hi"] = report.intervals.get(s.method, (None, None))
        rows.append({**row, **paired.get(s.method, blank)})
    return rows


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
        stored = {k: earlier.get(k) for k in settings}
        if isinstance(stored["voting"], dict):  # voted before tie_break existed: under summed-dtr
            stored["voting"] = {"tie_break": "summed-dtr", **stored["voting"]}
        differ = settings_differ(stored, settings, ())
        if differ:
            old = stale(earlier, out_dir)
            raise StoreError(
                f"{path} holds a summary voted with other settings ({'; '.join(differ)})"
                + (f", and {old}" if old else "")
                + f"; pass {named('overwrite')} to replace it, or vote with its settings"
            )
    rows = summary_rows(report)
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
        "control": control_row(report.control),
        "command": " ".join(sys.argv),
    }
    # The CSV stands alone (committed under docs/data, compared across stores): it names its model and task.
    task = str((report.info.manifest.get("task") or {}).get("name", "?")).removeprefix("reasoning_gym:")
    write_csv(out_dir / f"{stem}.csv", [{"model": payload["model"], "task": task, **r} for r in rows])
    if report.ablation:
        write_csv(out_dir / f"{stem}-ablation.csv", report.ablation)
    # last: the summary's JSON stands for a whole set of files
    write_whole(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


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
    if voting.rank_prefix is None:
        raise InputError(
            f"live Think@n needs a finite {named('rank_prefix')} (the full-length ranking is an offline ablation)"
        )
    paused = backend.start(prompt, seeds, stop_after=voting.rank_prefix)
    responses = [response_from_trace(t, backend.n_layers, dtr) for t in paused.traces]
    ranked = think_at_n(responses, voting)
    traces = backend.resume(paused, list(ranked.kept))
    final = [
        dataclasses.replace(response_from_trace(t, backend.n_layers, dtr), key=answer_key(t)) for t in traces
    ]
    # A plain vote among the kept. A tie under ``uniform`` answers the first given of the tied: the samples are
    # exchangeable, so that is a uniform pick.
    outcome = think_at_n(final, dataclasses.replace(voting, eta=1.0))
    return outcome.answer, paused.traces, sum(len(t) for t in paused.traces)


def response_from_trace(trace: Trace, n_layers: int, dtr: DTRConfig) -> Response:
    """A trace as voting sees it (no answer key or grade yet): deep flags from its read-out divergences."""
    deep = deep_from_divergence(trace.divergence, n_layers, dtr, trace.layer_top_ids)
    return Response(
        None, False, len(trace), deep.numpy(), np.asarray(trace.self_certainty), np.asarray(trace.confidence)
    )
