"""Running a generation from the command line, shared by ``depthlens generate``, ``thinkn --out`` and ``thinkn
--online``: the run comes built (``studies.runs``: its settings and task checked, its questions read, its warnings
said here), then what else needs no model is checked (the store, the model's name, whether any response fits the
context), the pool is sampled here or on Ray actors, with a progress display, and what was written is said."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthlens.cli.app import err_console, load_for, read_info, warn, writes_to
from depthlens.cli.flags import flag_line
from depthlens.cli.progress import make_progress
from depthlens.config import (
    AnswerConfig,
    EngineConfig,
    GenerateRun,
    ModelSpec,
    OnlineRun,
    RayConfig,
    ReadoutConfig,
    SamplingConfig,
    StoreSpec,
)
from depthlens.errors import DepthlensWarning, InputError

if TYPE_CHECKING:
    from depthlens.config import StoreFormat
    from depthlens.evals.tasks import Question
    from depthlens.studies.generate import GenerationReport
    from depthlens.studies.runs import Built


def say_warnings(warnings: tuple[DepthlensWarning, ...]) -> None:
    """A run's warnings (``studies.runs``), each as one ``warning:`` line naming its flags."""
    for w in warnings:
        warn(flag_line(w))


def run_generation(model: ModelSpec, built: Built[GenerateRun], ray: RayConfig | None) -> GenerationReport:
    """Check everything else that needs no model (``--out``, the model's name, ``--resume``), then sample here or
    on Ray actors, and say what was written."""
    from depthlens.stores.sample_writes import samples_entry, samples_format
    from depthlens.stores.samples import samples_path

    run = built.run
    out, spec = run.store.out, run.store
    fmt = samples_format(out, spec.format, spec.resume, spec.overwrite)
    samples_entry(fmt, spec.float16)  # --float16 with a JSONL store is refused here
    if ray is not None:
        from depthlens.scale.ray import import_ray

        if fmt == "jsonl":
            raise InputError(
                f"--ray writes a sharded Parquet store and {out} is a JSONL one; resume it without "
                "--ray, or leave out --store jsonl"
            )
        import_ray()  # the missing extra is named before anything else happens
    samples = samples_path(out, fmt)
    from depthlens.stores.guard import new_out
    from depthlens.stores.lock import store_lock

    # One writer from here on (a second is refused now, naming this one), and a run that fails before its first
    # record leaves no --out behind.
    with new_out(out, samples_path(out, "parquet"), samples_path(out, "jsonl")), store_lock(samples):
        return _checked_generation(model, built, ray, fmt)


def _checked_generation(
    model: ModelSpec, built: Built[GenerateRun], ray: RayConfig | None, fmt: StoreFormat
) -> GenerationReport:
    from depthlens.models.locate import locate
    from depthlens.stores.formats import check_results
    from depthlens.stores.sample_writes import RESUME_RULES
    from depthlens.stores.samples import samples_path

    run, questions = built.run, list(built.questions)
    out, spec = run.store.out, run.store
    samples = samples_path(out, fmt)
    resuming = check_results(samples, None, spec.resume, spec.overwrite, fmt=fmt)
    locate(model.name)
    if resuming:  # are the settings the stored run's?
        from depthlens.studies.generate import run_manifest  # imports torch: after the task's own errors

        manifest = run_manifest(model.name, None, questions, run, fmt)
        check_results(samples, manifest, spec.resume, spec.overwrite, RESUME_RULES, fmt)
    say_warnings(built.warnings)
    refuse_unfitting(model, run, questions, here=ray is None or ray.address is None)
    report = (
        _generate_here(model, run, questions, fmt)
        if ray is None
        else _generate_on_ray(model, run, questions, ray)
    )
    _say_generated(report, run.answers, run.store)
    refuse_nothing_usable(report, run.store.out)
    return report


def refuse_nothing_usable(report: GenerationReport, out: Path) -> None:
    """A run whose every new response failed made nothing to vote on or read: it ends with an error (exit 2),
    not exit 0. The failed records stay in the store as the record of why; ``--resume`` does not retry them."""
    if report.failed and not report.written:
        cause = f" (the first: {report.first_error})" if report.first_error else ""
        raise InputError(
            f"{out}: all {report.failed} responses this run sampled failed{cause}, so it made nothing usable; "
            "fix that, then generate again with --overwrite (--resume does not retry failed responses)"
        )


def refuse_unfitting(
    model: ModelSpec, run: GenerateRun | OnlineRun, questions: list[Question], here: bool = True
) -> None:
    """A run none of whose responses fits the model's context (the longest prompt + --max-new-tokens), that tracks
    an id past the vocabulary (its readout's ``track``), or whose responses sampled together do not fit this
    machine's memory (``here``: it samples on this machine, or a local Ray's actors do; a cluster's nodes check
    their own), is refused before the weights load: its tokenizer and config are enough (``app.read_info``). Where
    they cannot be read without loading, ``studies.generate`` refuses it once the model is loaded, still before
    anything is sampled."""
    from depthlens.studies.footprint import refuse_unfit

    info = read_info(model)
    if info is not None:
        refuse_unfit(info, run, questions, memory=here)
        if run.readout.track:
            from depthlens.studies.layer_settings import readout_quantities

            readout_quantities(info, run.readout, None)


def _generate_here(
    model: ModelSpec, run: GenerateRun, questions: list[Question], fmt: StoreFormat
) -> GenerationReport:
    """Generation in this process (the model loaded here), with a progress display."""
    from depthlens.stores.samples import samples_path
    from depthlens.studies.generate import GenerationEvents, generate

    lm = load_for(run.engine, model)
    with make_progress(err_console) as progress:
        responses = progress.add_task("responses", total=None)
        tokens = progress.add_task("tokens", total=None)

        def on_start(total: int, done: int) -> None:
            writes_to(samples_path(run.store.out, fmt))
            progress.update(responses, total=total, completed=done)

        events = GenerationEvents(
            on_start, lambda n: progress.advance(responses, n), lambda n: progress.advance(tokens, n)
        )
        return generate(lm, run, questions, events=events)


def _generate_on_ray(
    model: ModelSpec, run: GenerateRun, questions: list[Question], ray: RayConfig
) -> GenerationReport:
    """Generation on Ray actors into the sharded store out/samples/."""
    from depthlens.scale.generate import generate_on_ray
    from depthlens.stores.samples import SHARDS
    from depthlens.studies.generate import GenerationEvents

    with make_progress(err_console) as progress:
        responses = progress.add_task("responses on Ray", total=None)

        def on_start(total: int, done: int) -> None:
            writes_to(run.store.out / SHARDS)
            progress.update(responses, total=total, completed=done)

        events = GenerationEvents(on_start, lambda n: progress.advance(responses, n))
        return generate_on_ray(model, run, questions, ray, events)


def _say_generated(report: GenerationReport, answers: AnswerConfig, store: StoreSpec) -> None:
    """What a generation run wrote, on stderr."""
    for line in report.changed:
        err_console.print(f"resumed with a changed setting: {line}", highlight=False, soft_wrap=True)
    grades = ", ".join(f"{k} {v}" for k, v in sorted(report.grades.items()))
    sources = ", ".join(f"{k} {v}" for k, v in sorted(report.sources.items()))
    err_console.print(
        f"wrote {report.written} responses ({report.tokens} tokens; {grades or 'none graded'}) to {store.out}"
        + (f", {report.skipped} already there" if report.skipped else "")
        + (f", [red]{report.failed} failed[/] (kept as status 'failed')" if report.failed else "")
    )
    if report.written:
        err_console.print(
            f"answers by source: {sources}; {report.truncated} of {report.written} cut at --max-new-tokens "
            f"({answers.prompt_style} prompts, fallback {answers.fallback})"
        )
    if report.grades.get("unparsed"):
        err_console.print(
            f"{report.grades['unparsed']} answers Math-Verify could not parse were counted wrong"
        )


def resumed_manifest(store: StoreSpec) -> Path | None:
    """The manifest of the sample store a resumed run continues (whose backend ``--backend auto`` keeps)."""
    from depthlens.stores.samples import samples_manifest

    return samples_manifest(store.out) if store.resume else None


@dataclasses.dataclass(frozen=True)
class NewPool:
    """How a new pool is sampled: the model, the answer rules, sampling, the engine, the readout."""

    model: ModelSpec
    answers: AnswerConfig
    sampling: SamplingConfig
    engine: EngineConfig
    readout: ReadoutConfig

    def run_settings(self) -> dict[str, Any]:
        """What a ``GenerateRun`` and an ``OnlineRun`` built from these share (``studies.runs``' keywords): how
        each response is sampled, read out and graded, on which engine."""
        return {
            "sampling": self.sampling,
            "readout": self.readout,
            "answers": self.answers,
            "engine": self.engine,
        }
