"""``depthlens lens …``: fitting a tuned or a Jacobian lens (``lens fit``, its defaults ``config.LensFitConfig``'s
and ``config.JacobianFitConfig``'s: an option of the other kind is refused, so its default is the kind's) and
comparing lenses and settling rules (``lens compare``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from depthlens.config import JacobianFitConfig, LensFitConfig

__all__ = [
    "CompareOut", "CompareSamples", "CompareStores", "FitBatchTokens", "FitHeldout", "FitHeldoutPrompts", "FitIn",
    "FitKind", "FitLayersPerStep", "FitLensDType", "FitLr", "FitMaxSeconds", "FitMaxTokens", "FitMemoryMb",
    "FitPromptTokens", "FitPrompts", "FitResume", "FitSeed", "FitSteps", "LensOut",
]  # fmt: skip

J = JacobianFitConfig
T = LensFitConfig

LensOut = Annotated[
    Path,
    typer.Option(
        "--out", help="The lens written: a folder (tuned: translators + lens.json) or a .pt file (jacobian)."
    ),
]
FitKind = Annotated[
    str,
    typer.Option(
        "--kind",
        help="tuned (per-layer affine translators, Belrose et al. 2023) or jacobian (the J-lens, Gurnee et al. "
        "2026: the SPEC's estimator, d backward passes per prompt).",
    ),
]
FitIn = Annotated[
    Path | None,
    typer.Option(
        "--in",
        help="Records (JSONL) or a sample store whose texts are read; default: the Python stdlib's docstrings.",
    ),
]
FitMaxTokens = Annotated[
    int | None,
    typer.Option(
        "--max-tokens", help=f"tuned: token positions read, held-out ones included [{T.max_tokens}]."
    ),
]
FitSteps = Annotated[
    int | None,
    typer.Option("--steps", help=f"tuned: KL steps (Adam) after the least-squares start [{T.steps}]."),
]
FitMaxSeconds = Annotated[
    float | None,
    typer.Option(
        "--max-seconds",
        help=f"Wall-time bound, resumable: tuned, of the KL steps [{T.max_seconds:g}]; jacobian, of the "
        f"prompts [{J.max_seconds:g}].",
    ),
]
FitLr = Annotated[float | None, typer.Option("--lr", help=f"tuned: Adam's learning rate [{T.lr:g}].")]
FitHeldout = Annotated[
    float | None,
    typer.Option(
        "--heldout", help=f"tuned: share of the sequences kept apart for the held-out KL [{T.heldout}]."
    ),
]
FitResume = Annotated[bool, typer.Option("--resume", help="Go on from the lens's checkpoint.")]
FitBatchTokens = Annotated[
    int | None, typer.Option("--batch-tokens", help=f"tuned: token positions per KL step [{T.batch_tokens}].")
]
FitLayersPerStep = Annotated[
    int | None,
    typer.Option(
        "--layers-per-step", help=f"tuned: layers (drawn at random) per KL step [{T.layers_per_step}]."
    ),
]
FitSeed = Annotated[
    int | None,
    typer.Option(
        "--seed", help="Seed: tuned, of the held-out split and minibatches; jacobian, of the windows [0]."
    ),
]
FitPrompts = Annotated[
    int | None, typer.Option("--prompts", help=f"jacobian: prompts averaged into J [{J.prompts}].")
]
FitPromptTokens = Annotated[
    int | None,
    typer.Option(
        "--prompt-tokens", help=f"jacobian: each prompt's length in tokens (> 17) [{J.max_tokens}]."
    ),
]
FitHeldoutPrompts = Annotated[
    int | None,
    typer.Option(
        "--heldout-prompts", help=f"jacobian: prompts kept apart for the held-out KL [{J.heldout}]."
    ),
]
FitMemoryMb = Annotated[
    int | None,
    typer.Option(
        "--memory-mb",
        help=f"jacobian: the backward's working memory; sets the cotangents per backward [{J.memory_mb}].",
    ),
]
FitLensDType = Annotated[
    str | None,
    typer.Option(
        "--lens-dtype",
        help=f"jacobian: the artifact's matrices, float16 (as published) or float32 [{J.dtype}].",
    ),
]

CompareStores = Annotated[
    list[Path], typer.Argument(help="Score stores of the same responses, one per lens or rule.")
]
CompareSamples = Annotated[
    Path | None,
    typer.Option(
        "--samples", help="The sample store the responses came from: adds DTR's correlation with accuracy."
    ),
]
CompareOut = Annotated[
    Path | None,
    typer.Option("--out", help="Folder for lens_compare.json / .png (default: beside the first store)."),
]
