"""``depthlens report``: one Markdown and HTML page of a run's stores — tables, figures, the commands that made it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console
from depthlens.config import CorrelationConfig, DTRConfig

D = opt.DEFAULTS
_C = CorrelationConfig()


@app.command("report", short_help="One Markdown and HTML report of a run's stores.")
def report(
    run_dir: Annotated[
        Path, typer.Argument(help="A store, or a folder of stores, from `depthlens generate`.")
    ],
    bins: opt.Bins = _C.bins,
    seeds: opt.Seeds = _C.seeds,
    bootstrap: opt.Bootstrap = _C.bootstrap,
    g: opt.G = D["g"],
    rho: opt.Rho = D["rho"],
    deep_rule: opt.DeepRuleOpt = D["deep_rule"],
    store_format: opt.StoreFormatOpt = None,
    verify: opt.Verify = False,
) -> None:
    """One Markdown and HTML page with the run's tables, figures and the commands that made it."""
    from depthlens.models.load import load_tokenizer
    from depthlens.viz.report import build_report

    cfg = CorrelationConfig(bins=bins, seeds=seeds, bootstrap=bootstrap)
    dtr = DTRConfig(g=g, rho=rho, deep_rule=deep_rule)  # type: ignore[arg-type]
    from depthlens.stores.parquet import verifying
    from depthlens.stores.samples import picking

    with picking(store_format), verifying(verify), err_console.status("building the report") as status:  # type: ignore[arg-type]
        md = build_report(run_dir, cfg, dtr, tokenizer_for=load_tokenizer,
                          on_store=lambda label: status.update(f"studying {label}"))  # fmt: skip
    console.print(f"report: {md}  (and {md.with_suffix('.html')})")
