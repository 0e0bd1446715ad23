"""Computed, not measured: GPU memory of the deep-thinking paper's models with the in-engine readout, against the
old re-scoring path's second (transformers) copy, and whether each fits on 1 / 2 / 8 H100s (80 GB).

    python benchmarks/paper_models_memory.py --out docs/benchmarks/paper_models_memory.json

Shapes are the models' public configs (written out below: the Hub is not reachable from this machine). Per GPU
at tensor parallelism t:
- engine weights: the checkpoint as vLLM holds it (bfloat16; GPT-OSS's experts in MXFP4, as shipped) / t;
- the readout's own memory (in-engine): the captured residual stream [L − 1, tokens per step, d] bfloat16 (the
  auxiliary hidden states are outputs of the forward, for every token of a step; vLLM's default of 8,192
  batched tokens on a GPU) plus the lens's working set ([rows, V] float32, --memory-mb, default 512 MiB);
- the old path's extra: a transformers copy of the whole model in bfloat16 on one GPU (GPT-OSS's MXFP4 experts
  dequantized to bfloat16, transformers' path without the triton kernels), which tensor parallelism does not
  split;
- fits: weights + readout ≤ 90 % of 80 GB (vLLM's default --gpu-memory-utilization) with ≥ 4 GB left for the KV
  cache. The old path fits only where the engine does and the copy fits on a GPU beside the engine's shard.
"""

from __future__ import annotations

import argparse
import json

GB = 1e9
H100 = 80 * GB
SHARE = 0.9
KV_FLOOR = 4 * GB
STEP_TOKENS = 8192
LENS_BYTES = 512 * 2**20

# (layers, hidden, vocab, total parameters, bytes of the checkpoint as vLLM loads it)
MODELS = {
    # Llama-3.3-70B shapes: L 80, d 8,192, V 128,256; 70.6 B parameters in bfloat16
    "DeepSeek-R1-Distill-Llama-70B": (80, 8192, 128256, 70.6e9, 70.6e9 * 2),
    # Qwen3 MoE: L 48, d 2,048, V 151,936, 128 experts (8 active); 30.5 B parameters in bfloat16
    "Qwen3-30B-A3B-Thinking-2507": (48, 2048, 151936, 30.5e9, 30.5e9 * 2),
    # GPT-OSS: L 24, d 2,880, V 201,088, 32 experts (4 active); 20.9 B parameters, experts MXFP4 (~13 GB shipped)
    "GPT-OSS-20B": (24, 2880, 201088, 20.9e9, 13.8e9),
    # GPT-OSS: L 36, d 2,880, V 201,088, 128 experts (4 active); 116.8 B parameters, experts MXFP4 (~65 GB)
    "GPT-OSS-120B": (36, 2880, 201088, 116.8e9, 65.3e9),
}


def row(name: str, shapes: tuple) -> dict:
    layers, hidden, vocab, params, weights = shapes
    capture = (layers - 1) * STEP_TOKENS * hidden * 2
    readout = capture + LENS_BYTES
    copy = params * 2  # the old path's transformers copy, bfloat16
    out = {
        "model": name,
        "engine_weights_gb": round(weights / GB, 1),
        "in_engine_readout_gb": round(readout / GB, 2),
        "old_copy_gb": round(copy / GB, 1),
        "float32_lens_head_gb": round(vocab * hidden * 4 / GB, 2),
    }
    for gpus in (1, 2, 8):
        engine = weights / gpus + readout
        fits = engine + KV_FLOOR <= SHARE * H100
        out[f"fits_{gpus}"] = fits
        out[f"old_fits_{gpus}"] = fits and engine + copy + KV_FLOOR <= SHARE * H100
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = [row(name, shapes) for name, shapes in MODELS.items()]
    for r in rows:
        print(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"computed_not_measured": True, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
