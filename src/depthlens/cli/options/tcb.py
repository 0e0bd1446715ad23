"""The Token Constraint Bound studies (``depthlens tcb …``): each study's own settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from depthlens.cli.options.base import finite
from depthlens.config.base import MOST_QUESTIONS
from depthlens.config.sampling import MOST_NEW_TOKENS

__all__ = [
    "Cluster", "Disperse", "Factor", "MaxPerplexity", "Shots", "Split", "StudyOverwrite", "StudyResume",
    "TcbMaxNew", "TcbOut", "TcbQuestions", "TcbTask", "Templates", "TopK", "TraceChat", "TracePrompt", "Window",
]  # fmt: skip

TcbOut = Annotated[Path, typer.Option("--out", file_okay=False, help="Directory for the table and figure.")]
StudyResume = Annotated[
    bool, typer.Option("--resume", help="Continue an interrupted study in the same --out.")
]
StudyOverwrite = Annotated[
    bool, typer.Option("--overwrite", help="Start the study again in an existing --out.")
]
Split = Annotated[
    float,
    typer.Option("--split", callback=finite, help="Also pool all prompts split at this measured V_eff."),
]
TopK = Annotated[int, typer.Option("--top-k", min=2, help="Competing tokens moved (most probable).")]
Cluster = Annotated[
    float, typer.Option("--cluster", callback=finite, help="α < 1: rows pulled toward the centroid.")
]
Disperse = Annotated[float, typer.Option("--disperse", callback=finite, help="α > 1: rows pushed away.")]
TcbTask = Annotated[str, typer.Option("--task", help="An offline reasoning-gym task.")]
TcbQuestions = Annotated[
    int, typer.Option("--questions", min=1, max=MOST_QUESTIONS, help="How many of its questions.")
]
Shots = Annotated[str, typer.Option("--shots", help="Comma-separated numbers of worked examples.")]
Templates = Annotated[str | None, typer.Option("--templates", help="Subset of bare,paper,terse,expert.")]
TcbMaxNew = Annotated[
    int, typer.Option("--max-new-tokens", min=1, max=MOST_NEW_TOKENS, help="Most tokens generated (greedy).")
]
TracePrompt = Annotated[str, typer.Option("--prompt", help="The user message to answer.")]
Window = Annotated[int, typer.Option("--window", min=1, help="Tokens of history for the median.")]
Factor = Annotated[float, typer.Option("--factor", callback=finite, help="Drop: δ ≤ median / factor.")]
MaxPerplexity = Annotated[
    float, typer.Option("--max-perplexity", callback=finite, help="...while perplexity ≤ this.")
]
TraceChat = Annotated[bool, typer.Option("--chat/--plain", help="Use the chat template when there is one.")]
