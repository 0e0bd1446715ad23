"""``depthlens report``: one Markdown and HTML page of a run's stores — tables, figures, the commands that made it."""

from __future__ import annotations

from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console
from depthlens.config import CorrelationConfig, DTRConfig, StoreSpec


@app.command("report", short_help="One Markdown and HTML report of a run's stores.")
def report(
    run_dir: opt.RunDir,
    bins: opt.Bins = CorrelationConfig.bins,
    seeds: opt.Seeds = CorrelationConfig.seeds,
    bootstrap: opt.Bootstrap = CorrelationConfig.bootstrap,
    g: opt.G = DTRConfig.g,
    rho: opt.Rho = DTRConfig.rho,
    deep_rule: opt.DeepRuleOpt = DTRConfig.deep_rule,
    store_format: opt.StoreFormatOpt = StoreSpec.format,
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
        md = build_report(
            run_dir,
            cfg,
            dtr,
            tokenizer_for=load_tokenizer,
            on_store=lambda label: status.update(f"studying {label}"),
        )
    console.print(f"report: {md}  (and {md.with_suffix('.html')})")
