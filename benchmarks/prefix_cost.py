"""Think@n's prefix (issue 49, item 2): past its first ℓ read-out tokens a response costs the sampler what it costs
with no readout at all. The same responses (same seeds, so the same tokens and the same rows at every step) are
sampled with the readout off, with the first ℓ tokens read out, and with every token read out; each step's CPU
time (the process's clock, all threads) is taken from the sampler's per-step callback, and the steps past ℓ are
compared.

    python benchmarks/prefix_cost.py --model smollm2-135m-instruct --n 8 --new-tokens 64 --window 16 \\
        --repeats 2 --out docs/benchmarks/prefix_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def step_times(lm, prompt: list[int], n: int, new_tokens: int, window: int | None) -> list[float]:
    from depthlens.config import ReadoutConfig, SamplingConfig
    from depthlens.sampling.hf import HFGenerator

    marks: list[float] = []
    sampling = SamplingConfig(max_new_tokens=new_tokens, readout_tokens=window)
    gen = HFGenerator(
        lm, sampling, ReadoutConfig(compile="off"), on_token=lambda _: marks.append(time.process_time())
    )
    start = time.process_time()
    gen.sample(prompt, list(range(n)))
    return [b - a for a, b in zip([start, *marks[:-1]], marks, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--window", type=int, default=16, help="ℓ: tokens read out at every layer")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from depthlens.models.load import load
    from depthlens.models.threads import use_threads

    lm = load(args.model, dtype="float32")
    use_threads("sample", lm.device.type)
    prompt = lm.tokenizer("Explain in two sentences why the sky is blue.")["input_ids"]
    step_times(lm, prompt, 2, 4, None)  # warm-up
    load_before = os.getloadavg()
    settings = {"none": 0, "prefix": args.window, "all": None}
    runs: dict[str, list[list[float]]] = {name: [] for name in settings}
    for _ in range(args.repeats):  # the settings take turns, so each sees the same machine
        for name, window in settings.items():
            runs[name].append(step_times(lm, prompt, args.n, args.new_tokens, window))
    steps = min(len(r) for rs in runs.values() for r in rs)
    rows = {}
    for name, repeats in runs.items():
        # per step, the least of the repeats (the run least disturbed by the machine), then summed over a span
        best = [min(r[s] for r in repeats) for s in range(steps)]
        rows[name] = {
            "steps_within_window_cpu_s": round(sum(best[: args.window]), 3),
            "steps_past_window_cpu_s": round(sum(best[args.window :]), 3),
            "median_step_past_window_ms": round(1000 * statistics.median(best[args.window :]), 1),
        }
    past = rows["prefix"]["steps_past_window_cpu_s"] / rows["none"]["steps_past_window_cpu_s"]
    report = {
        "settings": vars(args) | {"out": str(args.out)},
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "steps_compared": steps,
        "rows": rows,
        "prefix_vs_none_past_window": round(past, 3),
    }
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
