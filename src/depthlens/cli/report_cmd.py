"""``depthlens report``: one Markdown and HTML page of a run's stores — tables, figures, the commands that made it."""

from __future__ import annotations

from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console, warn
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
    from rich.markup import escape

    from depthlens.models.load import load_tokenizer
    from depthlens.studies.report import prepare_report
    from depthlens.viz.report import write_report

    cfg = CorrelationConfig(bins=bins, seeds=seeds, bootstrap=bootstrap)
    dtr = DTRConfig(g=g, rho=rho, deep_rule=deep_rule)  # type: ignore[arg-type]  # DTRConfig checks the text
    from depthlens.stores.parquet import verifying
    from depthlens.stores.samples import picking

    with picking(store_format), verifying(verify), err_console.status("building the report") as status:
        data = prepare_report(
            run_dir,
            cfg,
            dtr,
            tokenizer_for=load_tokenizer,
            on_store=lambda label: status.update(f"studying {label}"),
        )
        md = write_report(data)
    for skipped in data.skipped:  # the report says so too ("Stores not in this report")
        warn(escape(f"not in the report: {skipped.path}: {skipped.reason}"))  # a reason may hold [brackets]
    console.print(f"report: {md}  (and {md.with_suffix('.html')})")
