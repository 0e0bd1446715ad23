"""``depthlens lens …``: fitting a tuned lens (``lens fit``, its defaults ``config.LensFitConfig``'s) and comparing
lenses and settling rules (``lens compare``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "CompareOut", "CompareSamples", "CompareStores", "FitBatchTokens", "FitHeldout", "FitIn", "FitLayersPerStep",
    "FitLr", "FitMaxSeconds", "FitMaxTokens", "FitResume", "FitSeed", "FitSteps", "LensOut",
]  # fmt: skip

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
FitMaxTokens = Annotated[
    int, typer.Option("--max-tokens", help="Token positions read, held-out ones included.")
]
FitSteps = Annotated[int, typer.Option("--steps", help="KL steps (Adam) after the least-squares start.")]
FitMaxSeconds = Annotated[
    float, typer.Option("--max-seconds", help="Wall-time bound of the KL steps (resumable).")
]
FitLr = Annotated[float, typer.Option("--lr", help="Adam's learning rate.")]
FitHeldout = Annotated[
    float, typer.Option("--heldout", help="Share of the sequences kept apart for the held-out KL.")
]
FitResume = Annotated[bool, typer.Option("--resume", help="Go on from the lens folder's checkpoint.")]
FitBatchTokens = Annotated[int, typer.Option("--batch-tokens", help="Token positions per KL step.")]
FitLayersPerStep = Annotated[
    int, typer.Option("--layers-per-step", help="Layers (drawn at random) per KL step.")
]
FitSeed = Annotated[int, typer.Option("--seed", help="Seed of the held-out split and the minibatches.")]

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
