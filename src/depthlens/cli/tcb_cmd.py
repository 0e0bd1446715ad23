"""``depthlens tcb …``: the Token Constraint Bound paper's four studies, each a table and a figure."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from depthlens.cli import groups, specs
from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console, load_model, writes_to
from depthlens.config import EngineConfig, TCBConfig, TCBStudies

tcb_app = typer.Typer(
    help="Token Constraint Bound studies: regimes, geometry, prompts, trace (docs/definitions.md §6).",
    no_args_is_help=True,
)
app.add_typer(tcb_app, name="tcb", short_help="The Token Constraint Bound paper's four studies.")


@contextlib.contextmanager
def _units(
    out: Path,
    name: str,
    lm: Any,
    settings: dict[str, Any],
    resume: bool,
    overwrite: bool,
    engine: EngineConfig | None = None,
) -> Iterator[tuple[dict[str, Any], Callable[[str, Any], None]]]:
    """The study's finished units (from ``<out>/<name>.progress.jsonl`` on --resume) and the callback that
    appends each new one there as it finishes (fsynced: a kill loses at most the unit in flight); ``lm`` the loaded
    model (its name and precision — on ``engine`` where a vLLM one runs the study — go into the manifest)."""
    from depthlens.models.precision import precision_of
    from depthlens.stores.jsonl import ResultWriter, iter_jsonl

    path = _progress(out, name)
    manifest = {
        "study": name,
        "model": lm.name,
        "precision": precision_of(lm, engine),
        "settings": settings,
        "command": " ".join(sys.argv),
    }
    with ResultWriter(path, manifest, resume=resume, overwrite=overwrite) as writer:
        writes_to(path)
        done = {str(r["id"]): r["rows"] for r in iter_jsonl(path) if "rows" in r} if writer.done else {}
        yield done, lambda key, rows: writer.write({"id": key, "rows": rows})


def _progress(out: Path, name: str) -> Path:
    return out / f"{name}.progress.jsonl"


def _progress_manifest(out: Path, name: str) -> Path:
    from depthlens.stores.files import manifest_path

    return manifest_path(_progress(out, name))


def _engine_setting(engine: EngineConfig) -> dict[str, Any]:
    """The engine as a resumed study must match it; absent for ``hf`` (progress files from before backends)."""
    return {"engine": engine.to_dict()} if engine.backend != "hf" else {}


def _finish(out: Path, name: str, result: dict[str, Any], figure: Path) -> None:
    from depthlens.studies.tables import write_study

    paths = write_study(out, name, result, " ".join(sys.argv))
    summary = result["summary"]
    rows = summary if isinstance(summary, list) else [{k: v for k, v in summary.items() if k != "text"}]
    table = Table(title=name, title_justify="left")
    for key in rows[0]:
        table.add_column(key, justify="right")
    for row in rows:
        table.add_row(*[f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()])
    console.print(table)
    err_console.print("wrote " + ", ".join(str(p) for p in [*paths, figure]))


@tcb_app.command("regimes", short_help="corr(δ, √V_eff) and corr(δ, margin) per prompt set.")
@groups.grouped
def regimes(
    *,
    out: opt.TcbOut,
    model: groups.Model,
    epsilon: opt.Epsilon = TCBConfig.epsilon,
    split: opt.Split = TCBStudies.split,
    arch: groups.Arch,
    resume: opt.StudyResume = False,
    overwrite: opt.StudyOverwrite = False,
) -> None:
    """corr(δ, √V_eff) and corr(δ, margin) on the diverse vs the low-V_eff prompt set (paper Table 1)."""
    from depthlens.studies.tcb_studies import StudyRun, prompt_set
    from depthlens.studies.tcb_studies import regimes as run
    from depthlens.viz.tcb import draw_regimes

    tcb = TCBConfig(epsilon=epsilon)
    lm = load_model(model.spec(arch))
    sets = {"diverse": prompt_set("diverse"), "low_veff": prompt_set("low_veff")}
    settings = {"tcb": tcb.to_dict(), "split": split, "dtype": model.dtype}
    with (
        _units(out, "regimes", lm, settings, resume, overwrite) as (done, on_unit),
        err_console.status("regimes"),
    ):
        result = run(lm, sets, tcb, split, StudyRun(done, on_unit))
    _finish(out, "regimes", result, draw_regimes(result, out / "regimes.png"))


@tcb_app.command("geometry", short_help="δ as competing embeddings cluster or disperse.")
@groups.grouped
def geometry(
    *,
    out: opt.TcbOut,
    model: groups.Model,
    top_k: opt.TopK = TCBStudies.top_k,
    cluster: opt.Cluster = TCBStudies.cluster,
    disperse: opt.Disperse = TCBStudies.disperse,
    arch: groups.Arch,
    resume: opt.StudyResume = False,
    overwrite: opt.StudyOverwrite = False,
) -> None:
    """How often δ_cluster > δ_orig > δ_disperse with o fixed, by V_eff band (paper Table 2)."""
    from depthlens.studies.tcb_studies import StudyRun, prompt_set
    from depthlens.studies.tcb_studies import geometry as run
    from depthlens.viz.tcb import draw_geometry

    lm = load_model(model.spec(arch))
    prompts = [p["prompt"] for p in prompt_set("diverse") + prompt_set("low_veff")]
    settings = {"top_k": top_k, "cluster": cluster, "disperse": disperse, "dtype": model.dtype}
    with (
        _units(out, "geometry", lm, settings, resume, overwrite) as (done, on_unit),
        err_console.status("geometry"),
    ):
        result = run(lm, prompts, top_k, cluster, disperse, StudyRun(done, on_unit))
    _finish(out, "geometry", result, draw_geometry(result, out / "geometry.png"))


@tcb_app.command("prompts", short_help="Accuracy, perplexity and δ per template and k-shot.")
@groups.grouped
def prompts(
    *,
    out: opt.TcbOut,
    model: groups.Model,
    task: opt.TcbTask = TCBStudies.task,
    questions: opt.TcbQuestions = TCBStudies.questions,
    task_config: opt.TaskConfig = None,
    shots: opt.Shots = ",".join(map(str, TCBStudies.shots)),
    templates: opt.Templates = None,
    max_new_tokens: opt.TcbMaxNew = TCBStudies.prompts_max_new_tokens,
    arch: groups.Arch,
    resume: opt.StudyResume = False,
    overwrite: opt.StudyOverwrite = False,
    backend: opt.BackendOpt = "auto",
    vllm: groups.Engine,
) -> None:
    """Accuracy, answer perplexity and δ per prompt template × k-shot, greedy answers (paper §4.3–4.4)."""
    from depthlens.evals.loading import load_task, parse_task_config
    from depthlens.studies.tcb_studies import StudyRun, prompt_variants
    from depthlens.viz.tcb import draw_prompt_variants

    shot_list, names = _variants(shots, templates)
    parsed_config = parse_task_config(task_config)
    load_task(task, 1, config=parsed_config)  # an unknown task or setting fails now, before the model loads
    backend_name = specs.engine_backend(
        backend, model.model, _progress_manifest(out, "prompts") if resume else None
    )
    engine = vllm.engine(backend_name, model)
    lm = load_model(model.spec(arch))
    settings = {
        "task": task,
        "task_config": task_config,
        "templates": names,
        "shots": shot_list,
        "max_new_tokens": max_new_tokens,
        "dtype": model.dtype,
        **_engine_setting(engine),
    }
    status = f"{len(names)} templates × {len(shot_list)} shot settings × {questions} questions"
    with (
        _units(out, "prompts", lm, settings, resume, overwrite) as (done, on_unit),
        err_console.status(status),
    ):
        result = prompt_variants(
            lm,
            task,
            questions,
            names,
            shot_list,
            max_new_tokens,
            parsed_config,
            StudyRun(done, on_unit, engine),
        )
    _finish(out, "prompts", result, draw_prompt_variants(result, out / "prompts.png"))


def _variants(shots: str, templates: str | None) -> tuple[list[int], list[str]]:
    """``--shots`` and ``--templates`` (default: every template), checked."""
    from depthlens.errors import InputError
    from depthlens.studies.tcb_studies import TEMPLATES

    try:
        shot_list = [int(s) for s in shots.split(",")]
    except ValueError:
        raise InputError(f"--shots {shots!r}: give comma-separated integers such as 0,2") from None
    names = [t.strip() for t in templates.split(",")] if templates else list(TEMPLATES)
    unknown = [t for t in names if t not in TEMPLATES]
    if unknown:
        raise InputError(
            f"--templates {templates}: unknown {', '.join(unknown)}; known: {', '.join(TEMPLATES)}"
        )
    return shot_list, names


@tcb_app.command("trace", short_help="δ and perplexity per generated token; sharp drops.")
@groups.grouped
def trace(
    *,
    out: opt.TcbOut,
    prompt: opt.TracePrompt = TCBStudies.prompt,
    model: groups.Model,
    max_new_tokens: opt.TcbMaxNew = TCBStudies.trace_max_new_tokens,
    window: opt.Window = TCBStudies.window,
    factor: opt.Factor = TCBStudies.factor,
    max_perplexity: opt.MaxPerplexity = TCBStudies.max_perplexity,
    chat: opt.TraceChat = TCBStudies.chat,
    arch: groups.Arch,
    resume: opt.StudyResume = False,
    overwrite: opt.StudyOverwrite = False,
    backend: opt.BackendOpt = "auto",
    vllm: groups.Engine,
) -> None:
    """δ and perplexity per generated token, sharp δ drops at low perplexity flagged (paper §4.5)."""
    from depthlens.studies.tcb_studies import DropRule, StudyRun, generation_trace
    from depthlens.viz.tcb import draw_generation_trace

    backend_name = specs.engine_backend(
        backend, model.model, _progress_manifest(out, "trace") if resume else None
    )
    engine = vllm.engine(backend_name, model)
    lm = load_model(model.spec(arch))
    rule = DropRule(window, factor, max_perplexity)
    settings = {
        "prompt": prompt,
        "max_new_tokens": max_new_tokens,
        "rule": rule.__dict__,
        "chat": chat,
        "dtype": model.dtype,
        **_engine_setting(engine),
    }
    with (
        _units(out, "trace", lm, settings, resume, overwrite, engine) as (done, on_unit),
        err_console.status("generating"),
    ):
        result = generation_trace(lm, prompt, max_new_tokens, rule, chat, StudyRun(done, on_unit, engine))
    _finish(out, "trace", result, draw_generation_trace(result, out / "trace.png"))
    console.print(result["summary"]["text"], highlight=False)
