"""``depthlens score``: DTR, settling depths and the baselines for every record of a JSONL file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from depthlens.cli import groups, specs
from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console, load_for, warn, writes_to
from depthlens.cli.progress import make_progress
from depthlens.cli.runs import say_warnings
from depthlens.config import (
    DTRConfig,
    EngineConfig,
    ModelSpec,
    RayConfig,
    ReadoutConfig,
    ScoreRun,
    StoreSpec,
)
from depthlens.errors import InputError
from depthlens.studies import resolve
from depthlens.studies.runs import Built, score_run


def _say_rescored(ids: list[str]) -> None:
    if ids:
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        err_console.print(
            f"{len(ids)} input record(s) changed since they were scored; scoring again: {shown}"
        )


@app.command("score", short_help="Score responses: DTR, settling depth, baselines, TCB.")
@groups.grouped
def score(
    *,
    in_path: opt.InFile,
    out_path: opt.ResultsOut,
    model: groups.Model,
    tokens: opt.Tokens = ScoreRun.tokens,
    g: opt.G = DTRConfig.g,
    rho: opt.Rho = DTRConfig.rho,
    prefix: opt.Prefix = DTRConfig.dtr_prefix_tokens,
    divergence: opt.DivergenceOpt = ReadoutConfig.divergence,
    deep_rule: opt.DeepRuleOpt = DTRConfig.deep_rule,
    final_norm: opt.FinalNorm = ReadoutConfig.final_norm,
    lens: opt.LensOpt = str(ReadoutConfig.lens),
    settle: opt.SettleOpt = DTRConfig.settle,
    layers: groups.Layers,
    tcb: groups.Tcb,
    batch_size: opt.ScoreBatch = ScoreRun.batch_size,
    memory_mb: opt.MemoryMB = ReadoutConfig.memory_mb,
    compile_kernel: opt.CompileOpt = ReadoutConfig.compile,
    arch: groups.Arch,
    resume: opt.ResumeOut = StoreSpec.resume,
    overwrite: opt.OverwriteOut = StoreSpec.overwrite,
    skip_bad: opt.SkipBad = ScoreRun.skip_bad,
    quiet: opt.Quiet = False,
    float16: opt.Float16 = StoreSpec.float16,
    ray: groups.Ray,
    block_rows: opt.BlockRows = RayConfig.SCORE_BLOCK,
    backend: opt.ScoreBackend = EngineConfig.backend,
    tensor_parallel_size: opt.TensorParallel = EngineConfig.tensor_parallel_size,
    max_model_len: opt.ModelLen = EngineConfig.max_model_len,
    float32_lens: opt.Float32Lens = EngineConfig.float32_lens,
    threads: opt.Threads = EngineConfig.threads,
) -> None:
    """Score responses: DTR, mean settling depth and six baselines per record.

    The metrics are defined in docs/definitions.md.
    """
    from depthlens.stores.formats import read_inputs

    # Read before torch is imported (readout.tuned: ~10 s on a busy machine): a bad input fails in ~2 s.
    n_records = len(read_inputs(in_path, skip_bad=skip_bad)[0])
    kept = {"final_norm": final_norm, "memory_mb": memory_mb, **layers.fields()}
    readout = resolve.readout(divergence, (), lens, compile=compile_kernel, **kept)
    knobs = {"tensor_parallel_size": tensor_parallel_size, "max_model_len": max_model_len, "threads": threads}
    built = score_run(
        store=StoreSpec(out_path, resume, overwrite, float16=float16),
        source=in_path,
        readout=readout,
        dtr={"g": g, "rho": rho, "deep_rule": deep_rule, "dtr_prefix_tokens": prefix, "settle": settle},
        tcb=tcb.tcb,
        tcb_settings=tcb.config(),
        engine={"backend": backend, "dtype": model.dtype, "float32_lens": float32_lens, **knobs},  # hf | vllm
        tokens=tokens,
        batch_size=batch_size,
        skip_bad=skip_bad,
    )
    if backend == "vllm":
        _check_vllm(model.model, ray.on)
    _score(model.spec(arch), built, ray.config(block_rows), quiet, n_records)


def _check_vllm(model: str, ray: bool) -> None:
    """``--backend vllm``: one process (no Ray), vLLM installed and able to take ``model``, before anything
    loads."""
    if ray:
        raise InputError("--backend vllm scores in this process; drop --ray (or use --backend hf)")
    specs.engine_backend("vllm", model)


def _score(
    model_spec: ModelSpec, built: Built[ScoreRun], ray_config: RayConfig | None, quiet: bool, n_records: int
) -> None:
    """Check what needs no model, then score here or on Ray actors; one writer, and a run failing before its
    first record leaves no --out."""
    from depthlens.stores.guard import new_out, refuse_same_file
    from depthlens.stores.lock import store_lock

    run = built.run
    out_path = run.store.out
    refuse_same_file(run.source, out_path)  # before anything is created or loaded
    refuse_inside_input(run.source, out_path)
    with new_out(out_path), store_lock(out_path):
        _check_before_loading(model_spec.name, built, ray_config is not None, n_records)
        if ray_config is not None:
            _score_on_ray(model_spec, run, ray_config, quiet)
            return
        _score_here(model_spec, run, quiet)


def refuse_inside_input(source: Path, out: Path) -> None:
    """Scores never land inside the store they read (``--in runs/a/samples --out runs/a/samples/x``)."""
    src, target = source.resolve(), out.resolve()
    if source.is_dir() and (target == src or src in target.parents):
        raise InputError(f"--out {out} is inside the input store {source}; write the scores outside it")


def _score_here(model_spec: ModelSpec, run: ScoreRun, quiet: bool) -> None:
    from depthlens.studies.score import ScoreEvents, run_score

    out_path, dtr = run.store.out, run.dtr
    lm = load_for(run.engine, model_spec, "score")
    with make_progress(err_console) as progress:
        task = progress.add_task("scoring", total=None)
        events = ScoreEvents(
            _on_start(progress, task, out_path), lambda _: progress.advance(task), on_rescore=_say_rescored
        )
        skipped = run_score(lm, run, events)
    _finish(out_path, skipped, lm.n_layers, dtr, quiet)


def _check_before_loading(model: str, built: Built[ScoreRun], ray: bool, n_records: int) -> None:
    """Everything else that needs no model, before one loads: --out, the model's name, --resume (the input, its
    ``n_records`` records, was read before); the run's warnings."""
    from depthlens.models.locate import locate
    from depthlens.stores.formats import check_results, results_format, store_entry
    from depthlens.studies.score import RESUME_RULES, score_manifest

    run = built.run
    out_path, spec = run.store.out, run.store
    fmt = results_format(out_path)
    if ray and fmt == "jsonl":
        raise InputError(f"--out {out_path}: --ray writes a sharded Parquet store; give a directory name")
    store = store_entry(fmt, spec.float16)
    if check_results(
        out_path, None, spec.resume, spec.overwrite
    ):  # resuming: are the settings the stored run's?
        manifest = score_manifest(model, None, run, store)
        check_results(out_path, manifest, spec.resume, spec.overwrite, RESUME_RULES)
    if ray:
        from depthlens.scale.ray import import_ray

        import_ray()  # the missing extra is named before anything else happens
    locate(model)
    if not n_records:
        warn(f"{run.source} has no records; {out_path} will be empty")
    say_warnings(built.warnings)


def _on_start(progress: Any, task: Any, out_path: Path) -> Callable[[int, int], None]:
    def on_start(total: int, done: int) -> None:
        writes_to(out_path)
        progress.update(task, total=total, completed=done)

    return on_start


def _score_on_ray(model: ModelSpec, run: ScoreRun, ray: RayConfig, quiet: bool) -> None:
    from depthlens.scale.score import score_on_ray
    from depthlens.studies.score import ScoreEvents

    with make_progress(err_console) as progress:
        task = progress.add_task("scoring on Ray", total=None)
        events = ScoreEvents(
            _on_start(progress, task, run.store.out),
            on_block=lambda n: progress.advance(task, n),
            on_rescore=_say_rescored,
        )
        report = score_on_ray(model, run, ray, events)
    _finish(run.store.out, report.skipped, report.n_layers or 0, run.dtr, quiet)


def _finish(out_path: Path, skipped: list[Any], n_layers: int, dtr: DTRConfig, quiet: bool) -> None:
    """The end of a run: skipped records, a warning when DTR ranks nothing, the summary table."""
    from depthlens.stores.parquet import iter_store
    from depthlens.studies.score import score_summary

    for bad in skipped:
        err_console.print(f"skipped line {bad.line}: {bad.reason}", highlight=False, soft_wrap=True)
    summary = score_summary(iter_store(out_path))
    if summary["deep_share"] in (0.0, 1.0):
        which, value = ("no", 0) if summary["deep_share"] == 0 else ("every", 1)
        warn(
            f"{which} token of the whole input is deep-thinking at --g {dtr.g:g} --rho {dtr.rho:g}: DTR is {value} "
            "for every record and ranks nothing; choose another --g or --rho"
        )
    if not quiet:
        print_summary(summary, n_layers)
    err_console.print(f"wrote {out_path}" + (f" ({len(skipped)} skipped)" if skipped else ""))


def print_summary(summary: dict[str, Any], n_layers: int) -> None:
    """The run at a glance (``examples/show_scores.py`` prints every record)."""
    table = Table(title="score summary", title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    unscored = summary["records"] - summary["scored"]
    table.add_row("records", f"{summary['records']}" + (f" ({unscored} without tokens)" if unscored else ""))
    table.add_row("tokens", f"{summary['tokens']:,}")
    if summary["scored"]:
        table.add_row("mean DTR", f"{summary['mean_dtr']:.3f}")
        table.add_row("mean settling depth", f"{summary['mean_settling_depth']:.1f} of {n_layers} layers")
        for label, key in (("most deep", "most_deep"), ("least deep", "least_deep")):
            record = summary[key]
            table.add_row(label, f"{record['id']} (DTR {record['dtr']:.3f}, {record['token_count']} tokens)")
    console.print(table)
