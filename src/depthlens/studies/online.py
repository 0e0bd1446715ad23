"""Online Think@n live: generate per question as ``voting.online`` decides, into a resumable store.

The policy is described in docs/architecture.md (online Think@n).

Store (a directory, a sample store that ``load_pools`` and ``replay`` read like any other):
- ``questions.jsonl``, ``samples.jsonl`` (+ manifest, which holds the online settings) — every response the run
  started, in sampling order, as ``thinkn.sample_record`` writes it plus ``phase`` and ``stopped_at`` (the token
  count where the policy stopped it; its record then holds only those tokens);
- ``online.jsonl`` — one line per finished question: the voted answer, exact cost, why sampling stopped, and the
  decision on every response (index, seed, signal, τ, stopped where and why, the vote after its batch).

The run talks to the engine only through ``GenerationBackend``: a ``dtr`` batch is ``start``ed up to ℓ tokens
and only the responses that clear τ are ``resume``d. The ``confidence`` signal can stop a response at any token;
the protocol has no per-token stop, so on the transformers path responses are generated to their end and cut
where the policy stopped them — the same tokens, decisions and counted cost as a run that stopped there, but no
wall time saved. The vLLM backend (``EngineGenerator.sample_stopping``) ends each response in the engine right
after the token where the policy stops it (``_ConfidenceStop``: the same arithmetic, token by token), so the
time is saved and the store is the same (tests/test_vllm_readout.py).

Resume: a batch whose responses are all in the store is read back instead of generated; a batch cut by a kill is
regenerated whole (same seeds, same batch layout) and only its missing responses are written, so a resumed run
makes the decisions of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import DTRConfig, OnlineConfig, OnlineRun, SamplingConfig, VotingConfig
from depthlens.errors import DepthlensError, InputError, StoreError, named
from depthlens.evals.tasks import Question
from depthlens.metrics.dtr import deep_from_divergence
from depthlens.models.load import LoadedModel
from depthlens.models.precision import precision_of
from depthlens.sampling.backend import PER_TOKEN, GenerationBackend, Trace
from depthlens.sampling.choose import make_backend
from depthlens.stores.files import ResumeRules
from depthlens.stores.jsonl import ResultWriter, iter_jsonl
from depthlens.stores.sample_writes import MANIFEST_DEFAULTS, store_manifest, vocab_entry, write_questions
from depthlens.stores.samples import (
    SAMPLES,
    STORED_DIGITS,
    damaged,
    read_manifest,
    read_responses,
    stored,
    stored_rows,
)
from depthlens.stores.state import remove_derived
from depthlens.studies.footprint import check_trials, refuse_unfit
from depthlens.studies.generate import engine_job, prompt_ids, sample_seed
from depthlens.studies.sample_records import sample_record
from depthlens.studies.thinkn import response_from_record
from depthlens.voting.methods import Response
from depthlens.voting.online import SIGNALS, OnlineOutcome, Sampler, replay_trials, run_policy, stop_point
from depthlens.voting.trials import run_trials

DECISIONS = "online.jsonl"


def check_online(online: OnlineConfig, sampling: SamplingConfig) -> None:
    """Reject settings the run cannot honour, before any model is loaded (``studies.runs`` calls it for every
    front)."""
    if not SIGNALS[online.signal].decides_at_prefix:
        return
    ell = online.decision_prefix
    if ell > sampling.max_new_tokens:
        raise InputError(
            setting="decision_prefix",
            value=ell,
            requirement=f"must be at most {named('max_new_tokens', sampling.max_new_tokens)} (no response could "
            f"reach a later decision); lower {named('decision_prefix')} or raise {named('max_new_tokens')}",
        )
    readout = sampling.readout_tokens
    if readout is not None and readout < ell:
        raise InputError(
            setting="readout_tokens",
            value=readout,
            requirement=f"must be at least {named('decision_prefix', ell)} (the prefix DTR needs every prefix token "
            f"read out); raise {named('readout_tokens')} or lower {named('decision_prefix')}",
        )


def rounded_response(trace: Trace, n_layers: int, dtr: DTRConfig) -> Response:
    """A trace exactly as its stored record will read back (5-decimal values), so decisions made now match a
    replay of the store bit for bit."""

    def kept(values: Sequence[float]) -> np.ndarray:
        return np.asarray(stored(values), dtype=np.float64)

    deep = deep_from_divergence(stored_rows(trace.divergence), n_layers, dtr, trace.layer_top_ids).numpy()
    return Response(None, False, len(trace), deep, kept(trace.self_certainty), kept(trace.confidence))


class _ConfidenceStop:
    """The confidence policy fed one token at a time: whether a response stops right after this token.

    ``stop_point``'s arithmetic, incrementally: the running sum of the stored (5-decimal) confidences is the same
    sequential float64 sum its ``np.cumsum`` forms, so the first group below τ — hence the stop — is the replay's.
    """

    def __init__(self, tau: float, online: OnlineConfig) -> None:
        self.tau, self.window, self.sums = tau, online.window, [0.0]

    def __call__(self, confidence: float) -> bool:
        self.sums.append(self.sums[-1] + round(confidence, STORED_DIGITS))
        n = len(self.sums) - 1
        return n >= self.window and (self.sums[n] - self.sums[n - self.window]) / self.window < self.tau


def _cut_trace(trace: Trace, tokens: int) -> None:
    """Drop everything a run that stopped this response after ``tokens`` tokens would not have produced."""
    del trace.token_ids[tokens:]
    for key in (*PER_TOKEN, "divergence"):
        del getattr(trace, key)[tokens:]
    for rows in trace.also.values():
        del rows[tokens:]


def generate_batch(
    backend: GenerationBackend,
    prompt: Sequence[int],
    seeds: Sequence[int],
    tau: float | None,
    online: OnlineConfig,
    dtr: DTRConfig,
) -> tuple[list[Trace], list[int | None]]:
    """One batch as the policy runs it: the traces (stopped ones hold only their tokens) and the stop points."""
    n_layers = backend.n_layers
    if tau is None:  # warm-up: in full
        traces = backend.start(prompt, seeds).traces
        return traces, [None] * len(traces)
    if SIGNALS[online.signal].decides_at_prefix:  # pause every response at ℓ, continue only those kept
        paused = backend.start(prompt, seeds, stop_after=online.decision_prefix)
        stops = [stop_point(rounded_response(t, n_layers, dtr), tau, online) for t in paused.traces]
        keep = [j for j, t in enumerate(paused.traces) if stops[j] is None and t.finish == "paused"]
        if keep:
            backend.resume(paused, keep)
        return paused.traces, stops
    if hasattr(
        backend, "sample_stopping"
    ):  # the vLLM backend ends each response in the engine where it stops
        return backend.sample_stopping(prompt, seeds, lambda: _ConfidenceStop(tau, online))
    traces = backend.start(prompt, seeds).traces
    stops = [stop_point(rounded_response(t, n_layers, dtr), tau, online) for t in traces]
    for t, stop in zip(traces, stops, strict=True):
        if stop is not None:
            _cut_trace(t, stop)
    return traces, stops


@dataclasses.dataclass
class OnlineReport:
    questions: int = 0
    skipped: int = 0  # questions already finished in the store (resume)
    tokens: int = 0  # generated tokens, over every question (read back for finished ones)
    correct: int = 0
    stops: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, line: dict[str, Any]) -> None:
        """Count one finished question's decision line (run now, or read back from the store)."""
        self.questions += 1
        self.tokens += line["tokens"]
        self.correct += bool(line["correct"])
        self.stops[line["stop"]] = self.stops.get(line["stop"], 0) + 1


@dataclasses.dataclass(frozen=True)
class OnlineEvents:
    """Progress callbacks of a live online run: each finished question's outcome, each batch's response count,
    each step's generated tokens."""

    on_question: Callable[[OnlineOutcome], None] = lambda o: None
    on_batch: Callable[[int], None] = lambda n: None
    on_token: Callable[[int], None] = lambda n: None


def run_online(
    lm: LoadedModel,
    run: OnlineRun,
    questions: Sequence[Question],
    backend: GenerationBackend | None = None,
    events: OnlineEvents = OnlineEvents(),
) -> OnlineReport:
    """Run the online policy live on every question into the store ``run.store``; resumable.

    ``run.engine`` picks the generation backend (recorded in the manifest) unless ``backend`` is given.
    """
    online, out_dir = run.online, run.store.out
    check_online(online, run.sampling)
    refuse_unfit(lm, run, questions)
    manifest = _manifest(lm, run, questions)
    out_dir.mkdir(parents=True, exist_ok=True)
    if backend is None:
        requests = max(online.warmup, online.batch_size)
        job = engine_job(lm, questions, run.sampling.max_new_tokens, requests, run.answers.prompt_style)
        backend = make_backend(lm, run.engine, run.sampling, run.readout, events.on_token, job)
    report = OnlineReport()
    rules, resume, overwrite = ResumeRules(MANIFEST_DEFAULTS), run.store.resume, run.store.overwrite
    with (
        ResultWriter(out_dir / SAMPLES, manifest, resume, overwrite, rules) as samples,
        ResultWriter(out_dir / DECISIONS, manifest, resume, overwrite, rules) as decided,
    ):
        if overwrite:
            remove_derived(out_dir)  # the replays of the run this one replaces
        write_questions(out_dir, questions)
        kept = _stored_records(out_dir / SAMPLES, samples.done)
        finished = {r["id"]: r for r in iter_jsonl(out_dir / DECISIONS) if r["id"] in decided.done}
        try:
            for question in questions:
                if question.id in finished:
                    line = finished[question.id]
                    report.skipped += 1
                else:
                    outcome = _run_question(
                        _OnlineJob(lm, backend, samples, kept, question, run), events.on_batch
                    )
                    line = _decision_line(question, outcome, run.seed)
                    decided.write(line)
                    events.on_question(outcome)
                report.add(line)
        except DepthlensError as exc:
            if isinstance(exc, StoreError):  # the store's own error already says how to go on
                raise
            raise type(exc)(
                f"{exc} — questions finished so far are kept in {out_dir}; rerun with {named('resume')}"
            ) from exc
    return report


def _manifest(lm: LoadedModel, run: OnlineRun, questions: Sequence[Question]) -> dict[str, Any]:
    """A live online store's manifest: a sample store's, its pool the policy's most responses, plus the policy."""
    online = run.online
    settings = {"task": run.task.to_dict() if run.task else {}, "pool": online.max_n, "seed": run.seed}
    settings |= {"batch_size": online.batch_size, "online": online.to_dict(), "sampling": run.sampling}
    settings |= {"readout": run.readout, "dtr": run.dtr, "engine": run.engine, "answers": run.answers}
    manifest = store_manifest(lm.name, lm.n_layers, questions, settings)
    made_by = {"command": run.command} if run.command else {}  # a Python call's own record
    return {**manifest, **vocab_entry(lm), "precision": precision_of(lm, run.engine), **made_by}


def _stored_records(path: Path, done: set[str]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in iter_jsonl(path) if r["id"] in done}


@dataclasses.dataclass(frozen=True)
class _OnlineJob:
    """One question of a live online run: the model, the engine, where responses go, those already stored."""

    lm: LoadedModel
    backend: GenerationBackend
    writer: ResultWriter
    kept: dict[
        str, dict[str, Any]
    ]  # stored responses by id (read back on resume, added to as they are written)
    question: Question
    run: OnlineRun


def _run_question(job: _OnlineJob, on_batch: Callable[[int], None]) -> OnlineOutcome:
    lm, question, run = job.lm, job.question, job.run
    prompt: list[int] | None = None

    def sample(indices: Sequence[int], tau: float | None) -> list[Response]:
        nonlocal prompt
        ids = [f"{question.id}#{i}" for i in indices]
        if not all(i in job.kept for i in ids):  # a batch cut by a kill is regenerated whole, same layout
            prompt = prompt if prompt is not None else prompt_ids(lm, question, run.answers.prompt_style)
            seeds = [sample_seed(run.seed, question.id, i) for i in indices]
            traces, stops = generate_batch(job.backend, prompt, seeds, tau, run.online, run.dtr)
            for i, key, trace, stop in zip(indices, ids, traces, stops, strict=True):
                record = sample_record(lm, question, i, trace, run.dtr, run.answers, prompt=prompt)
                record.update(phase="warm-up" if tau is None else "online", stopped_at=stop)
                if stop is not None:
                    record["finish"] = "stopped"  # by the policy (it may have ended there by itself too)
                if key not in job.kept:
                    job.writer.write(record)
                    job.kept[key] = record
            on_batch(len(indices))
        return [response_from_record(job.kept[k], lm.n_layers, run.dtr) for k in ids]

    sampler: Sampler = sample
    return run_policy(run.online, sampler)


def _decision_line(question: Question, outcome: OnlineOutcome, seed: int) -> dict[str, Any]:
    return {
        "id": question.id,
        "answer": outcome.answer,
        "correct": outcome.correct,
        "tokens": outcome.tokens,
        "started": outcome.started,
        "threshold": outcome.threshold,
        "stop": outcome.stop,
        "decisions": [
            {"seed": sample_seed(seed, question.id, d.index), **d.to_dict()} for d in outcome.decisions
        ],
    }


def ordered_pools(out_dir: Path, dtr: DTRConfig) -> tuple[dict[str, list[Response]], list[str]]:
    """Every question's responses in sampling order (pool index 0, 1, …), as ``replay`` needs them.

    A question with a failed or missing response is left out (its order has a hole) and listed.
    """
    manifest = read_manifest(out_dir)
    n_layers = int(manifest["n_layers"])
    records: dict[str, dict[int, tuple[str, dict[str, Any]]]] = {q: {} for q in manifest["questions"]}
    for where, record in read_responses(out_dir):
        records.setdefault(str(record["question_id"]), {})[int(record["sample"])] = (where, record)
    pools, holes = {}, []
    for q, by_index in records.items():
        ok = all(by_index.get(i, ("", {}))[1].get("status") == "ok" for i in range(len(by_index)))
        if not by_index or not ok:
            holes.append(q)
            continue
        pools[q] = [_response(*by_index[i], n_layers, dtr) for i in range(len(by_index))]
    return pools, holes


def _response(where: str, record: dict[str, Any], n_layers: int, dtr: DTRConfig) -> Response:
    try:
        return response_from_record(record, n_layers, dtr)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise damaged(where, exc) from None


def budget_sweep(
    store: Path,
    online: OnlineConfig,
    dtr: DTRConfig,
    trials: int,
    seed: int = 0,
    consensus: Sequence[float] = (0.6, 0.8, 1.0),
) -> list[dict[str, Any]]:
    """Accuracy vs tokens on one pool (Figure 5 style): Cons@n and offline Think@n at every even n (trials =
    draws of n), online Think@n and online DeepConf at every even max_n above the warm-up and each β (trials =
    sampling orders; order 0 as stored)."""
    pools, _ = ordered_pools(store, dtr)
    size = min(len(p) for p in pools.values())
    budgets = [n for n in range(2, size + 1, 2)]
    rows: list[dict[str, Any]] = []
    for n in budgets:
        voting = VotingConfig(
            n=n,
            eta=online.keep,
            rank_prefix=online.decision_prefix,
            trials=trials,
            seed=seed,
            deepconf_window=online.window,
        )
        check_trials(voting, len(pools), ["cons@n", "think@n"])
        for s in run_trials(pools, voting, ["cons@n", "think@n"]):
            rows.append(
                {
                    "method": s.method,
                    "family": s.method,
                    "budget": n,
                    "consensus": None,
                    "accuracy_mean": s.accuracy_mean,
                    "accuracy_std": s.accuracy_std,
                    "cost_mean": s.cost_mean,
                    "cost_std": s.cost_std,
                    "started_mean": float(n),
                }
            )
    for signal in SIGNALS:
        for beta in consensus:
            for max_n in (n for n in budgets if n > online.warmup):
                cfg = dataclasses.replace(online, signal=signal, consensus=beta, max_n=max_n)
                replayed = replay_trials(pools, cfg, trials, seed)
                family = SIGNALS[signal].family
                rows.append(
                    {
                        "method": f"{family} β={beta:g}",
                        "family": family,
                        "budget": max_n,
                        "consensus": beta,
                        "accuracy_mean": replayed.accuracy_mean,
                        "accuracy_std": replayed.accuracy_std,
                        "cost_mean": replayed.cost_mean,
                        "cost_std": replayed.cost_std,
                        "started_mean": replayed.started_mean,
                    }
                )
    return rows
