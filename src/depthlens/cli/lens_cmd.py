"""``depthlens lens …``: fit a tuned lens for a model, and compare the lenses and settling rules on the same
responses (docs/definitions.md §1–2, issue 43)."""

from __future__ import annotations

import typer
from rich.table import Table

from depthlens.cli import groups
from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console, load_model, warn
from depthlens.config import LensFitConfig

lens_app = typer.Typer(
    help="The tuned lens: fit one for a model; compare lenses and settling rules (docs/definitions.md §1–2).",
    no_args_is_help=True,
)
app.add_typer(lens_app, name="lens", short_help="Fit a tuned lens; compare lenses and settling rules.")


@lens_app.command("fit", short_help="Fit a tuned lens (per-layer affine translators) for a model.")
@groups.grouped
def fit(
    *,
    out: opt.LensOut,
    model: groups.Model,
    in_path: opt.FitIn = None,
    max_tokens: opt.FitMaxTokens = LensFitConfig.max_tokens,
    steps: opt.FitSteps = LensFitConfig.steps,
    max_seconds: opt.FitMaxSeconds = LensFitConfig.max_seconds,
    lr: opt.FitLr = LensFitConfig.lr,
    heldout: opt.FitHeldout = LensFitConfig.heldout,
    batch_tokens: opt.FitBatchTokens = LensFitConfig.batch_tokens,
    layers_per_step: opt.FitLayersPerStep = LensFitConfig.layers_per_step,
    seed: opt.FitSeed = LensFitConfig.seed,
    resume: opt.FitResume = False,
) -> None:
    """Fit a tuned lens: the least-squares map of each layer's state onto the last one's, then KL(p_L ‖ p_l) steps.

    Writes OUT/translators.safetensors and OUT/lens.json (the model's fingerprint, L, d, the data, token counts,
    steps, held-out KL per layer for the logit and the tuned lens). Read through it with
    `depthlens score --lens tuned:OUT`.
    """
    from depthlens.errors import InputError
    from depthlens.studies.lens_fit import fit_lens, fit_warning, lens_sequences

    cfg = LensFitConfig(
        max_tokens=max_tokens,
        heldout=heldout,
        steps=steps,
        lr=lr,
        batch_tokens=batch_tokens,
        layers_per_step=layers_per_step,
        max_seconds=max_seconds,
        seed=seed,
    )
    if out.exists() and not resume and any(out.iterdir()):
        raise InputError(
            f"--out {out} exists and is not empty; add --resume to go on with its fit, or remove it"
        )
    lm = load_model(model.spec())
    sequences, data = lens_sequences(lm, in_path)
    with err_console.status("fitting the tuned lens") as status:
        stamp = fit_lens(
            lm,
            sequences,
            out,
            cfg,
            data=data,
            resume=resume,
            progress=lambda step, loss: status.update(f"KL step {step}/{cfg.steps}: {loss:.4f} nats"),
        )
    print_kl(stamp)
    if (warning := fit_warning(stamp, cfg)) is not None:
        warn(warning)
    kept = f"; {out}/checkpoint.pt kept for --resume" if stamp["steps"] < cfg.steps else ""
    err_console.print(
        f"wrote {out} ({stamp['steps']} KL steps{kept}; read through it with `score --lens tuned:{out}`)"
    )


def print_kl(stamp: dict) -> None:
    """The stamp's held-out KL(p_L ‖ p_l) per layer, logit against tuned lens (the tuned-lens paper's figure)."""
    kl = stamp["heldout_kl"]
    table = Table(title=f"held-out KL(p_L ‖ p_l), nats — {stamp['model']}", title_justify="left")
    for column in ("layer", "logit lens", "tuned lens"):
        table.add_column(column, justify="right")
    for layer, (a, b) in enumerate(zip(kl["logit"], kl["tuned"], strict=True), start=1):
        table.add_row(str(layer), f"{a:.3f}", f"{b:.3f}")
    console.print(table)


@lens_app.command("compare", short_help="Lenses and settling rules side by side on the same responses.")
def compare(
    stores: opt.CompareStores, samples: opt.CompareSamples = None, out: opt.CompareOut = None
) -> None:
    """Score stores of the same responses under different lenses or settling rules, compared.

    Per store: mean DTR, mean settling depth and its quartiles, the Spearman rank agreement of responses by DTR with
    the first store, and with --samples the correlation of DTR with accuracy (Table 1's statistics); tuned lenses
    add their stamps' held-out KL per layer. Writes lens_compare.json and lens_compare.png.
    """
    import json

    from depthlens.studies.lens_compare import compare_arms, lens_kl, load_arm, outcomes
    from depthlens.viz.lens import draw_lens_comparison

    arms = [load_arm(path) for path in stores]
    graded = outcomes(samples) if samples is not None else None
    rows = compare_arms(arms, graded)
    kl = lens_kl(arms)
    for stamp_kl in kl.values():
        print_kl({"model": arms[0].path.name, "heldout_kl": stamp_kl})
    _print_rows(rows, graded is not None)
    folder = out if out is not None else stores[0].resolve().parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lens_compare.json").write_text(json.dumps({"arms": rows, "heldout_kl": kl}, indent=1) + "\n")
    depths = {a.label: (a.token_depths if a.token_depths.size else list(a.depth.values())) for a in arms}
    figure = draw_lens_comparison(kl, depths, arms[0].n_layers, folder / "lens_compare.png")
    err_console.print(f"wrote {folder / 'lens_compare.json'} and {figure}")


def _cell(value: object, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _statistic(row: dict, stat: str) -> str:
    """``r [lo, hi] p`` of one accuracy statistic of a comparison row (its note where there is none)."""
    from depthlens.studies.tables import format_p

    value = row[f"accuracy_{stat}"]
    if value is None:
        return row["accuracy_note"] or "—"
    lo, hi = row[f"accuracy_{stat}_ci"]
    ci = f" [{_cell(lo, 2)}, {_cell(hi, 2)}]" if lo is not None else ""
    p = row[f"accuracy_{stat}_p"]
    return f"{value:+.2f}{ci}" + (f" p {format_p(p)}" if p is not None else "")


def _print_rows(rows: list[dict], graded: bool) -> None:
    table = Table(title="lenses and settling rules on the same responses", title_justify="left")
    columns = ["lens · rule", "responses", "mean DTR", "mean depth", "depth q25/q50/q75", "ρ vs first"]
    accuracy = ["binned r [95% CI] p", "ρ(DTR, correct) [95% CI] p", "r_pb [95% CI] p"]
    for column in columns + (accuracy if graded else []):
        table.add_column(column, justify="right")
    for row in rows:
        quartiles = "/".join(_cell(q, 1) for q in row["depth_quartiles"]) + f" ({row['depth_of']})"
        cells = [
            row["arm"],
            str(row["responses"]),
            _cell(row["mean_dtr"]),
            _cell(row["mean_settling_depth"], 2),
            quartiles,
            _cell(row["spearman_vs_first"]),
        ]
        if graded:
            for stat in ("binned_r", "spearman", "point_biserial"):
                cells.append(_statistic(row, stat))
        table.add_row(*cells)
    console.print(table)
