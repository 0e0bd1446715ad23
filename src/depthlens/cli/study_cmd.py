"""``depthlens correlate``, ``depthlens heatmap`` and ``depthlens report``: the deep-thinking paper's analyses."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console, load_model, warn
from depthlens.cli.progress import make_progress
from depthlens.config import CorrelationConfig, DTRConfig

D = opt.DEFAULTS
_C = CorrelationConfig()

Stores = Annotated[
    list[Path], typer.Argument(help="Sample stores (or folders of them) from `depthlens generate`.")
]
Bins = Annotated[int, typer.Option("--bins", min=3, help="Quantile bins per question (the paper: 5).")]
Seeds = Annotated[int, typer.Option("--seeds", min=1, help="Repetitions of subsampling and tie-breaking.")]
NPerQ = Annotated[
    int | None,
    typer.Option("--n", min=3, help="Responses drawn per question per seed (default: the whole pool)."),
]
Bootstrap = Annotated[
    int, typer.Option("--bootstrap", min=1, help="Question resamples for the 95 % intervals.")
]
GKL = Annotated[
    float | None,
    typer.Option(
        "--g-kl", callback=opt.finite, help="Settling threshold for the KL DTR (default: matched to JSD's)."
    ),
]
GCos = Annotated[
    float | None,
    typer.Option(
        "--g-cosine", callback=opt.finite, help="Settling threshold for the cosine DTR (default: matched)."
    ),
]


def _command() -> str:
    return " ".join(["depthlens", *sys.argv[1:]])


def _config(bins: int, seeds: int, n: int | None, bootstrap: int) -> CorrelationConfig:
    return CorrelationConfig(bins=bins, seeds=seeds, n=n, bootstrap=bootstrap)


@app.command("correlate", short_help="DTR and the baselines against accuracy, from stores.")
def correlate(
    stores: Stores,
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="Directory for tables and figures.")],
    bins: Bins = _C.bins,
    seeds: Seeds = _C.seeds,
    n: NPerQ = None,
    bootstrap: Bootstrap = _C.bootstrap,
    g: opt.G = D["g"],
    rho: opt.Rho = D["rho"],
    deep_rule: opt.DeepRuleOpt = D["deep_rule"],
    g_kl: GKL = None,
    g_cosine: GCos = None,
    sweeps: Annotated[
        bool, typer.Option("--sweeps/--no-sweeps", help="Also the g/ρ/prefix/kind sweeps.")
    ] = True,
) -> None:
    """DTR and the six baselines against accuracy (Table 1, Figures 1 and 4), from stores only.

    The study is defined in docs/definitions.md §4.
    """
    from depthlens.studies.correlation import load_store
    from depthlens.viz.report import find_stores, study_store, write_correlation

    cfg = _config(bins, seeds, n, bootstrap)
    dtr = DTRConfig(g=g, rho=rho, deep_rule=deep_rule)  # type: ignore[arg-type]
    paths = [p for s in stores for p in find_stores(s)]
    studies = []
    with make_progress(err_console) as progress:
        task = progress.add_task("stores", total=len(paths))
        for path in paths:
            progress.update(task, description=str(path))
            studies.append(
                study_store(load_store(path), out, cfg, dtr, {"kl": g_kl, "cosine": g_cosine}, sweeps)
            )
            progress.advance(task)
    written = write_correlation(
        out, studies, {"correlation": cfg.to_dict(), "dtr": dtr.to_dict()}, _command()
    )
    _print_table([r for s in studies for r in s.rows])
    err_console.print(f"wrote {', '.join(p.name for p in written)} and figures to {out}")


def _print_table(rows: list[dict]) -> None:
    columns = list(dict.fromkeys(f"{r['model']} · {r['task']}" for r in rows))
    from depthlens.studies.inference import format_p

    table = Table(
        title="binned r (paper) · point-biserial r [95 % CI] p_BH (Benjamini–Hochberg over the table; † < 0.05)",
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
            out.append(f"{binned} · {pb}{ci}{flag}")
        table.add_row(label, *out)
    console.print(table)
    for r in rows:
        if r["note"] and r["metric"] == "dtr":
            err_console.print(f"[yellow]{r['model']} · {r['task']}:[/] {r['note']}", highlight=False)


@app.command("heatmap", short_help="One text's token × layer divergence heatmap.")
def heatmap(
    completion: Annotated[
        str, typer.Option("--completion", help="The generated text whose tokens are read out.")
    ],
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="Directory for the figures.")],
    prompt: Annotated[
        str, typer.Option("--prompt", help="The text before the completion (not scored).")
    ] = "",
    chat: Annotated[
        bool, typer.Option("--chat", help="Wrap the prompt in the model's chat template.")
    ] = False,
    model: opt.Model = D["model"],
    token: Annotated[
        int | None,
        typer.Option("--token", help="Token index for Figure 3 (default: the deepest-settling one)."),
    ] = None,
    g: opt.G = D["g"],
    rho: opt.Rho = D["rho"],
    deep_rule: opt.DeepRuleOpt = D["deep_rule"],
    divergence: opt.DivergenceOpt = D["divergence"],
    device: opt.Device = "auto",
    dtype: opt.DType = "auto",
    trust_remote_code: opt.TrustRemoteCode = False,
    blocks: opt.Blocks = None,
    final_norm_path: opt.FinalNormPath = None,
    unembed: opt.Unembed = None,
) -> None:
    """One text's token × layer divergence heatmap (PNG and interactive HTML) and one token's settling plot."""
    import json

    from depthlens.config import ReadoutConfig, degenerate_settings
    from depthlens.errors import InputError
    from depthlens.metrics.dtr import deep_threshold
    from depthlens.studies.score import score
    from depthlens.viz.heatmap import draw_divergence_heatmap, write_heatmap_html
    from depthlens.viz.study import draw_token_settling

    if not completion:
        raise InputError("--completion is empty: give the text to read out")
    if token is not None and token < 0:
        raise InputError(f"--token {token}: give a token index, 0 or more")
    dtr = DTRConfig(g=g, rho=rho, deep_rule=deep_rule)  # type: ignore[arg-type]
    readout = ReadoutConfig(divergence=divergence)  # type: ignore[arg-type]
    for line in degenerate_settings(readout, dtr):
        warn(line)
    lm = load_model(model, device, dtype, trust_remote_code, blocks, final_norm_path, unembed)
    data = {"id": "text", "completion": completion}
    data.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    with err_console.status("reading out every layer"):
        (record,) = score(lm, [data], readout=readout, dtr=dtr, tcb=None, tokens=True)
    if not record["n_tokens"]:
        raise InputError(f"--completion {completion!r} has no tokens for {model}'s tokenizer; give some text")
    unit = {"jsd": "bits", "jsd-nat": "nats", "kl": "nats", "cosine": "1 − cos"}[divergence]
    out.mkdir(parents=True, exist_ok=True)
    (out / "record.json").write_text(json.dumps(record) + "\n")
    title = f"{model}: {divergence.upper()} to the final layer ({unit}); DTR = {record['dtr']:.2f}"
    paths = [draw_divergence_heatmap(record, out / "heatmap.png", title=title),
             write_heatmap_html(record, out / "heatmap.html", title=title, unit=unit)]  # fmt: skip
    n = len(record["settling_depth"])
    t = max(range(n), key=lambda i: record["settling_depth"][i]) if token is None else token
    if not 0 <= t < n:
        raise InputError(f"--token {token}: the completion has {n} tokens (0 … {n - 1})")
    paths.append(draw_token_settling(record["divergence"][t], g, deep_threshold(lm.n_layers, rho, deep_rule),  # type: ignore[arg-type]
                                     out / "token.png", token=record["tokens"][t], unit=unit))  # fmt: skip
    console.print(
        f"{n} tokens · DTR {record['dtr']:.2f} · mean settling depth {record['mean_settling_depth']:.1f} "
        f"of {lm.n_layers} layers"
    )
    err_console.print(f"wrote {', '.join(p.name for p in paths)} and record.json to {out}")


@app.command("report", short_help="One Markdown and HTML report of a run's stores.")
def report(
    run_dir: Annotated[
        Path, typer.Argument(help="A store, or a folder of stores, from `depthlens generate`.")
    ],
    bins: Bins = _C.bins,
    seeds: Seeds = _C.seeds,
    bootstrap: Bootstrap = _C.bootstrap,
    g: opt.G = D["g"],
    rho: opt.Rho = D["rho"],
    deep_rule: opt.DeepRuleOpt = D["deep_rule"],
) -> None:
    """One Markdown and HTML page with the run's tables, figures and the commands that made it."""
    from depthlens.models.load import load_tokenizer
    from depthlens.viz.report import build_report

    cfg = _config(bins, seeds, None, bootstrap)
    dtr = DTRConfig(g=g, rho=rho, deep_rule=deep_rule)  # type: ignore[arg-type]
    with err_console.status("building the report") as status:
        md = build_report(run_dir, cfg, dtr, tokenizer_for=load_tokenizer,
                          on_store=lambda label: status.update(f"studying {label}"))  # fmt: skip
    console.print(f"report: {md}  (and {md.with_suffix('.html')})")
