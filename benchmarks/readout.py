"""Scoring throughput and peak memory: depthlens's streaming readout (eager, compiled, early exit) against the
naive materialising one and two peers — tuned-lens's LogitLens in a batched pipeline, and the per-token loop.

Each (method, length) runs in a fresh subprocess so its peak resident memory is its own; "extra" memory is the
peak minus the resident size right after the model loaded. Never asserted on: numbers go to docs/performance.md.

    python benchmarks/readout.py --lengths 256 1024 4096 --methods streaming naive --out docs/benchmarks/readout.json
    pip install --target /tmp/tlpkgs --no-deps tuned-lens==0.2.0 simple-parsing flatten-dict docstring-parser
    PYTHONPATH=/tmp/tlpkgs python benchmarks/readout.py --lengths 256 4096 \
        --methods streaming streaming-early-exit streaming-compiled tuned-lens loop --out docs/benchmarks/peers.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

TEXT = (
    "To find the total, first add the apples in each basket: 12 plus 15 is 27, and 27 plus 9 is 36. "
    "Then subtract the 4 apples that were eaten, which leaves 32. Checking the work again, each step holds. "
)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _tuned_lens(lm, seq):
    """The batched pipeline a user of the public tuned-lens package would write: one forward with every hidden
    state, then per layer tuned-lens's LogitLens over all tokens at once, log-softmax and a torch JSD."""
    import torch
    from tuned_lens.nn.lenses import LogitLens  # PYTHONPATH with tuned-lens 0.2.0 (see docs/performance.md)

    from depthlens.metrics.divergence import js_divergence
    from depthlens.metrics.dtr import settling_depth

    lens = LogitLens.from_model(lm.model)
    ids = torch.tensor([list(seq.prompt_ids) + list(seq.completion_ids)])
    p0 = len(seq.prompt_ids) - 1
    with torch.inference_mode():
        out = lm.model(input_ids=ids, output_hidden_states=True)
        final = torch.log_softmax(out.logits[0, p0:-1].float(), -1)
        table = torch.zeros(final.shape[0], lm.n_layers)
        for layer in range(1, lm.n_layers):
            logits = lens(out.hidden_states[layer][0, p0:-1], layer - 1)
            table[:, layer - 1] = js_divergence(final, torch.log_softmax(logits.float(), -1))
    return settling_depth(table, 0.5)


def _loop(lm, seq):
    """The per-token loop a replication would write: hidden states of the text (as `generate(...,
    output_hidden_states=True)` returns them), then per token and layer: norm, unembed, softmax, JSD."""
    import torch

    from depthlens.metrics.divergence import js_divergence

    ids = torch.tensor([list(seq.prompt_ids) + list(seq.completion_ids)])
    p0 = len(seq.prompt_ids) - 1
    norm, unembed = lm.parts.final_norm, lm.parts.unembed
    settling = []
    with torch.inference_mode():
        out = lm.model(input_ids=ids, output_hidden_states=True)
        for t in range(p0, ids.shape[1] - 1):
            final = torch.log_softmax(out.logits[0, t].float(), -1)
            row = []
            for layer in range(1, lm.n_layers):  # every layer: the heatmap row a replication keeps
                q = torch.log_softmax(unembed(norm(out.hidden_states[layer][0, t])).float(), -1)
                row.append(float(js_divergence(final, q)))
            settled = [layer for layer, d in enumerate(row, start=1) if d <= 0.5]
            depth = settled[0] if settled else lm.n_layers
            settling.append(depth)
    return torch.tensor(settling)


PEERS = {"tuned-lens": _tuned_lens, "loop": _loop}


def worker(model: str, method: str, length: int, memory_mb: int, layers: int | None = None) -> dict:
    import torch

    from depthlens.config import ReadoutConfig
    from depthlens.metrics.dtr import settling_depth
    from depthlens.metrics.reference import reference_divergences
    from depthlens.metrics.token_table import reduce_readout
    from depthlens.models.load import load
    from depthlens.readout.stream import TokenSequence, iter_readout

    torch.manual_seed(0)
    lm = load(model, device="cpu")
    if layers is not None:  # the same model's shapes with `layers` blocks, random weights (memory vs depth)
        from transformers import AutoModelForCausalLM

        from depthlens.models.load import wrap

        config = lm.model.config
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:1] * layers
        tokenizer, name = lm.tokenizer, lm.name
        del lm
        lm = wrap(AutoModelForCausalLM.from_config(config).eval(), tokenizer, name=f"{name}-L{layers}")
    tok = lm.tokenizer
    ids = tok(TEXT * (length // 20 + 2), add_special_tokens=False)["input_ids"]
    seq = TokenSequence(tok("Solve the problem step by step.")["input_ids"], ids[:length])
    base_rss = _rss_mb()
    start = time.perf_counter()
    if method.startswith("streaming"):
        # streaming[-early-exit][-compiled]: depthlens's path; early exit = DTR/settling only, no heatmap table.
        config = ReadoutConfig(memory_mb=memory_mb, compile="on" if "compiled" in method else "off")
        settle_at = 0.5 if "early-exit" in method else None
        (table,) = reduce_readout(
            iter_readout(lm, [seq], config),
            1,
            lm.n_layers,
            config.divergence,
            settle_at=settle_at,
            compiled=config.compile == "on",
        )
        settling = table.settling if table.settling is not None else settling_depth(table.divergence, 0.5)
        checksum = float(settling.double().mean())
    elif method in ("tuned-lens", "loop"):
        settling = PEERS[method](lm, seq)
        checksum = float(settling.double().mean())
    else:
        divergence, _ = reference_divergences(lm, seq)
        checksum = float(settling_depth(divergence, 0.5).double().mean())
    seconds = time.perf_counter() - start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "method": method,
        "tokens": length,
        "layers": lm.n_layers,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(length / seconds, 1),
        "peak_extra_mb": round(peak_rss - base_rss, 1),
        "mean_settling_depth": checksum,  # equal across methods: they compute the same thing
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--naive-max", type=int, default=512, help="longest length the naive path is run at")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["streaming", "naive"],
        help="streaming, streaming-early-exit, streaming-compiled, streaming-compiled-early-exit, "
        "tuned-lens, loop, naive",
    )
    parser.add_argument(
        "--loop-max", type=int, default=256, help="longest length the per-token loop is run at"
    )
    parser.add_argument("--memory-mb", type=int, default=512)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--layers", type=int, nargs="+", help="random-init copies with these block counts")
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        layers = args.layers[0] if args.layers else None
        print(json.dumps(worker(args.model, args.worker[0], int(args.worker[1]), args.memory_mb, layers)))
        return
    rows = []
    grid = [(layers, length) for layers in (args.layers or [None]) for length in args.lengths]
    for layers, length in grid:
        for method in args.methods:
            if method == "loop" and length > args.loop_max:
                print(f"loop @ {length}: skipped (linear in tokens; see the shorter lengths)")
                continue
            if method == "naive" and length > args.naive_max:
                print(f"naive @ {length}: skipped (its [L, T, V] float32 tensors would not fit in RAM)")
                continue
            cmd = [
                sys.executable,
                __file__,
                "--model",
                args.model,
                "--memory-mb",
                str(args.memory_mb),
                "--worker",
                method,
                str(length),
                *(["--layers", str(layers)] if layers else []),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{method} @ {length}: failed — {done.stderr.strip().splitlines()[-1:]}")
                rows.append({"method": method, "tokens": length, "error": done.stderr.strip()[-300:]})
                continue
            out = done.stdout.strip().splitlines()[-1]
            row = json.loads(out)
            rows.append(row)
            print(
                f"{method:>30} @ {length:>5} tokens, L = {row['layers']}: {row['tokens_per_s']:>8.1f} tok/s, "
                f"peak extra {row['peak_extra_mb']:>8.1f} MB"
            )
    result = {
        "model": args.model,
        "memory_mb": args.memory_mb,
        "machine": f"{platform.processor() or platform.machine()}, {_cpu_count()} CPUs",
        "command": " ".join(["python", "benchmarks/readout.py", *sys.argv[1:]]),
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
