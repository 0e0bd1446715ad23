"""``depthlens score``: DTR, settling depths and the baselines for every record of a JSONL file."""

from __future__ import annotations

from typing import Annotated

import typer

from depthlens.cli import options as opt
from depthlens.cli.app import app, err_console, load_model, writes_to
from depthlens.cli.progress import make_progress

D = opt.DEFAULTS


def _say_rescored(ids: list[str]) -> None:
    if ids:
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        err_console.print(
            f"{len(ids)} input record(s) changed since they were scored; scoring again: {shown}"
        )


@app.command("score")
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
        bool, typer.Option("--tcb/--no-tcb", help="Token Constraint Bound fields (SPEC §6).")
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
) -> None:
    """Score responses: DTR, mean settling depth and six baselines per record (SPEC §1–3)."""
    from depthlens.config import DTRConfig, ReadoutConfig, TCBConfig
    from depthlens.studies.score import score_file

    readout = ReadoutConfig(divergence=divergence, final_norm=final_norm, memory_mb=memory_mb,  # type: ignore[arg-type]
                            compile=compile_kernel)  # type: ignore[arg-type]  # fmt: skip
    dtr = DTRConfig(g=g, rho=rho, deep_rule=deep_rule, prefix=prefix)  # type: ignore[arg-type]
    tcb_config = TCBConfig(epsilon=epsilon, v_eff=v_eff, spectral=spectral) if tcb else None  # type: ignore[arg-type]
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
    err_console.print(f"wrote {out_path}" + (f" ({len(skipped)} skipped)" if skipped else ""))
