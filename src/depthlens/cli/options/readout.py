"""How the layers are read out and scored: divergence, DTR, TCB, the readout's budget; score's and heatmap's own."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from depthlens.cli.options.base import finite
from depthlens.config import ReadoutConfig

__all__ = [
    "AlsoDivergences", "Chat", "CompileOpt", "Completion", "DeepRuleOpt", "DivergenceOpt", "Epsilon", "FigureOut",
    "FinalNorm", "G", "HeatmapLayerTarget", "HeatmapPrompt", "LayerEntropy", "LayerTarget", "LayerTopK", "LensOpt",
    "MemoryMB", "Prefix", "Rho", "ScoreBatch", "SettleOpt", "Spectral", "StoreDeepRule", "StoreDivergence", "StoreG",
    "StoreLens", "StoreRho", "StoreSettle", "Tcb", "TcbExact", "Token", "Tokens", "Track", "VEffOpt",
]  # fmt: skip

LensOpt = Annotated[
    str,
    typer.Option(
        "--lens",
        help="logit (the final norm and unembedding as they are), tuned:PATH (a `depthlens lens fit` folder or a "
        "tuned-lens package folder) or jacobian:PATH (a J-lens .pt artifact).",
    ),
]
StoreLens = Annotated[
    str | None,
    typer.Option(
        "--lens",
        help="logit, tuned:PATH (a tuned-lens folder) or jacobian:PATH (a J-lens .pt) for a new pool (default "
        "logit); with --from, the store's own.",
    ),
]
SettleOpt = Annotated[
    str,
    typer.Option(
        "--settle",
        help="jsd: cumulative-minimum divergence ≤ g; topk:K: top-K set equal to the final layer's from there on "
        "(a sampled pool keeps each layer's top-K ids to settle from: --layer-top-k K).",
    ),
]
G = Annotated[
    float,
    typer.Option("--g", callback=finite, help="Settling threshold on the cumulative-minimum divergence."),
]
Rho = Annotated[float, typer.Option("--rho", callback=finite, help="Deep-regime depth fraction, in (0, 1].")]
Prefix = Annotated[
    int | None, typer.Option("--prefix", min=1, help="Also report dtr_prefix over the first N tokens.")
]
DivergenceOpt = Annotated[str, typer.Option("--divergence", help="jsd (bits), jsd-nat, kl or cosine.")]
AlsoDivergences = Annotated[
    str,
    typer.Option(
        "--also-divergences",
        help="Further divergences stored beside --divergence, same pass, e.g. 'kl,cosine' (correlation study).",
    ),
]
LayerTopK = Annotated[
    int,
    typer.Option(
        "--layer-top-k",
        help="Also keep each read-out token's K most probable tokens at every layer, with their probabilities "
        "(layer_top_ids / layer_top_probs: the logit lens's own predictions); 1..100, 0 = none.",
    ),
]
LayerTarget = Annotated[
    bool,
    typer.Option(
        "--layer-target",
        help="Also keep the target trajectory: each read-out token's own log-probability and rank (0 = most "
        "probable) at every layer (layer_target_logprobs / layer_target_ranks: the logit lens's classic plot).",
    ),
]
Track = Annotated[
    str,
    typer.Option(
        "--track",
        metavar="ID,…",
        help="Token ids followed through every layer for every read-out token, comma-separated, e.g. 791,1462 "
        "(layer_track_logprobs / layer_track_ranks, in this order); at most 100, each below the vocabulary.",
    ),
]
LayerEntropy = Annotated[
    bool,
    typer.Option("--layer-entropy", help="Also keep each layer's entropy in nats (layer_entropy)."),
]
DeepRuleOpt = Annotated[str, typer.Option("--deep-rule", help="spec: c ≥ ⌈ρL⌉; paper-literal: c ≥ ⌈(1−ρ)L⌉.")]
# A stored pool's own DTR settings, overridden where given (thinkn).
StoreSettle = Annotated[
    str | None,
    typer.Option(
        "--settle",
        help="jsd or topk:K (default: the store's rule; a store read under topk:K must hold each layer's top-K "
        "ids, which a pool sampled under it keeps).",
    ),
]
StoreG = Annotated[
    float | None, typer.Option("--g", callback=finite, help="Settling threshold (default: the store's).")
]
StoreRho = Annotated[
    float | None,
    typer.Option("--rho", callback=finite, help="Deep-regime fraction (default: the store's)."),
]
StoreDeepRule = Annotated[str | None, typer.Option("--deep-rule", help="spec or paper-literal.")]
StoreDivergence = Annotated[
    str | None,
    typer.Option(
        "--divergence", help=f"jsd (bits), jsd-nat, kl or cosine (default {ReadoutConfig.divergence})."
    ),
]
MemoryMB = Annotated[
    int | None,
    typer.Option(
        "--memory-mb",
        min=16,
        show_default="fit the device",
        help="Working-memory budget of the readout in MB (default: 512 on a CPU, a quarter of the free GPU memory "
        "up to 16 GiB).",
    ),
]
FinalNorm = Annotated[
    bool, typer.Option("--final-norm/--no-final-norm", help="Apply the final norm before unembedding.")
]
CompileOpt = Annotated[
    str,
    typer.Option(
        "--compile",
        help="auto (fused compiled kernel on CUDA), on (also on CPU: ~20 s to compile, then matmul-bound), off.",
    ),
]
Epsilon = Annotated[float, typer.Option("--epsilon", callback=finite, help="ε in δ_TCB = ε / ‖J‖_F.")]
VEffOpt = Annotated[str, typer.Option("--v-eff", help="ipr: 1/Σo²; exp-entropy: exp H(o).")]

# `depthlens score`
ScoreBatch = Annotated[int, typer.Option("--batch-size", min=1, help="Records per forward pass.")]
Tokens = Annotated[
    bool, typer.Option("--tokens", help="Also write per-token tokens, settling, deep flags, divergences.")
]
Tcb = Annotated[
    bool, typer.Option("--tcb/--no-tcb", help="Token Constraint Bound fields (docs/definitions.md §6).")
]
Spectral = Annotated[bool, typer.Option("--spectral", help="Also the spectral-norm δ (power iteration).")]
TcbExact = Annotated[
    bool, typer.Option("--tcb-exact", help="δ_TCB in float64, the reference (default float32, within 1e-4).")
]

# `depthlens heatmap`
Completion = Annotated[
    str, typer.Option("--completion", help="The generated text whose tokens are read out.")
]
HeatmapPrompt = Annotated[str, typer.Option("--prompt", help="The text before the completion (not scored).")]
Chat = Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the model's chat template.")]
Token = Annotated[
    int | None,
    typer.Option("--token", help="Token index for Figure 3 (default: the deepest-settling one)."),
]
HeatmapLayerTarget = Annotated[
    bool,
    typer.Option(
        "--layer-target/--no-layer-target",
        help="Read the target trajectory too (the read-out token's probability and rank at every layer) and draw "
        "it (trajectory.png); one text costs a few percent more.",
    ),
]
FigureOut = Annotated[Path, typer.Option("--out", file_okay=False, help="Directory for the figures.")]
