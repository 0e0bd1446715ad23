"""``depthlens score``: DTR, settling depths and the baselines for every record of a JSONL file."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console, load_model, warn, writes_to
from depthlens.cli.progress import make_progress

D = opt.DEFAULTS


def _say_rescored(ids: list[str]) -> None:
    if ids:
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        err_console.print(
            f"{len(ids)} input record(s) changed since they were scored; scoring again: {shown}"
        )


@app.command("score", short_help="Score responses: DTR, settling depth, baselines, TCB.")
def score(
    in_path: opt.InFile,
    out_path: opt.OutFile,
    model: opt.Model = D["model"],
    tokens: Annotated[
        bool, typer.Option("--tokens", help="Also write per-token tokens, settling, deep flags, divergences.")
    ] = False,
    g: opt.G = D["g"],
    rho: opt.Rho = D["rho"],
    prefix: opt.Prefix = None,
    divergence: opt.DivergenceOpt = D["divergence"],
    deep_rule: opt.DeepRuleOpt = D["deep_rule"],
    final_norm: opt.FinalNorm = True,
    tcb: Annotated[
        bool, typer.Option("--tcb/--no-tcb", help="Token Constraint Bound fields (docs/definitions.md §6).")
    ] = True,
    epsilon: opt.Epsilon = D["epsilon"],
    v_eff: opt.VEffOpt = D["v_eff"],
    spectral: Annotated[
        bool, typer.Option("--spectral", help="Also the spectral-norm δ (power iteration).")
    ] = False,
    batch_size: opt.BatchSize = 1,
    memory_mb: opt.MemoryMB = D["memory_mb"],
    compile_kernel: opt.CompileOpt = "auto",
    device: opt.Device = "auto",
    dtype: opt.DType = "auto",
    trust_remote_code: opt.TrustRemoteCode = False,
    blocks: opt.Blocks = None,
    final_norm_path: opt.FinalNormPath = None,
    unembed: opt.Unembed = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue an interrupted run into the same --out.")
    ] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out.")] = False,
    skip_bad: Annotated[
        bool, typer.Option("--skip-bad", help="Skip malformed or unusable records and list them.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary table at the end.")] = False,
) -> None:
    """Score responses: DTR, mean settling depth and six baselines per record.

    The metrics are defined in docs/definitions.md.
    """
    from depthlens.config import DTRConfig, ReadoutConfig, TCBConfig, degenerate_settings
    from depthlens.models.locate import locate
    from depthlens.studies.records import check_output, iter_jsonl, read_records

    readout = ReadoutConfig(divergence=divergence, final_norm=final_norm, memory_mb=memory_mb,  # type: ignore[arg-type]
                            compile=compile_kernel)  # type: ignore[arg-type]  # fmt: skip
    dtr = DTRConfig(g=g, rho=rho, deep_rule=deep_rule, prefix=prefix)  # type: ignore[arg-type]
    tcb_config = TCBConfig(epsilon=epsilon, v_eff=v_eff, spectral=spectral) if tcb else None  # type: ignore[arg-type]
    # Everything that needs no model is checked before one loads: the input, --out, the model's name, --resume.
    records, _ = read_records(in_path, skip_bad=skip_bad)
    if check_output(out_path, None, resume, overwrite):  # resuming: are the settings the stored run's?
        from depthlens.studies.score import MANIFEST_DEFAULTS, score_manifest

        manifest = score_manifest(model, None, in_path, readout, dtr, tcb_config, tokens)
        check_output(out_path, manifest, resume, overwrite, MANIFEST_DEFAULTS)
    locate(model)
    from depthlens.studies.score import score_file, score_summary

    if not records:
        warn(f"{in_path} has no records; {out_path} will be empty")
    for line in degenerate_settings(readout, dtr):
        warn(line)
    lm = load_model(model, device, dtype, trust_remote_code, blocks, final_norm_path, unembed)
    with make_progress(err_console) as progress:
        task = progress.add_task("scoring", total=None)

        def on_start(total: int, done: int) -> None:
            writes_to(out_path)
            progress.update(task, total=total, completed=done)

        skipped = score_file(
            lm, in_path, out_path, readout=readout, dtr=dtr, tcb=tcb_config, tokens=tokens, batch_size=batch_size,
            resume=resume, overwrite=overwrite, skip_bad=skip_bad,
            on_start=on_start, on_record=lambda _: progress.advance(task), on_rescore=_say_rescored,
        )  # fmt: skip
    for bad in skipped:
        err_console.print(f"skipped line {bad.line}: {bad.reason}", highlight=False, soft_wrap=True)
    summary = score_summary(iter_jsonl(out_path))
    if summary["deep_share"] in (0.0, 1.0):
        which, value = ("no", 0) if summary["deep_share"] == 0 else ("every", 1)
        warn(f"{which} token of the whole input is deep-thinking at --g {g:g} --rho {rho:g}: DTR is {value} "
             "for every record and ranks nothing; choose another --g or --rho")  # fmt: skip
    if not quiet:
        print_summary(summary, lm.n_layers)
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
            table.add_row(label, f"{record['id']} (DTR {record['dtr']:.3f}, {record['n_tokens']} tokens)")
    console.print(table)
