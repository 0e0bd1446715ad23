"""Voting over stored pools (thinkn), online Think@n, and the correlation study (correlate, report)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from depthlens.cli.options.base import finite

__all__ = [
    "GKL",
    "Ablation",
    "Bins",
    "Bootstrap",
    "Consensus",
    "DeepconfWindow",
    "Eta",
    "FromStore",
    "GCos",
    "MaxN",
    "Methods",
    "N",
    "NPerQ",
    "Online",
    "PrefixOpt",
    "Seeds",
    "SignalOpt",
    "Sweep",
    "Sweeps",
    "ThinknN",
    "TieBreakOpt",
    "Trials",
    "Warmup",
]  # fmt: skip

N = Annotated[int, typer.Option("--n", min=1, help="Responses drawn per question per trial.")]
ThinknN = Annotated[
    int | None,
    typer.Option(
        "--n",
        min=1,
        help="Responses drawn per question per trial (default 16; from a smaller stored pool, its size).",
    ),
]
Eta = Annotated[
    float,
    typer.Option("--eta", callback=finite, help="Share of n kept by the selecting methods, in (0, 1]."),
]
PrefixOpt = Annotated[str, typer.Option("--prefix", help="ℓ_prefix in tokens, or 'full'.")]
Trials = Annotated[int, typer.Option("--trials", min=1, help="Resamplings of n from each pool.")]
Methods = Annotated[
    str | None,
    typer.Option(
        "--methods", help="Comma-separated subset, or 'all' to print every DeepConf variant (default: all)."
    ),
]
Ablation = Annotated[
    bool, typer.Option("--ablation", help="Also Think@n over ℓ_prefix ∈ {50,100,500,full} × η.")
]
FromStore = Annotated[
    Path | None, typer.Option("--from", file_okay=False, help="Re-summarise this store; generate nothing.")
]
DeepconfWindow = Annotated[
    int, typer.Option("--deepconf-window", help="DeepConf's group size in tokens (their code's default).")
]

# Online Think@n (`thinkn --online`).
Online = Annotated[
    bool,
    typer.Option(
        "--online",
        help="Online Think@n (docs/architecture.md): warm-up sets τ, later responses stop early, "
        "sampling stops at consensus.",
    ),
]
TieBreakOpt = Annotated[
    str,
    typer.Option(
        "--tie-break",
        help="A vote tied at the top: uniform (the share of right answers among the tied) or summed-dtr "
        "(the highest summed prefix DTR wins). DeepConf's rows keep the first seen.",
    ),
]
SignalOpt = Annotated[
    str, typer.Option("--signal", help="Online signal: dtr (prefix DTR) or confidence (DeepConf's peer).")
]
Warmup = Annotated[
    int, typer.Option("--warmup", help="Online: responses per question generated in full first.")
]
MaxN = Annotated[int, typer.Option("--max-n", help="Online: most responses started per question.")]
Consensus = Annotated[
    float,
    typer.Option("--consensus", help="Online: stop once the leading answer holds this share, (0.5, 1]."),
]
Sweep = Annotated[
    bool, typer.Option("--sweep", help="With --online --from: accuracy vs tokens over budgets, CSV + figure.")
]

# The correlation study (correlate, report).
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
        "--g-kl", callback=finite, help="Settling threshold for the KL DTR (default: matched to JSD's)."
    ),
]
GCos = Annotated[
    float | None,
    typer.Option(
        "--g-cosine", callback=finite, help="Settling threshold for the cosine DTR (default: matched)."
    ),
]
Sweeps = Annotated[bool, typer.Option("--sweeps/--no-sweeps", help="Also the g/ρ/prefix/kind sweeps.")]
