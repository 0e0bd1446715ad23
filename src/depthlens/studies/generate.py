"""Sample a pool of responses per question into a resumable sample store (``depthlens generate``).

Responses are generated a batch at a time per question; batch b of question q always holds the same pool
indices and seeds, and a resumed run regenerates an unfinished batch whole, so the store — hence every
summary — is the same as an uninterrupted run's. A resumed run may change ``--batch-size`` (after running out
of memory) and add questions: every response keeps its own seed, so it samples the same tokens, but batched
matrix products round differently by batch shape, so stored floats may differ in the last kept digit from a
run with the first batch size (measured on CPU: tokens identical, log-probabilities within 1e-5).

The store's files and schema are ``stores.samples``'s; this module fills it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from depthlens.config import (
    EngineConfig,
    GenerateRun,
    StoreFormat,
)
from depthlens.errors import DepthlensError, InputError, StoreError, named
from depthlens.evals.tasks import Question
from depthlens.metrics.layer_quantities import LayerStat, stat_widths, stats_need_hf
from depthlens.models.load import LoadedModel
from depthlens.models.precision import precision_of
from depthlens.sampling.backend import GenerationBackend
from depthlens.sampling.choose import make_backend
from depthlens.stores.files import read_json
from depthlens.stores.formats import open_results
from depthlens.stores.jsonl import ResultWriter
from depthlens.stores.lock import store_lock
from depthlens.stores.sample_writes import (
    RESUME_RULES,
    remove_other_format,
    samples_entry,
    samples_format,
    store_manifest,
    vocab_entry,
    write_questions,
)
from depthlens.stores.samples import samples_manifest, samples_path
from depthlens.stores.shard_writer import ShardWriter
from depthlens.stores.state import remove_derived
from depthlens.studies.footprint import refuse_unfit
from depthlens.studies.layer_settings import readout_quantities
from depthlens.studies.sample_records import failed_record, sample_record
from depthlens.studies.score_inputs import as_token_ids


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


def engine_job(
    lm: LoadedModel,
    questions: Sequence[Question],
    max_new_tokens: int,
    requests: int,
    prompt_style: str = "paper",
) -> Any:
    """What a vLLM engine must hold at once for these questions (its KV cache is sized from it): ``requests``
    responses of the longest prompt + ``max_new_tokens`` (a ``sampling.vllm.engine.JobSize``)."""
    from depthlens.sampling.vllm.engine import JobSize  # imports no vllm

    longest = max((len(prompt_ids(lm, q, prompt_style)) for q in questions), default=0)
    return JobSize(requests, longest + max_new_tokens)


def run_manifest(
    model: str,
    n_layers: int | None,
    questions: Sequence[Question],
    run: GenerateRun,
    fmt: StoreFormat,
    layer_stats: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The manifest ``run`` writes (``n_layers`` None: before the model is loaded, for the early resume check);
    ``layer_stats``: the caller's statistics its records hold, name → m (a resumed run must bring the same)."""
    settings = {
        "task": run.task.to_dict() if run.task else {},
        "pool": run.pool,
        "seed": run.seed,
        "batch_size": run.batch_size,
        **samples_entry(fmt, run.store.float16),
        "sampling": run.sampling,
        "readout": run.readout,
        "dtr": run.dtr,
        "engine": run.engine,
        "answers": run.answers,
        "layer_stats": dict(layer_stats or {}),
    }
    manifest = store_manifest(model, n_layers, questions, settings)
    return {**manifest, "command": run.command} if run.command else manifest  # a Python call's own record


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
    first_error: str = ""  # why the first failed response failed

    def count(self, record: dict[str, Any]) -> None:
        """Count one response written to the store (a failed one, or one with its grade and answer source)."""
        if record.get("status") == "failed":
            self.failed += 1
            self.first_error = self.first_error or str(record.get("error", ""))
            return
        self.written += 1
        self.tokens += record["token_count"]
        self.grades[record["grade"]] += 1
        self.sources[record["answer_source"]] += 1
        self.truncated += record["finish"] == "length"


@dataclasses.dataclass(frozen=True)
class GenerationEvents:
    """Progress callbacks of a generation run: the total and already-done responses once the store is open, each
    finished batch's response count, each step's generated tokens."""

    on_start: Callable[[int, int], None] = lambda total, done: None
    on_batch: Callable[[int], None] = lambda n: None
    on_token: Callable[[int], None] = lambda n: None


def generate(
    lm: LoadedModel,
    run: GenerateRun,
    questions: Sequence[Question],
    backend: GenerationBackend | None = None,
    events: GenerationEvents = GenerationEvents(),
    layer_stats: Mapping[str, LayerStat] | None = None,
) -> GenerationReport:
    """Sample ``run.pool`` responses per question into the store ``run.store``; resumable.

    ``backend``: one already built for these settings (e.g. sharing a started vLLM engine), else one is built from
    ``run.engine`` once there is something to sample. ``layer_stats``: a caller's statistics of each layer's
    log-probabilities (hf), kept per read-out token as ``layer_stat_<name>``; tried, with the tracked ids, before
    the store is touched, and stamped in its manifest.
    """
    out_dir, spec = run.store.out, run.store
    fmt = samples_format(out_dir, spec.format, spec.resume, spec.overwrite)
    stats_need_hf(layer_stats, run.engine.backend)
    quantities = readout_quantities(lm, run.readout, layer_stats)  # before the store is touched
    widths = stat_widths(quantities.stats) if quantities else {}
    manifest = {
        **run_manifest(lm.name, lm.n_layers, questions, run, fmt, widths),
        **vocab_entry(lm),
        "precision": precision_of(lm, run.engine),
    }
    _refuse_pre_rules_resume(out_dir, spec.resume)
    refuse_unfit(lm, run, questions)  # the context and the machine's memory, before anything is sampled
    with store_lock(samples_path(out_dir, fmt)):
        if spec.overwrite:
            remove_other_format(out_dir, fmt)
            remove_derived(out_dir)  # the summaries of the run this one replaces
        return _generate_into(lm, run, questions, fmt, manifest, backend, events, layer_stats)


def refuse_too_long(
    lm: Any,
    questions: Sequence[Question],
    prompt_style: str,
    max_new_tokens: int = 0,
    engine_len: int | None = None,
) -> int:
    """Refuse, before anything is sampled, a run with a question none of whose responses could be sampled: the
    longest prompt leaves no room in the model's context, or it and ``max_new_tokens`` do not fit there (every
    sampler refuses a prompt + budget longer than the context, so each of its responses would be stored as failed).
    Returns the longest prompt's length (0 without a tokenizer or questions).

    ``lm``: a loaded model, or a ``models.info.ModelInfo`` — tokenizer and config, no weights — so the CLI checks
    before the weights load; ``engine_len``: the vLLM engine's ``--max-model-len`` where given (a tighter limit).
    """
    limit, what = lm.max_positions, f"{lm.name}'s context"
    if engine_len is not None and (limit is None or engine_len < limit):
        limit, what = engine_len, "the engine's --max-model-len"
    if lm.tokenizer is None or not questions:
        return 0
    longest, question = max(
        ((len(prompt_ids(lm, q, prompt_style)), q) for q in questions), key=lambda x: x[0]
    )
    if limit is None:
        return longest
    if longest >= limit:
        raise InputError(
            f"question {question.id!r}: its prompt is {longest} tokens, {what} is {limit}; no "
            "response fits — shorten or leave out that question, or use a longer-context model"
        )
    if longest + max_new_tokens > limit:
        raise InputError(
            setting="max_new_tokens",
            value=max_new_tokens,
            requirement=f"the prompt of question {question.id!r} is {longest} tokens, and {longest} + "
            f"{max_new_tokens} exceed {what} of {limit}, so none of its responses could be sampled; use "
            f"{named('max_new_tokens', limit - longest)} or less",
        )
    return longest


def engine_len(engine: EngineConfig) -> int | None:
    """The vLLM engine's ``--max-model-len`` where one is given (the hf sampler has no such limit)."""
    return engine.max_model_len if engine.backend == "vllm" else None


def _generate_into(
    lm: LoadedModel,
    run: GenerateRun,
    questions: Sequence[Question],
    fmt: StoreFormat,
    manifest: dict[str, Any],
    backend: GenerationBackend | None,
    events: GenerationEvents,
    layer_stats: Mapping[str, LayerStat] | None = None,
) -> GenerationReport:
    out_dir, spec = run.store.out, run.store
    report = GenerationReport()
    with open_results(
        samples_path(out_dir, fmt),
        manifest,
        resume=spec.resume,
        overwrite=spec.overwrite,
        rules=RESUME_RULES,
        fmt=fmt,
        timed=False,
    ) as writer:  # a shard per batch
        report.changed = writer.changed
        write_questions(out_dir, questions)
        total = len(questions) * run.pool
        report.skipped = sum(1 for q in questions for i in range(run.pool) if f"{q.id}#{i}" in writer.done)
        events.on_start(total, report.skipped)
        if report.skipped == total:  # nothing to sample: start no engine
            return report
        if backend is None:
            job = engine_job(
                lm, questions, run.sampling.max_new_tokens, run.batch_size, run.answers.prompt_style
            )
            backend = make_backend(
                lm, run.engine, run.sampling, run.readout, events.on_token, job, layer_stats=layer_stats
            )
        generator = backend
        try:
            for question in questions:
                generate_question(QuestionJob(lm, generator, writer, question, run), report, events.on_batch)
        except DepthlensError as exc:
            if isinstance(exc, StoreError) or "--resume" in str(exc):  # it already says how to go on
                raise
            raise type(exc)(
                f"{exc} — responses finished so far are kept in {out_dir}; rerun with {named('resume')}"
            ) from exc
    return report


def _refuse_pre_rules_resume(out_dir: Path, resume: bool) -> None:
    previous = samples_manifest(out_dir)
    if (
        resume
        and previous.is_file()
        and "answers" not in read_json(previous, "manifest", "regenerate the store")
    ):
        raise StoreError(
            f"cannot resume {out_dir}: it was written before the answer rules, so its answers and new ones would "
            f"be read differently; run `depthlens regrade {out_dir}` first, then {named('resume')}"
        )


@dataclasses.dataclass(frozen=True)
class QuestionJob:
    """One question's pool to sample: the model (tokenizer, depth), the engine, where records go, the run."""

    lm: LoadedModel
    generator: GenerationBackend
    writer: ResultWriter | ShardWriter | Any  # anything with ``done``, ``write`` and ``flush``
    question: Question
    run: GenerateRun


def generate_question(job: QuestionJob, report: GenerationReport, on_batch: Callable[[int], None]) -> None:
    """Sample the responses of ``job.question`` the writer does not have yet, a batch at a time (same batches and
    seeds whatever is missing), each batch written and flushed whole."""
    lm, run, question, writer = job.lm, job.run, job.question, job.writer
    prompt: list[int] | None = None
    for first in range(0, run.pool, run.batch_size):
        indices = list(range(first, min(first + run.batch_size, run.pool)))
        missing = [i for i in indices if f"{question.id}#{i}" not in writer.done]
        if not missing:
            continue
        seeds = [
            sample_seed(run.seed, question.id, i) for i in indices
        ]  # the whole batch: same layout as before
        try:
            prompt = prompt if prompt is not None else prompt_ids(lm, question, run.answers.prompt_style)
            traces = job.generator.start(prompt, seeds).traces
        except (InputError, RuntimeError) as exc:  # too long for the context, out of memory, ...
            for i in missing:
                record = failed_record(question, i, seeds[i - first], f"{type(exc).__name__}: {exc}")
                writer.write(record)
                report.count(record)
            writer.flush()
            on_batch(len(missing))
            continue
        for i in missing:
            record = sample_record(
                lm, question, i, traces[i - first], run.dtr, run.answers, prompt=prompt or ()
            )
            writer.write(record)
            report.count(record)
        writer.flush()  # a batch is kept whole: one Parquet shard, or its JSONL lines
        on_batch(len(missing))
