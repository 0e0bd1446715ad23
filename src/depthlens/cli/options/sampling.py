"""Sampling a store: the task, the sampler, what is read out while sampling, and how answers are read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from depthlens.cli.options.base import finite
from depthlens.config import GenerateRun, OnlineConfig, TaskSpec

__all__ = [
    "AnswerFallbackOpt", "AnswerTypeOpt", "Data", "GenBatch", "MaxNew", "MinP", "Pool", "PromptStyleOpt", "Questions",
    "ReadoutTokens", "RegradeFallback", "Seed", "Task", "TaskConfig", "TaskSeed", "Temperature", "ThinknBatch",
    "ThinknPool", "ThinknReadoutTokens", "TopKSampling", "TopP",
]  # fmt: skip

Task = Annotated[
    str,
    typer.Option(
        "--task",
        help="reasoning_gym:<dataset>, aime2024, aime2025, hmmt_feb2025, gpqa_diamond, or a .jsonl file.",
    ),
]
Data = Annotated[
    Path | None,
    typer.Option("--data", dir_okay=False, help="Local JSONL for a hub task (same columns), offline."),
]
Questions = Annotated[
    int | None,
    typer.Option(
        "--questions",
        min=1,
        help=f"How many questions (default {TaskSpec.GENERATED} of a reasoning-gym task; of a hub or .jsonl "
        "task, all).",
    ),
]
TaskSeed = Annotated[int, typer.Option("--task-seed", help="Seed of generated tasks (reasoning-gym).")]
TaskConfig = Annotated[
    str | None,
    typer.Option("--task-config", help="reasoning-gym generator settings, e.g. 'max_terms=3,max_digits=2'."),
]
Pool = Annotated[int, typer.Option("--pool", min=1, help="Responses sampled per question.")]
ThinknPool = Annotated[
    int | None, typer.Option("--pool", min=1, help="Responses sampled per question (default 2·n).")
]
Seed = Annotated[int, typer.Option("--seed", help="Seeds every response's sampler and the trials' draws.")]
Temperature = Annotated[
    float,
    typer.Option("--temperature", callback=finite, help="Sampling temperature; 0 = greedy."),
]
TopP = Annotated[float, typer.Option("--top-p", callback=finite, help="Nucleus mass, in (0, 1].")]
TopKSampling = Annotated[
    int, typer.Option("--top-k", min=0, help="Sample among the k most probable tokens; 0 = off.")
]
MinP = Annotated[
    float,
    typer.Option(
        "--min-p",
        callback=finite,
        help="Drop tokens below min-p × the top token's probability, in [0, 1); 0 = off.",
    ),
]
MaxNew = Annotated[int, typer.Option("--max-new-tokens", min=1, help="Most tokens generated per response.")]
ReadoutTokens = Annotated[
    str,
    typer.Option(
        "--readout-tokens",
        help="Leading generated tokens read out at every layer in the generation pass: N or 'all'.",
    ),
]
ThinknReadoutTokens = Annotated[
    str | None,
    typer.Option(
        "--readout-tokens",
        help="Leading generated tokens read out at every layer in the generation pass: N or 'all' "
        "(default: the prefix; 'all' with --ablation).",
    ),
]
GenBatch = Annotated[int, typer.Option("--batch-size", min=1, help="Responses sampled together.")]
ThinknBatch = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        min=1,
        help=f"Responses sampled together (default {GenerateRun.batch_size}; online: {OnlineConfig.batch_size}).",
    ),
]

# How answers are asked for, read and graded (docs/definitions.md §5): generate, thinkn and regrade.
PromptStyleOpt = Annotated[
    str,
    typer.Option(
        "--prompt-style",
        help="paper: the paper's prompts (\\boxed{}); native: reasoning-gym's own system prompt with <answer> "
        "tags, graded by the dataset's score_answer (reasoning_gym tasks only).",
    ),
]
AnswerTypeOpt = Annotated[
    str | None,
    typer.Option(
        "--answer-type",
        help="Override the task's answer type: number, expression, string, list or letter "
        "(default: the task's own; `depthlens tasks` shows it).",
    ),
]
AnswerFallbackOpt = Annotated[
    str,
    typer.Option(
        "--answer-fallback",
        help="none: only stated answers (box, 'the answer is', tags) count; last-number: a numeric task's "
        "response that ended by itself may also answer with its last number; final-result: with a result it "
        "states in its own words ('so, x is 7') or else the number ending its last equation ('10 + 8 = 18').",
    ),
]
RegradeFallback = Annotated[
    str | None,
    typer.Option(
        "--answer-fallback",
        help="none, last-number or final-result (default: the store's own; a store from before the answer "
        "rules: none).",
    ),
]
