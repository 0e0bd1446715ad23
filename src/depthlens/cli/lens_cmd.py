"""``depthlens lens …``: fit a tuned lens for a model, and compare the lenses and settling rules on the same
responses (docs/definitions.md §1–2, issue 43)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from depthlens.cli import options as opt
from depthlens.cli import specs
from depthlens.cli.app import app, console, err_console, load_model
from depthlens.config import LensFitConfig, ModelSpec
from depthlens.models.catalogue import DEFAULT_MODEL

lens_app = typer.Typer(
    help="The tuned lens: fit one for a model; compare lenses and settling rules (docs/definitions.md §1–2).",
    no_args_is_help=True,
)
app.add_typer(lens_app, name="lens", short_help="Fit a tuned lens; compare lenses and settling rules.")

LensOut = Annotated[
    Path, typer.Option("--out", help="The lens folder written (translators + lens.json stamp).")
]
FitIn = Annotated[
    Path | None,
    typer.Option(
        "--in",
        help="Records (JSONL) or a sample store whose completions are read; default: the Python stdlib's docstrings.",
    ),
]
MaxTokens = Annotated[int, typer.Option("--max-tokens", help="Token positions read, held-out ones included.")]
Steps = Annotated[int, typer.Option("--steps", help="KL steps (Adam) after the least-squares start.")]
MaxSeconds = Annotated[
    float, typer.Option("--max-seconds", help="Wall-time bound of the KL steps (resumable).")
]
Lr = Annotated[float, typer.Option("--lr", help="Adam's learning rate.")]
Heldout = Annotated[
    float, typer.Option("--heldout", help="Share of the sequences kept apart for the held-out KL.")
]
Resume = Annotated[bool, typer.Option("--resume", help="Go on from the lens folder's checkpoint.")]
BatchTokens = Annotated[int, typer.Option("--batch-tokens", help="Token positions per KL step.")]
LayersPerStep = Annotated[
    int, typer.Option("--layers-per-step", help="Layers (drawn at random) per KL step.")
]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the held-out split and the minibatches.")]


@lens_app.command("fit", short_help="Fit a tuned lens (per-layer affine translators) for a model.")
def fit(
    out: LensOut,
    model: opt.Model = DEFAULT_MODEL,
    in_path: FitIn = None,
    max_tokens: MaxTokens = LensFitConfig.max_tokens,
    steps: Steps = LensFitConfig.steps,
    max_seconds: MaxSeconds = LensFitConfig.max_seconds,
    lr: Lr = LensFitConfig.lr,
    heldout: Heldout = LensFitConfig.heldout,
    batch_tokens: BatchTokens = LensFitConfig.batch_tokens,
    layers_per_step: LayersPerStep = LensFitConfig.layers_per_step,
    seed: Seed = LensFitConfig.seed,
    resume: Resume = False,
    device: opt.Device = ModelSpec.device,
    dtype: opt.DType = ModelSpec.dtype,
    trust_remote_code: opt.TrustRemoteCode = ModelSpec.trust_remote_code,
) -> None:
    """Fit a tuned lens: the least-squares map of each layer's state onto the last one's, then KL(p_L ‖ p_l) steps.

    Writes OUT/translators.safetensors and OUT/lens.json (the model's fingerprint, L, d, the data, token counts,
    steps, held-out KL per layer for the logit and the tuned lens). Read through it with
    `depthlens score --lens tuned:OUT`.
    """
    from depthlens.errors import InputError
    from depthlens.studies.lens_fit import fit_lens, lens_sequences

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
    lm = load_model(specs.model_spec(locals()))
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
    err_console.print(
        f"wrote {out} ({stamp['steps']} KL steps; read through it with `score --lens tuned:{out}`)"
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
