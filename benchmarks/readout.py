"""Scoring throughput and peak memory: streaming readout vs the naive materialising one.

Each (method, length) runs in a fresh subprocess so its peak resident memory is its own; "extra" memory is the
peak minus the resident size right after the model loaded. Never asserted on: numbers go to docs/performance.md.

    python benchmarks/readout.py --lengths 256 1024 4096 --naive-max 512 --out docs/benchmarks/readout.json
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


def worker(model: str, method: str, length: int, memory_mb: int) -> dict:
    import torch

    from depthlens.config import ReadoutConfig
    from depthlens.metrics.reference import reference_divergences
    from depthlens.metrics.token_table import reduce_readout
    from depthlens.models.load import load
    from depthlens.readout.stream import TokenSequence, iter_readout

    torch.manual_seed(0)
    lm = load(model, device="cpu")
    tok = lm.tokenizer
    ids = tok(TEXT * (length // 20 + 2), add_special_tokens=False)["input_ids"]
    seq = TokenSequence(tok("Solve the problem step by step.")["input_ids"], ids[:length])
    base_rss = _rss_mb()
    start = time.perf_counter()
    if method == "streaming":
        config = ReadoutConfig(memory_mb=memory_mb)
        (table,) = reduce_readout(iter_readout(lm, [seq], config), 1, lm.n_layers, config.divergence)
        checksum = float(table.divergence.sum())
    else:
        divergence, _ = reference_divergences(lm, seq)
        checksum = float(divergence.sum())
    seconds = time.perf_counter() - start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "method": method,
        "tokens": length,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(length / seconds, 1),
        "peak_extra_mb": round(peak_rss - base_rss, 1),
        "checksum": checksum,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--naive-max", type=int, default=512, help="longest length the naive path is run at")
    parser.add_argument("--memory-mb", type=int, default=512)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.model, args.worker[0], int(args.worker[1]), args.memory_mb)))
        return
    rows = []
    for length in args.lengths:
        for method in ("streaming", "naive"):
            if method == "naive" and length > args.naive_max:
                print(f"naive @ {length}: skipped (its [L, T, V] float32 tensors would not fit in RAM)")
                continue
            cmd = [sys.executable, __file__, "--model", args.model, "--memory-mb", str(args.memory_mb),
                   "--worker", method, str(length)]  # fmt: skip
            out = (
                subprocess.run(cmd, capture_output=True, text=True, check=True)
                .stdout.strip()
                .splitlines()[-1]
            )
            row = json.loads(out)
            rows.append(row)
            print(f"{method:>9} @ {length:>5} tokens: {row['tokens_per_s']:>8.1f} tok/s, "
                  f"peak extra {row['peak_extra_mb']:>8.1f} MB")  # fmt: skip
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
