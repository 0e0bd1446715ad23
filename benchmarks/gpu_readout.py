"""The readout kernel at real model shapes on a GPU (issue 6, item 5): tokens/s and the fraction of the bf16
matmul roofline, for the bare unembedding products, the eager readout and the compiled (fused) one.

Random weights and hidden states of the real shapes stand in for the model (no download; only the readout is
timed — it is the same arithmetic whatever the weights). Runs on CPU too (same code path, the compiled kernel
through Inductor's C++ backend), e.g. with ``--shape tiny`` to check it.

    python benchmarks/gpu_readout.py --shape qwen3-8b --tokens 512 --out docs/benchmarks/gpu_readout.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from torch import nn

SHAPES = {  # layers, d_model, vocab
    "qwen3-8b": (36, 4096, 151_936),
    "gpt-oss-20b": (24, 2880, 201_088),
    "tiny": (4, 64, 1000),
}
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense, SXM datasheets


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up (and compilation)
    _sync(device)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def measure(shape: str, tokens: int, dtype: str = "bfloat16", repeats: int = 3) -> dict:
    """The bare unembedding products, the eager and the compiled readout of one chunk of ``tokens`` tokens at the
    real ``shape`` on whatever device there is: times, tokens/s, TFLOPS and the share of the bf16 peak."""
    from depthlens.metrics.token_table import chunk_divergences
    from depthlens.models.adapters import ModelParts
    from depthlens.models.load import LoadedModel
    from depthlens.readout.lens import LogitLens
    from depthlens.readout.stream import rows_chunk

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n_layers, d, vocab = SHAPES[shape]
    torch.manual_seed(0)
    holder = nn.Module()
    holder.norm = nn.RMSNorm(d, eps=1e-6).to(device, getattr(torch, dtype))
    holder.unembed = nn.Linear(d, vocab, bias=False).to(device, getattr(torch, dtype))
    nn.init.normal_(holder.unembed.weight, std=d**-0.5)
    parts = ModelParts(nn.ModuleList([nn.Identity()] * n_layers), holder.norm, holder.unembed, None, True)
    lm = LoadedModel(model=holder, tokenizer=None, parts=parts, name=shape)
    lens = LogitLens(parts)
    c = tokens
    hidden = [
        torch.randn(c, d, device=device, dtype=getattr(torch, dtype)) * (1 + i / n_layers)
        for i in range(n_layers + 1)
    ]
    hidden[-1] = holder.norm(hidden[-1])  # the model's last state arrives normed
    with torch.inference_mode():
        logits = holder.unembed(hidden[-1])
        chunk = rows_chunk(lm, lens, hidden, logits, torch.zeros(c, dtype=torch.long, device=device))
        normed = [lens.normed(h) for h in hidden[1:-1]]
        weight = holder.unembed.weight

        def matmul() -> None:
            for x in normed:
                x @ weight.T

        times = {
            "matmul (bare unembedding)": _timed(matmul, device, repeats),
            "readout, eager": _timed(lambda: chunk_divergences(chunk, "jsd"), device, repeats),
            "readout, compiled": _timed(
                lambda: chunk_divergences(chunk, "jsd", compiled=True), device, repeats
            ),
        }
        eager = chunk_divergences(chunk, "jsd")
        fused = chunk_divergences(chunk, "jsd", compiled=True)
    flops = 2.0 * (n_layers - 1) * vocab * d * c
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    rows = []
    for what, seconds in times.items():
        achieved = flops / seconds / 1e12
        rows.append(
            {
                "path": what,
                "seconds": seconds,
                "tokens_per_s": c / seconds,
                "tflops": achieved,
                "roofline_fraction": achieved / peak if peak else None,
                "vs_matmul": seconds / times["matmul (bare unembedding)"],
            }
        )
    return {
        "device": name,
        "shape": shape,
        "layers": n_layers,
        "d_model": d,
        "vocab": vocab,
        "tokens": c,
        "dtype": dtype,
        "max_abs_diff_compiled_vs_eager": float((fused - eager).abs().max()),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    parser.add_argument("--tokens", type=int, default=512, help="tokens in the readout chunk")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = measure(args.shape, args.tokens, args.dtype, args.repeats)
    for row in result["rows"]:
        peak = (
            f", {100 * row['roofline_fraction']:.0f} % of the bf16 peak" if row["roofline_fraction"] else ""
        )
        print(
            f"{row['path']:>28}: {row['tokens_per_s']:>10.0f} tok/s, {row['tflops']:7.1f} TFLOPS{peak}, "
            f"{row['vs_matmul']:.2f}× the matmul"
        )
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
