"""``depthlens tcb …``: the Token Constraint Bound paper's four studies, each a table and a figure."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from depthlens.cli import options as opt
from depthlens.cli import specs
from depthlens.cli.app import app, console, err_console, load_model, writes_to
from depthlens.config import EngineConfig

tcb_app = typer.Typer(
    help="Token Constraint Bound studies: regimes, geometry, prompts, trace (docs/definitions.md §6).",
    no_args_is_help=True,
)
app.add_typer(tcb_app, name="tcb", short_help="The Token Constraint Bound paper's four studies.")

D = opt.DEFAULTS
OutDir = Annotated[Path, typer.Option("--out", file_okay=False, help="Directory for the table and figure.")]


Resume = Annotated[bool, typer.Option("--resume", help="Continue an interrupted study in the same --out.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Start the study again in an existing --out.")]


@contextlib.contextmanager
def _units(
    out: Path, name: str, model: str, settings: dict[str, Any], resume: bool, overwrite: bool
) -> Iterator[tuple[dict[str, Any], Callable[[str, Any], None]]]:
    """The study's finished units (from ``<out>/<name>.progress.jsonl`` on --resume) and the callback that
    appends each new one there as it finishes (fsynced: a kill loses at most the unit in flight)."""
    from depthlens.stores.jsonl import ResultWriter, iter_jsonl

    path = _progress(out, name)
    manifest = {"study": name, "model": model, "settings": settings, "command": " ".join(sys.argv)}
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
def regimes(
    out: OutDir,
    model: opt.Model = D["model"],
    epsilon: opt.Epsilon = D["epsilon"],
    split: Annotated[
        float,
        typer.Option(
            "--split", callback=opt.finite, help="Also pool all prompts split at this measured V_eff."
        ),
    ] = 4.0,
    device: opt.Device = "auto",
    dtype: opt.DType = "auto",
    trust_remote_code: opt.TrustRemoteCode = False,
    blocks: opt.Blocks = None,
    final_norm_path: opt.FinalNormPath = None,
    unembed: opt.Unembed = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
) -> None:
    """corr(δ, √V_eff) and corr(δ, margin) on the diverse vs the low-V_eff prompt set (paper Table 1)."""
    from depthlens.config import TCBConfig
    from depthlens.studies.tcb_studies import StudyRun, prompt_set
    from depthlens.studies.tcb_studies import regimes as run
    from depthlens.viz.tcb import draw_regimes

    tcb = TCBConfig(epsilon=epsilon)
    lm = load_model(
        specs.model_spec(model, device, dtype, trust_remote_code, blocks, final_norm_path, unembed)
    )
    sets = {"diverse": prompt_set("diverse"), "low_veff": prompt_set("low_veff")}
    settings = {"tcb": tcb.to_dict(), "split": split, "dtype": dtype}
    with (
        _units(out, "regimes", model, settings, resume, overwrite) as (done, on_unit),
        err_console.status("regimes"),
    ):
        result = run(lm, sets, tcb, split, StudyRun(done, on_unit))
    _finish(out, "regimes", result, draw_regimes(result, out / "regimes.png"))


@tcb_app.command("geometry", short_help="δ as competing embeddings cluster or disperse.")
def geometry(
    out: OutDir,
    model: opt.Model = D["model"],
    top_k: Annotated[
        int, typer.Option("--top-k", min=2, help="Competing tokens moved (most probable).")
    ] = 10,
    cluster: Annotated[
        float, typer.Option("--cluster", callback=opt.finite, help="α < 1: rows pulled toward the centroid.")
    ] = 0.5,
    disperse: Annotated[
        float, typer.Option("--disperse", callback=opt.finite, help="α > 1: rows pushed away.")
    ] = 1.5,
    device: opt.Device = "auto",
    dtype: opt.DType = "auto",
    trust_remote_code: opt.TrustRemoteCode = False,
    blocks: opt.Blocks = None,
    final_norm_path: opt.FinalNormPath = None,
    unembed: opt.Unembed = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
) -> None:
    """How often δ_cluster > δ_orig > δ_disperse with o fixed, by V_eff band (paper Table 2)."""
    from depthlens.studies.tcb_studies import StudyRun, prompt_set
    from depthlens.studies.tcb_studies import geometry as run
    from depthlens.viz.tcb import draw_geometry

    lm = load_model(
        specs.model_spec(model, device, dtype, trust_remote_code, blocks, final_norm_path, unembed)
    )
    prompts = [p["prompt"] for p in prompt_set("diverse") + prompt_set("low_veff")]
    settings = {"top_k": top_k, "cluster": cluster, "disperse": disperse, "dtype": dtype}
    with (
        _units(out, "geometry", model, settings, resume, overwrite) as (done, on_unit),
        err_console.status("geometry"),
    ):
        result = run(lm, prompts, top_k, cluster, disperse, StudyRun(done, on_unit))
    _finish(out, "geometry", result, draw_geometry(result, out / "geometry.png"))


@tcb_app.command("prompts", short_help="Accuracy, perplexity and δ per template and k-shot.")
def prompts(
    out: OutDir,
    model: opt.Model = D["model"],
    task: Annotated[
        str, typer.Option("--task", help="An offline reasoning-gym task.")
    ] = "reasoning_gym:chain_sum",
    questions: Annotated[int, typer.Option("--questions", min=1)] = 10,
    task_config: Annotated[
        str | None,
        typer.Option("--task-config", help="reasoning-gym settings, e.g. 'max_terms=3,max_digits=2'."),
    ] = None,
    shots: Annotated[
        str, typer.Option("--shots", help="Comma-separated numbers of worked examples.")
    ] = "0,2",
    templates: Annotated[
        str | None, typer.Option("--templates", help="Subset of bare,paper,terse,expert.")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 96,
    device: opt.Device = "auto",
    dtype: opt.DType = "auto",
    trust_remote_code: opt.TrustRemoteCode = False,
    blocks: opt.Blocks = None,
    final_norm_path: opt.FinalNormPath = None,
    unembed: opt.Unembed = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
    backend: opt.BackendOpt = "auto",
    tensor_parallel_size: opt.TensorParallel = 1,
    gpu_memory_utilization: opt.GpuMemory = None,
    max_model_len: opt.MaxModelLen = None,
    enforce_eager: opt.EnforceEager = False,
    kv_cache_gib: opt.KvCacheGib = None,
) -> None:
    """Accuracy, answer perplexity and δ per prompt template × k-shot, greedy answers (paper §4.3–4.4)."""
    from depthlens.errors import InputError
    from depthlens.evals.loading import load_task, parse_task_config
    from depthlens.studies.tcb_studies import TEMPLATES, StudyRun, prompt_variants
    from depthlens.viz.tcb import draw_prompt_variants

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
    parsed_config = parse_task_config(task_config)
    load_task(task, 1, config=parsed_config)  # an unknown task or setting fails now, before the model loads
    backend_name = specs.engine_backend(
        backend, model, _progress_manifest(out, "prompts") if resume else None
    )
    engine = EngineConfig(
        backend_name,
        dtype,
        tensor_parallel_size,
        gpu_memory_utilization,
        max_model_len,
        enforce_eager,
        kv_cache_gib,
    )
    lm = load_model(
        specs.model_spec(model, device, dtype, trust_remote_code, blocks, final_norm_path, unembed)
    )
    settings = {"task": task, "task_config": task_config, "templates": names, "shots": shot_list,
                "max_new_tokens": max_new_tokens, "dtype": dtype, **_engine_setting(engine)}  # fmt: skip
    status = f"{len(names)} templates × {len(shot_list)} shot settings × {questions} questions"
    with (
        _units(out, "prompts", model, settings, resume, overwrite) as (done, on_unit),
        err_console.status(status),
    ):
        result = prompt_variants(lm, task, questions, names, shot_list, max_new_tokens, parsed_config,
                                 StudyRun(done, on_unit, engine))  # fmt: skip
    _finish(out, "prompts", result, draw_prompt_variants(result, out / "prompts.png"))


@tcb_app.command("trace", short_help="δ and perplexity per generated token; sharp drops.")
def trace(
    out: OutDir,
    prompt: Annotated[str, typer.Option("--prompt", help="The user message to answer.")] = (
        "Explain in two sentences why the sky is blue."
    ),
    model: opt.Model = D["model"],
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 64,
    window: Annotated[int, typer.Option("--window", min=1, help="Tokens of history for the median.")] = 8,
    factor: Annotated[
        float, typer.Option("--factor", callback=opt.finite, help="Drop: δ ≤ median / factor.")
    ] = 10.0,
    max_perplexity: Annotated[
        float, typer.Option("--max-perplexity", callback=opt.finite, help="...while perplexity ≤ this.")
    ] = 2.0,
    chat: Annotated[
        bool, typer.Option("--chat/--plain", help="Use the chat template when there is one.")
    ] = True,
    device: opt.Device = "auto",
    dtype: opt.DType = "auto",
    trust_remote_code: opt.TrustRemoteCode = False,
    blocks: opt.Blocks = None,
    final_norm_path: opt.FinalNormPath = None,
    unembed: opt.Unembed = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
    backend: opt.BackendOpt = "auto",
    tensor_parallel_size: opt.TensorParallel = 1,
    gpu_memory_utilization: opt.GpuMemory = None,
    max_model_len: opt.MaxModelLen = None,
    enforce_eager: opt.EnforceEager = False,
    kv_cache_gib: opt.KvCacheGib = None,
) -> None:
    """δ and perplexity per generated token, sharp δ drops at low perplexity flagged (paper §4.5)."""
    from depthlens.studies.tcb_studies import DropRule, StudyRun, generation_trace
    from depthlens.viz.tcb import draw_generation_trace

    backend_name = specs.engine_backend(backend, model, _progress_manifest(out, "trace") if resume else None)
    engine = EngineConfig(
        backend_name,
        dtype,
        tensor_parallel_size,
        gpu_memory_utilization,
        max_model_len,
        enforce_eager,
        kv_cache_gib,
    )
    lm = load_model(
        specs.model_spec(model, device, dtype, trust_remote_code, blocks, final_norm_path, unembed)
    )
    rule = DropRule(window, factor, max_perplexity)
    settings = {"prompt": prompt, "max_new_tokens": max_new_tokens, "rule": rule.__dict__, "chat": chat,
                "dtype": dtype, **_engine_setting(engine)}  # fmt: skip
    with (
        _units(out, "trace", model, settings, resume, overwrite) as (done, on_unit),
        err_console.status("generating"),
    ):
        result = generation_trace(lm, prompt, max_new_tokens, rule, chat, StudyRun(done, on_unit, engine))
    _finish(out, "trace", result, draw_generation_trace(result, out / "trace.png"))
    console.print(result["summary"]["text"], highlight=False)
