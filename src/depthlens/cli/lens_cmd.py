"""``depthlens lens …``: fit a tuned or a Jacobian lens for a model, and compare the lenses and settling rules on
the same responses (docs/definitions.md §1–2, issues 43 and 58)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from depthlens.cli import groups
from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console, load_model, warn
from depthlens.config import LensFitConfig

if TYPE_CHECKING:
    from depthlens.config import JacobianFitConfig

lens_app = typer.Typer(
    help="Fitted lenses: fit a tuned or a Jacobian lens for a model; compare lenses and settling rules "
    "(docs/definitions.md §1–2).",
    no_args_is_help=True,
)
app.add_typer(
    lens_app, name="lens", short_help="Fit a tuned or Jacobian lens; compare lenses and settling rules."
)

KIND_FLAGS = {
    "tuned": {"max_tokens": "--max-tokens", "steps": "--steps", "lr": "--lr", "heldout": "--heldout",
              "batch_tokens": "--batch-tokens", "layers_per_step": "--layers-per-step"},
    "jacobian": {"prompts": "--prompts", "max_tokens": "--prompt-tokens", "heldout": "--heldout-prompts",
                 "memory_mb": "--memory-mb", "dtype": "--lens-dtype"},
}  # fmt: skip
"""Each kind's own options: config field → flag (an option of the other kind is refused, not ignored)."""


@lens_app.command("fit", short_help="Fit a tuned lens or a Jacobian lens for a model.")
@groups.grouped
def fit(
    *,
    out: opt.LensOut,
    model: groups.Model,
    kind: opt.FitKind = "tuned",
    in_path: opt.FitIn = None,
    max_tokens: opt.FitMaxTokens = None,
    steps: opt.FitSteps = None,
    max_seconds: opt.FitMaxSeconds = None,
    lr: opt.FitLr = None,
    heldout: opt.FitHeldout = None,
    batch_tokens: opt.FitBatchTokens = None,
    layers_per_step: opt.FitLayersPerStep = None,
    prompts: opt.FitPrompts = None,
    prompt_tokens: opt.FitPromptTokens = None,
    heldout_prompts: opt.FitHeldoutPrompts = None,
    memory_mb: opt.FitMemoryMb = None,
    lens_dtype: opt.FitLensDType = None,
    seed: opt.FitSeed = None,
    resume: opt.FitResume = False,
) -> None:
    """Fit a lens for a model: --kind tuned (default) or jacobian.

    tuned: the least-squares map of each layer's state onto the last one's, then KL(p_L ‖ p_l) steps; writes
    OUT/translators.safetensors and OUT/lens.json. jacobian: J_l averaged over --prompts windows of the corpus (the
    SPEC's estimator: positions after the first 16, targets summed, sources and prompts averaged); writes the
    published .pt artifact OUT with depthlens's stamp in its metadata. Both print the held-out KL per layer, logit
    lens against the fitted one. Read through it with `depthlens score --lens tuned:OUT` or
    `depthlens score --lens jacobian:OUT`.
    """
    from depthlens.config import JacobianFitConfig
    from depthlens.errors import InputError

    if kind not in KIND_FLAGS:
        raise InputError(f"--kind {kind}: must be tuned or jacobian")
    given: dict[str, dict[str, Any]] = {
        "tuned": {"max_tokens": max_tokens, "steps": steps, "lr": lr, "heldout": heldout,
                  "batch_tokens": batch_tokens, "layers_per_step": layers_per_step},
        "jacobian": {"prompts": prompts, "max_tokens": prompt_tokens, "heldout": heldout_prompts,
                     "memory_mb": memory_mb, "dtype": lens_dtype},
    }  # fmt: skip
    other = "jacobian" if kind == "tuned" else "tuned"
    for key, value in given[other].items():
        if value is not None:
            flag = KIND_FLAGS[other][key]
            raise InputError(f"{flag} {value}: it sets a --kind {other} fit; leave it out for --kind {kind}")
    settings: dict[str, Any] = {
        k: v for k, v in {**given[kind], "max_seconds": max_seconds, "seed": seed}.items() if v is not None
    }
    if kind == "tuned":
        _fit_tuned(out, model, in_path, LensFitConfig(**settings), resume)
    else:
        _fit_jacobian(out, model, in_path, JacobianFitConfig(**settings), resume)


def _fit_tuned(
    out: Path, model: groups.Model, in_path: Path | None, cfg: LensFitConfig, resume: bool
) -> None:
    from depthlens.errors import InputError
    from depthlens.studies.lens_fit import fit_lens, fit_warning, lens_sequences

    if out.exists() and (not out.is_dir() or (not resume and any(out.iterdir()))):
        raise InputError(
            f"--out {out} exists and is not an empty folder; add --resume to go on with its fit, or remove it"
        )
    lm = load_model(model.spec())
    sequences, data = lens_sequences(lm, in_path)
    with (
        err_console.status("fitting the tuned lens") as status,
        stopped_says(out / "checkpoint.pt", "KL steps"),
    ):
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
        f"wrote {out} ({stamp['steps']} KL steps{kept}; read through it with `score --lens tuned:{out}`)",
        highlight=False,
    )


def _fit_jacobian(
    out: Path, model: groups.Model, in_path: Path | None, cfg: JacobianFitConfig, resume: bool
) -> None:
    from depthlens.errors import InputError
    from depthlens.studies.jacobian_fit import checkpoint_path, fit_jacobian, jacobian_prompts

    checkpoint = checkpoint_path(out)
    if out.is_dir():
        raise InputError(
            f"--out {out} is a folder; a Jacobian lens is one .pt file: name it (e.g. {out}/jlens.pt)"
        )
    if out.exists() and not resume:
        raise InputError(f"--out {out} exists; add --resume to go on with its fit, or remove it")
    if out.exists() and not checkpoint.exists():
        raise InputError(
            f"--out {out} is a finished fit with no checkpoint to go on from; remove it to refit"
        )
    lm = load_model(model.spec())
    chosen = jacobian_prompts(lm, in_path, cfg)
    with err_console.status("fitting the Jacobian lens") as status, stopped_says(checkpoint, "prompts"):
        stamp = fit_jacobian(
            lm, chosen, out, cfg, resume=resume, progress=lambda *done: _prompt_done(status, *done)
        )
    print_kl(stamp)
    done, asked = stamp["prompts"]["fitted"], stamp["prompts"]["asked"]
    kept = f"; {checkpoint} kept for --resume" if done < asked else ""
    err_console.print(
        f"wrote {out} ({done} of {asked} prompts, {stamp['cpu_seconds_per_prompt']:g} CPU-s each{kept}; read "
        f"through it with `score --lens jacobian:{out}`)",
        highlight=False,
    )


def _prompt_done(status: Any, done: int, total: int, each: float) -> None:
    """Progress: the status line on a terminal, a plain line per prompt in a log."""
    line = f"J-lens prompt {done}/{total}: {each:.0f} s each, ~{each * (total - done) / 60:.0f} min to go"
    if err_console.is_terminal:
        status.update(line)
    else:
        err_console.print(line, highlight=False, markup=False)


@contextlib.contextmanager
def stopped_says(checkpoint: Path, unit: str) -> Iterator[None]:
    """A fit stopped by SIGTERM or Ctrl-C says what it kept — its checkpoint, and how far it got — and the line
    that goes on from it, then exits 143 (SIGTERM) or 130."""
    from depthlens.cli.app import Terminated, continue_command

    try:
        yield
    except (Terminated, KeyboardInterrupt) as exc:
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        if checkpoint.exists():
            err_console.print(
                f"{what}: the fit's checkpoint is kept in {checkpoint} ({_progress(checkpoint, unit)})",
                highlight=False,
                markup=False,
            )
            err_console.print(
                f"continue with: {continue_command(sys.argv)}", highlight=False, markup=False, soft_wrap=True
            )
        else:
            err_console.print(f"{what} before the fit's first checkpoint: nothing was kept", highlight=False)
        sys.exit(143 if isinstance(exc, Terminated) else 130)


def _progress(checkpoint: Path, unit: str) -> str:
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    done = state.get("n_done", state.get("step"))
    return f"{done} {unit} done"


def print_kl(stamp: dict) -> None:
    """The stamp's held-out KL(p_L ‖ p_l) per layer, the logit lens against the fitted one (the tuned-lens
    paper's figure)."""
    kl = stamp["heldout_kl"]
    fitted = next(k for k in kl if k != "logit")
    table = Table(title=f"held-out KL(p_L ‖ p_l), nats — {stamp['model']}", title_justify="left")
    for column in ("layer", "logit lens", f"{fitted} lens"):
        table.add_column(column, justify="right")
    for layer, (a, b) in enumerate(zip(kl["logit"], kl[fitted], strict=True), start=1):
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
