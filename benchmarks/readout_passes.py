"""How many passes over vocabulary-wide tensors the readout makes, counted, not timed (issue 60, items 1, 3, 4): the
CPU measure that moves with what a GPU pays for each pass.

Counted by PyTorch's dispatcher (tests/passes.py: an op that reads or writes a tensor of at least c·V/2 elements,
views and indexed reads apart), on the CPU proxy's shape (a Qwen3 config, d = 256, V = 32,768, random weights):
- the eager walk of one chunk per layer, each layer's top-K for K = 0 / 5 / 20;
- δ_TCB of one chunk (``token_constraint_terms``), with and without the readout's final log-probs where the tree
  takes them;
- ``score --tokens`` of one record: every operator, the vocabulary-wide ones, and host transfers, per chunk;
- with ``--compiled``, the kernels Inductor generates for the fused block, K = 0 and K = 5 (a minute of C++
  compilation each on a CPU).
Runs against any depthlens tree on PYTHONPATH, so before and after are two runs.

    OMP_NUM_THREADS=1 python benchmarks/readout_passes.py --out docs/benchmarks/readout_passes_after.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.passes

from tests.passes import WidePasses  # noqa: E402

from overhead import counted_transfers, proxy_model  # noqa: E402


def _chunk(lm: object, tokens: int) -> object:
    from depthlens.config import ReadoutConfig
    from depthlens.readout.stream import TokenSequence, iter_readout

    ids = torch.randint(3, 32_000, (tokens + 8,), generator=torch.Generator().manual_seed(1)).tolist()
    return next(iter(iter_readout(lm, [TokenSequence(ids[:8], ids[8:])], ReadoutConfig())))


def walk(chunk: object) -> dict:
    """Passes of the eager walk over one chunk, per layer, for each K."""
    from depthlens.metrics.token_table import chunk_divergence_kinds

    vocab = chunk.final.logprobs.shape[-1]
    out = {}
    for k in (0, 5, 20):
        with WidePasses(len(chunk) * vocab // 2) as passes:
            chunk_divergence_kinds(chunk, ("jsd",), 0, layer_top=k)
        out[f"k{k}"] = {
            "ops_per_layer": round(passes.ops / chunk.n_layers, 1),
            "wide_per_layer": {name: n / chunk.n_layers for name, n in sorted(passes.counts.items())},
        }
    return out


def tcb(chunk: object) -> dict:
    """Passes of δ_TCB over one chunk's final states."""
    from depthlens.metrics.tcb import Unembedding, token_constraint_terms

    unembed = Unembedding.from_lens(chunk.lens)
    norms = unembed.row_norms_sq(torch.float32)
    vocab = chunk.final.logprobs.shape[-1]
    ways = {"own product": {}}
    if "logprobs" in inspect.signature(token_constraint_terms).parameters:
        ways["readout's log-probs"] = {"logprobs": chunk.final.logprobs}
    out = {}
    for name, kw in ways.items():
        with WidePasses(len(chunk) * vocab // 2) as passes:
            token_constraint_terms(unembed, chunk.final.normed, norms, **kw)
        out[name] = {"wide": sum(passes.counts.values()), "by_op": dict(sorted(passes.counts.items()))}
    return out


def per_token_path(lm: object, tokens: int) -> dict:
    """``score --tokens`` of one record: operators, vocabulary-wide passes and host transfers per readout chunk."""
    import depthlens.metrics.token_table as token_table
    from depthlens.studies.score import score

    ids = torch.randint(3, 32_000, (tokens + 8,), generator=torch.Generator().manual_seed(2)).tolist()
    rec = [{"id": "x", "prompt_ids": ids[:8], "completion_ids": ids[8:]}]
    chunks = 0
    original = token_table.token_baselines

    def counting(*args: object) -> object:
        nonlocal chunks
        chunks += 1
        return original(*args)

    token_table.token_baselines = counting
    try:
        with WidePasses(64 * 32_768) as passes, counted_transfers() as transfers:
            score(lm, rec, tokens=True)
    finally:
        token_table.token_baselines = original
    return {
        "chunks": chunks,
        "ops_per_chunk": round(passes.ops / chunks),
        "wide_per_chunk": round(sum(passes.counts.values()) / chunks, 1),
        "host_transfers_per_chunk": round(sum(transfers.values()) / chunks, 1),
    }


def compiled_kernels(lm: object, chunk: object) -> dict:
    """Kernels Inductor generates for the fused block of layers, K = 0 and K = 5 (this tree's ``compiled_block``)."""
    from torch._inductor import metrics

    from depthlens.metrics.fused import compiled_block

    out = {}
    for k in (0, 5):
        if k and "top_k" not in inspect.signature(compiled_block).parameters:
            out[f"k{k}"] = "this tree reads each layer's top-k eagerly (no compiled block takes it)"
            continue
        metrics.reset()
        step = compiled_block(chunk.lens, ("jsd",), k) if k else compiled_block(chunk.lens, ("jsd",))
        normed = next(iter(chunk.normed_blocks(4 * len(chunk))))[1]
        step(normed, chunk.final.logprobs)
        out[f"k{k}"] = {"generated_kernels": metrics.generated_kernel_count}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--compiled", action="store_true", help="also count the compiled block's kernels")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import depthlens
    from depthlens.models.load import wrap

    lm = wrap(proxy_model(layers=8), name="qwen3-proxy")
    chunk = _chunk(lm, args.tokens)
    result = {
        "depthlens": str(Path(depthlens.__file__).parent),
        "chunk": {"tokens": len(chunk), "layers": chunk.n_layers, "vocab": chunk.final.logprobs.shape[-1]},
        "walk": walk(chunk),
        "tcb": tcb(chunk),
        "score_tokens": per_token_path(lm, 4 * args.tokens),
    }
    if args.compiled:
        result["compiled"] = compiled_kernels(lm, chunk)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
