"""``depthlens correlate``: DTR and the baselines against accuracy (Table 1, Figures 1 and 4), from stores only."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.table import Table

from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console
from depthlens.cli.progress import make_progress
from depthlens.config import CorrelationConfig, DTRConfig, StoreSpec


@app.command("correlate", short_help="DTR and the baselines against accuracy, from stores.")
def correlate(
    stores: opt.Stores,
    out: opt.StudyOut,
    bins: opt.Bins = CorrelationConfig.bins,
    seeds: opt.Seeds = CorrelationConfig.seeds,
    n: opt.NPerQ = CorrelationConfig.n,
    bootstrap: opt.Bootstrap = CorrelationConfig.bootstrap,
    g: opt.G = DTRConfig.g,
    rho: opt.Rho = DTRConfig.rho,
    deep_rule: opt.DeepRuleOpt = DTRConfig.deep_rule,
    g_kl: opt.GKL = None,
    g_cosine: opt.GCos = None,
    sweeps: opt.Sweeps = True,
    store_format: opt.StoreFormatOpt = StoreSpec.format,
    verify: opt.Verify = False,
) -> None:
    """DTR and the six baselines against accuracy (Table 1, Figures 1 and 4), from stores only.

    The study is defined in docs/definitions.md §4.
    """
    from depthlens.studies.report import find_stores

    cfg = CorrelationConfig(bins=bins, seeds=seeds, n=n, bootstrap=bootstrap)
    dtr = DTRConfig(g=g, rho=rho, deep_rule=deep_rule)  # type: ignore[arg-type]  # DTRConfig checks the text
    from depthlens.stores.guard import refuse_inside
    from depthlens.stores.parquet import verifying
    from depthlens.stores.samples import SAMPLES, SHARDS, picking

    paths = [p for s in stores for p in find_stores(s)]
    for path in paths:  # tables and figures never land inside a store they read
        refuse_inside(out, path / SHARDS, "the tables and figures")
        refuse_inside(out, path / SAMPLES, "the tables and figures")
    with picking(store_format), verifying(verify):
        _correlate(paths, out, cfg, dtr, g_kl, g_cosine, sweeps)


def _correlate(
    paths: list[Path],
    out: Path,
    cfg: CorrelationConfig,
    dtr: DTRConfig,
    g_kl: float | None,
    g_cosine: float | None,
    sweeps: bool,
) -> None:
    from depthlens.studies.report import study_store, write_correlation
    from depthlens.studies.stored import load_store
    from depthlens.viz.report import draw_study

    studies = []
    with make_progress(err_console) as progress:
        task = progress.add_task("stores", total=len(paths))
        for path in paths:
            progress.update(task, description=str(path))
            study = study_store(load_store(path), cfg, dtr, {"kl": g_kl, "cosine": g_cosine}, sweeps)
            draw_study(study, out, dtr)  # Figures 1 and 4
            studies.append(study)
            progress.advance(task)
    written = write_correlation(
        out,
        studies,
        {"correlation": cfg.to_dict(), "dtr": dtr.to_dict()},
        " ".join(["depthlens", *sys.argv[1:]]),
    )
    _print_table([r for s in studies for r in s.rows])
    err_console.print(f"wrote {', '.join(p.name for p in written)} and figures to {out}")


def _print_table(rows: list[dict]) -> None:
    columns = list(dict.fromkeys(f"{r['model']} · {r['task']}" for r in rows))
    from depthlens.studies.tables import format_p

    table = Table(
        title="binned r (paper) · point-biserial r [95 % CI] p_BH (Benjamini–Hochberg over the table; † < 0.05) · "
        "within questions: r p_perm, r with length · length held fixed: partial r p_perm, length-matched AUC",
        title_justify="left",
    )
    table.add_column("metric")
    for c in columns:
        table.add_column(c, justify="right")
    cells = {(r["label"], f"{r['model']} · {r['task']}"): r for r in rows}
    for label in dict.fromkeys(r["label"] for r in rows):
        out = []
        for c in columns:
            r = cells.get((label, c))
            if r is None or (r["binned_r"] is None and r["point_biserial"] is None):
                out.append("—")
                continue
            binned = "—" if r["binned_r"] is None else f"{r['binned_r']:+.2f}"
            pb = "—" if r["point_biserial"] is None else f"{r['point_biserial']:+.2f}"
            ci = (
                ""
                if r["point_biserial_lo"] is None
                else f" [{r['point_biserial_lo']:+.2f}, {r['point_biserial_hi']:+.2f}]"
            )
            adjusted = r.get("point_biserial_p_bh")
            flag = (
                "" if adjusted is None else f" p_BH {format_p(adjusted)}" + ("†" if adjusted < 0.05 else "")
            )
            out.append(f"{binned} · {pb}{ci}{flag} · {_within(r)} · {_held_fixed(r)}")
        table.add_row(label, *out)
    console.print(table)
    for r in rows:
        if r["note"] and r["metric"] == "dtr":
            err_console.print(f"[yellow]{r['model']} · {r['task']}:[/] {r['note']}", highlight=False)


def _within(row: dict) -> str:
    """The cell's within-question part: question-centred r with its permutation p, and r with length."""
    from depthlens.studies.tables import format_p

    r, p, length = row.get("r_within"), row.get("p_within_perm"), row.get("r_length_within")
    accuracy = "—" if r is None else f"{r:+.2f}" + ("" if p is None else f" p {format_p(p)}")
    return f"{accuracy}, len {'—' if length is None else f'{length:+.2f}'}"


def _held_fixed(row: dict) -> str:
    """The cell's length-held-fixed part: the within-question partial r (token count and the cut at the cap held
    fixed) with its permutation p, and the AUC of right against wrong responses of similar length."""
    from depthlens.studies.tables import format_p

    r, p, auc = row.get("r_within_partial"), row.get("p_within_partial"), row.get("auc_length_matched")
    partial = "—" if r is None else f"{r:+.2f}" + ("" if p is None else f" p {format_p(p)}")
    return f"partial {partial}, AUC {'—' if auc is None else f'{auc:.2f}'}"
