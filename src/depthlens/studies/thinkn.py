"""Think@n end to end: sample a pool of responses per question into a resumable store, then vote (definitions.md §5).

Store (a directory):
- ``questions.jsonl`` — the questions, reference answers and choices, as generated;
- ``samples.jsonl`` — one line per response, appended and fsynced when its batch completes (a kill loses at
  most the batch in flight), see ``sample_record``; ``samples.jsonl.manifest.json`` — model, task, seeds,
  sampling and readout settings, store version;
- ``thinkn-n<n>-eta<η>-l<ℓ>.json`` / ``.csv`` (and ``-ablation.csv``) — one summary per voting setting (see
  ``summary_stem``); a summary of other settings under the same name is replaced only with ``overwrite``.

Responses are generated a batch at a time per question; batch b of question q always holds the same pool
indices and seeds, and a resumed run regenerates an unfinished batch whole, so the store — hence every
summary — is the same as an uninterrupted run's. A resumed run may change ``--batch-size`` (after running out
of memory) and add questions: every response keeps its own seed, so it samples the same tokens, but batched
matrix products round differently by batch shape, so stored floats may differ in the last kept digit from a
run with the first batch size (measured on CPU: tokens identical, log-probabilities within 1e-5).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from depthlens import __version__
from depthlens.config import (
    AnswerConfig,
    DTRConfig,
    EngineConfig,
    ReadoutConfig,
    SamplingConfig,
    VotingConfig,
)
from depthlens.errors import DepthlensError, InputError, StoreError
from depthlens.metrics.dtr import deep_flags, deep_thinking_ratio, settling_depth
from depthlens.models.load import LoadedModel
from depthlens.sampling.generate import GenerationBackend, Trace, make_backend
from depthlens.studies.parquet_store import MANIFEST, ShardWriter, iter_store
from depthlens.studies.records import (
    SAMPLES,
    ResultWriter,
    manifest_path,
    read_json,
    settings_differ,
    write_json,
)
from depthlens.studies.score import as_token_ids
from depthlens.studies.store_answers import ANSWER_FIELDS, RULES, AnswerSummary, answer_fields
from depthlens.studies.stores import FORMATS, StoreFormat, open_results, store_entry
from depthlens.studies.tables import write_csv
from depthlens.studies.tasks import Question
from depthlens.voting.methods import Response, think_at_n
from depthlens.voting.paired import Comparison, accuracy_intervals, compare_methods, per_question_table
from depthlens.voting.trials import MethodSummary, ablation, trial_outcomes

STORE_VERSION = 1
QUESTIONS = "questions.jsonl"
SHARDS = "samples"  # the responses of a sharded store (the default): a Parquet store directory
PER_TOKEN = ("log_prob", "entropy", "self_certainty", "confidence")
REQUIRED = (
    "id",
    "question_id",
    "sample",
    "status",
    "n_tokens",
    "vote_key",
    "correct",
    *PER_TOKEN,
    "divergence",
)


def sample_seed(seed: int, question_id: str, index: int) -> int:
    """A response's own seed: stable across runs, batch sizes, pool sizes and Python versions."""
    digest = hashlib.sha256(f"{seed}:{question_id}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def prompt_ids(lm: LoadedModel, question: Question, prompt_style: str = "paper") -> list[int]:
    """The question as the model is prompted: its chat template when it has one, else the plain messages."""
    tok = lm.tokenizer
    if tok is None:
        raise InputError(f"model {lm.name} has no tokenizer; generation needs one")
    messages = question.messages(prompt_style)
    if getattr(tok, "chat_template", None):
        return as_token_ids(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    plain = "\n\n".join(m["content"] for m in messages)
    return as_token_ids(tok(plain + "\n\n", add_special_tokens=True)["input_ids"])


def _rounded(values: Sequence[float], digits: int = 5) -> list[float]:
    return [round(v, digits) for v in values]


def deep_from_divergence(
    divergence: Sequence[Sequence[float]], n_layers: int, dtr: DTRConfig
) -> torch.Tensor:
    """Deep-thinking flags [R] of R read-out tokens from their stored [R][L] divergence rows (R may be 0)."""
    table = torch.tensor(divergence, dtype=torch.float32).reshape(-1, n_layers)
    return deep_flags(settling_depth(table, dtr.g), n_layers, dtr.rho, dtr.deep_rule)


def sample_record(
    lm: LoadedModel,
    question: Question,
    index: int,
    trace: Trace,
    dtr: DTRConfig,
    rules: AnswerConfig = AnswerConfig(),
    timeout_s: int = 5,
    prompt: Sequence[int] = (),
) -> dict[str, Any]:
    """One stored response: tokens, text, graded answer, and the per-token values voting and studies need.

    ``prompt_ids`` (the prompt as fed) and ``token_ids`` make the line a ``depthlens score`` input by itself.

    Per-token floats are rounded to 5 decimals (divergences too: ~9 bytes each, L per read-out token).
    """
    text = lm.tokenizer.decode(trace.token_ids, skip_special_tokens=True) if lm.tokenizer else ""
    deep = deep_from_divergence(trace.divergence, lm.n_layers, dtr)
    return {
        "id": f"{question.id}#{index}",
        "question_id": question.id,
        "sample": index,
        "seed": trace.seed,
        "status": "ok",
        "finish": trace.finish,
        "n_tokens": len(trace),
        "text": text,
        "prompt_ids": list(prompt),
        "token_ids": trace.token_ids,
        **answer_fields(question, text, trace.finish, rules, timeout_s),
        "dtr_readout": deep_thinking_ratio(deep),
        **{key: _rounded(getattr(trace, key)) for key in PER_TOKEN},
        "divergence": [_rounded(row) for row in trace.divergence],
        **{f"divergence_{kind}": [_rounded(row) for row in rows] for kind, rows in trace.also.items()},
    }


def failed_record(question: Question, index: int, seed: int, error: str) -> dict[str, Any]:
    """A response whose generation failed: kept in the store (and reported), never silently dropped."""
    return {
        "id": f"{question.id}#{index}",
        "question_id": question.id,
        "sample": index,
        "seed": seed,
        "status": "failed",
        "error": error,
    }


MANIFEST_DEFAULTS = {
    "sampling": SamplingConfig().to_dict(),
    "readout": ReadoutConfig().to_dict(),
    "dtr": DTRConfig().to_dict(),
    "engine": EngineConfig().to_dict(),  # stores written before the engine was recorded: hf
}
"""Settings a manifest written before a field existed is read with (see ``records.check_output``)."""
# Batch size and a longer question list change no stored response (a response's seed is its own; see the module
# docstring for the last-digit caveat of a changed batch size), so a resumed run may change them.
# The KV cache's size changes no token either, and a run resumed after running out of it must be able to raise it.
RESUME_FREE = ("batch_size", "task.questions", "engine.kv_cache_gib", "engine.gpu_memory_utilization")
RESUME_EXTEND = ("questions",)


def store_manifest(
    model: str,
    n_layers: int | None,
    questions: Sequence[Question],
    pool: int,
    seed: int,
    batch_size: int,
    sampling: SamplingConfig,
    readout: ReadoutConfig,
    dtr: DTRConfig,
    task: dict[str, Any],
    answers: AnswerConfig | None = None,
    engine: EngineConfig = EngineConfig(),
    **extra: Any,
) -> dict[str, Any]:
    """The manifest of a store; ``n_layers`` None (the model not loaded yet) and ``answers`` None leave those
    entries out (a check before loading compares only the entries it is given). ``engine``: the generation
    backend and its settings (the responses' tokens depend on it, so a resumed run must use the same)."""
    manifest = {
        "store_version": STORE_VERSION,
        "depthlens_version": __version__,
        "model": model,
        "n_layers": n_layers,
        "task": task,
        "questions": [q.id for q in questions],
        "pool": pool,
        "seed": seed,
        "batch_size": batch_size,
        **extra,
        "sampling": sampling.to_dict(),
        "readout": readout.to_dict(),
        "dtr": dtr.to_dict(),
        "engine": engine.to_dict(),
        "answers": {**answers.to_dict(), "rules": RULES} if answers is not None else None,
        "command": " ".join(sys.argv),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    return {k: v for k, v in manifest.items() if v is not None or k not in ("n_layers", "answers")}


@dataclasses.dataclass
class GenerationReport:
    written: int = 0
    skipped: int = 0  # already in the store (resume)
    failed: int = 0
    grades: Counter[str] = dataclasses.field(default_factory=Counter)
    sources: Counter[str] = dataclasses.field(default_factory=Counter)
    truncated: int = 0  # responses cut at --max-new-tokens
    tokens: int = 0
    changed: list[str] = dataclasses.field(default_factory=list)  # settings a resumed run changed

    def count(self, record: dict[str, Any]) -> None:
        """Count one response written to the store (a failed one, or one with its grade and answer source)."""
        if record.get("status") == "failed":
            self.failed += 1
            return
        self.written += 1
        self.tokens += record["n_tokens"]
        self.grades[record["grade"]] += 1
        self.sources[record["answer_source"]] += 1
        self.truncated += record["finish"] == "length"


def write_questions(out_dir: Path, questions: Sequence[Question]) -> None:
    (out_dir / QUESTIONS).write_text(
        "".join(json.dumps(q.to_dict(), ensure_ascii=False) + "\n" for q in questions), encoding="utf-8"
    )


def generate_store(
    lm: LoadedModel,
    out_dir: Path,
    questions: Sequence[Question],
    *,
    pool: int,
    seed: int = 0,
    sampling: SamplingConfig = SamplingConfig(),
    readout: ReadoutConfig = ReadoutConfig(),
    dtr: DTRConfig = DTRConfig(),
    batch_size: int = 16,
    resume: bool = False,
    overwrite: bool = False,
    task: dict[str, Any] | None = None,
    answers: AnswerConfig = AnswerConfig(),
    engine: EngineConfig = EngineConfig(),
    backend: GenerationBackend | None = None,
    store: StoreFormat | None = None,
    float16: bool = False,
    on_start: Callable[[int, int], None] = lambda total, done: None,
    on_batch: Callable[[int], None] = lambda n: None,
    on_token: Callable[[int], None] = lambda n: None,
) -> GenerationReport:
    """Sample ``pool`` responses per question into the store at ``out_dir``; resumable.

    ``engine`` picks the generation backend (recorded in the manifest); ``backend`` is one already built for
    these settings (e.g. sharing a started vLLM engine), else it is built from ``engine`` once there is
    something to sample. ``store``: the responses' format (``samples_format``: a new store is Parquet unless
    asked for as JSONL; a resumed one keeps its own), ``float16`` the width of a Parquet store's floats.
    """
    if pool < 1:
        raise InputError(f"--pool = {pool}; sample at least 1 response per question")
    if batch_size < 1:
        raise InputError(f"--batch-size = {batch_size}; use 1 or more")
    fmt = samples_format(out_dir, store, resume, overwrite)
    manifest = store_manifest(lm.name, lm.n_layers, questions, pool, seed, batch_size, sampling, readout, dtr,
                              task or {}, answers, engine, **samples_entry(fmt, float16))  # fmt: skip
    previous = samples_manifest(out_dir)
    if (
        resume
        and previous.is_file()
        and "answers" not in read_json(previous, "manifest", "regenerate the store")
    ):
        raise StoreError(
            f"cannot resume {out_dir}: it was written before the answer rules, so its answers and new ones would "
            f"be read differently; run `depthlens regrade {out_dir}` first, then --resume"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:
        remove_other_format(out_dir, fmt)
    report = GenerationReport()
    with open_results(
        samples_path(out_dir, fmt), manifest, resume=resume, overwrite=overwrite, defaults=MANIFEST_DEFAULTS,
        free=RESUME_FREE, extend=RESUME_EXTEND, fmt=fmt, timed=False,  # a shard per batch
    ) as writer:  # fmt: skip
        report.changed = writer.changed
        write_questions(out_dir, questions)
        total = len(questions) * pool
        done = sum(1 for q in questions for i in range(pool) if f"{q.id}#{i}" in writer.done)
        report.skipped = done
        on_start(total, done)
        if done == total:  # nothing to sample: start no engine
            return report
        generator = backend or make_backend(lm, engine, sampling, readout, on_token)
        try:
            for question in questions:
                _generate_question(
                    lm, generator, writer, question, pool, seed, dtr, answers, batch_size, report, on_batch
                )
        except DepthlensError as exc:
            if isinstance(exc, StoreError):  # the store's own error already says how to go on
                raise
            raise type(exc)(
                f"{exc} — responses finished so far are kept in {out_dir}; rerun with --resume"
            ) from exc
    return report


def _generate_question(
    lm: LoadedModel,
    generator: GenerationBackend,
    writer: ResultWriter | ShardWriter,
    question: Question,
    pool: int,
    seed: int,
    dtr: DTRConfig,
    answers: AnswerConfig,
    batch_size: int,
    report: GenerationReport,
    on_batch: Callable[[int], None],
) -> None:
    prompt: list[int] | None = None
    for first in range(0, pool, batch_size):
        indices = list(range(first, min(first + batch_size, pool)))
        missing = [i for i in indices if f"{question.id}#{i}" not in writer.done]
        if not missing:
            continue
        seeds = [sample_seed(seed, question.id, i) for i in indices]  # the whole batch: same layout as before
        try:
            prompt = prompt if prompt is not None else prompt_ids(lm, question, answers.prompt_style)
            traces = generator.start(prompt, seeds).traces
        except (InputError, RuntimeError) as exc:  # too long for the context, out of memory, ...
            for i in missing:
                writer.write(failed_record(question, i, seeds[i - first], f"{type(exc).__name__}: {exc}"))
            writer.flush()
            report.failed += len(missing)
            on_batch(len(missing))
            continue
        for i in missing:
            record = sample_record(lm, question, i, traces[i - first], dtr, answers, prompt=prompt or ())
            writer.write(record)
            report.count(record)
        writer.flush()  # a batch is kept whole: one Parquet shard, or its JSONL lines
        on_batch(len(missing))


@dataclasses.dataclass(frozen=True)
class StoreInfo:
    manifest: dict[str, Any]
    questions: int
    responses: int
    failed: list[str]  # ids of failed responses
    excluded: list[str]  # questions left out of voting (fewer usable responses than n)
    grades: dict[str, int]
    answers: AnswerSummary


def samples_path(out_dir: Path, fmt: StoreFormat) -> Path:
    """Where a store's responses are: ``samples/`` (a sharded Parquet store) or ``samples.jsonl``."""
    return out_dir / (SHARDS if fmt == "parquet" else SAMPLES)


def samples_format(
    out_dir: Path, requested: StoreFormat | None, resume: bool = False, overwrite: bool = False
) -> StoreFormat:
    """The format a run writes the responses of ``out_dir`` in: the existing store's when resumed (``requested``
    must agree) or neither resumed nor overwritten, else ``requested`` (default Parquet). Needs no model:
    commands check it before loading one."""
    if requested is not None and requested not in FORMATS:
        raise InputError(f"--store {requested!r}: use one of {', '.join(FORMATS)}")
    found = [f for f in FORMATS if samples_path(out_dir, f).exists()]  # type: ignore[arg-type]
    if len(found) > 1:
        raise StoreError(
            f"{out_dir} holds both {SHARDS}/ and {SAMPLES}; keep one (move the other away), then rerun"
        )
    existing: StoreFormat | None = found[0] if found else None  # type: ignore[assignment]
    if existing is not None and not resume and not overwrite:
        return existing  # whose check then says it exists: --resume or --overwrite
    if resume and existing is not None:
        if requested is not None and requested != existing:
            raise StoreError(
                f"--store {requested}: the store in {out_dir} is {existing}; resume it without --store, or give "
                "a new --out"
            )
        return existing
    return requested or "parquet"


def remove_other_format(out_dir: Path, fmt: StoreFormat) -> None:
    """``--overwrite`` with a store of the other format in ``out_dir``: remove it, so one store remains."""
    for other in FORMATS:
        old = samples_path(out_dir, other)  # type: ignore[arg-type]
        if other == fmt or not old.exists():
            continue
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
            manifest_path(old).unlink(missing_ok=True)


def samples_entry(fmt: StoreFormat, float16: bool) -> dict[str, Any]:
    """The manifest entries of the responses' format: ``store`` for a Parquet store, nothing for JSONL."""
    entry = store_entry(fmt, float16, jsonl_fix="leave out --store jsonl")
    return {} if entry is None else {"store": entry}


def stored_format(out_dir: Path) -> StoreFormat:
    """The format of the responses in ``out_dir``: Parquet where ``samples/`` has its manifest and no
    ``samples.jsonl`` is beside it, else JSONL (also where there is no store yet)."""
    sharded = (out_dir / SHARDS / MANIFEST).is_file() and not (out_dir / SAMPLES).exists()
    return "parquet" if sharded else "jsonl"


def samples_manifest(out_dir: Path) -> Path:
    """The manifest of a store's responses: beside ``samples.jsonl``, or inside the sharded ``samples/``."""
    if stored_format(out_dir) == "parquet":
        return out_dir / SHARDS / MANIFEST
    return manifest_path(out_dir / SAMPLES)


def iter_samples(out_dir: Path) -> Iterator[dict[str, Any]]:
    """A store's response records, from ``samples.jsonl`` or from every shard of ``samples/`` read as one."""
    yield from iter_store(samples_path(out_dir, stored_format(out_dir)))


def read_manifest(out_dir: Path) -> dict[str, Any]:
    samples, meta = samples_path(out_dir, stored_format(out_dir)), samples_manifest(out_dir)
    if not samples.exists() or not meta.is_file():
        raise StoreError(
            f"{out_dir} is not a depthlens sample store (no {SAMPLES} with its manifest); "
            "create one with `depthlens generate`"
        )
    manifest = read_json(meta, "store's manifest", "regenerate the store (`depthlens generate --overwrite`)")
    version = manifest.get("store_version")
    if version != STORE_VERSION:
        raise StoreError(
            f"{out_dir} is a version-{version} store; this depthlens ({__version__}) reads "
            f"version {STORE_VERSION} — regenerate it, or use the depthlens that wrote it"
        )
    kinds = {"n_layers": int, "questions": list, "pool": int, "dtr": dict, "model": str}
    wrong = [k for k, kind in kinds.items() if not isinstance(manifest.get(k), kind)]
    if "questions" not in wrong and not all(isinstance(q, str) for q in manifest["questions"]):
        wrong.append("questions")  # question ids key the pools: strings only
    readout = manifest.get("readout", {})
    if (
        not isinstance(readout, dict)
        or not isinstance(readout.get("divergence", ""), str)
        or not (
            isinstance(readout.get("also", []), list)
            and all(isinstance(k, str) for k in readout.get("also", []))
        )
    ):
        wrong.append("readout")
    if wrong:
        raise StoreError(
            f"{meta}: field(s) {wrong} missing or of the wrong type; the manifest was edited or damaged — "
            "regenerate the store"
        )
    return manifest


def damaged_record(path: Path, line: int, exc: Exception) -> StoreError:
    """A store line whose fields do not have the types `depthlens generate` writes."""
    return StoreError(
        f"{path}:{line}: a field has the wrong type or shape ({type(exc).__name__}: {exc}); the store is damaged "
        "or was not written by `depthlens generate`"
    )


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
    for line, record in enumerate(iter_samples(out_dir), start=1):
        if record.get("status") == "failed":
            failed.append(str(record.get("id")))
            continue
        missing = [k for k in REQUIRED if k not in record]
        if missing:
            raise StoreError(
                f"{out_dir / SAMPLES}:{line}: missing field(s) {missing}; the store is damaged or "
                "was not written by `depthlens generate`"
            )
        try:
            response = response_from_record(record, n_layers, dtr)
        except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
            raise damaged_record(out_dir / SAMPLES, line, exc) from None
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
    if path.exists() and not overwrite:
        earlier = read_json(path, "summary", "delete it or pass --overwrite")
        differ = settings_differ({k: earlier.get(k) for k in settings}, settings, ())
        if differ:
            raise StoreError(
                f"{path} holds a summary voted with other settings ({'; '.join(differ)}); pass --overwrite "
                "to replace it, or keep it and vote into another store copy"
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
