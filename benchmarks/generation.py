"""Sampling throughput with and without the same-pass logit-lens readout (docs/performance.md).

    python benchmarks/generation.py --model smollm2-135m-instruct --n 8 --max-new-tokens 128

Greedy-free sampling (temperature 0.6, top-p 0.95) of n responses to one chat prompt, once per readout window
(none, the first 50 tokens, every token); the sampled tokens are identical across windows (checked), so the
timings compare the same work plus the readout.
"""

from __future__ import annotations

import argparse
import json
import time

from depthlens.config import SamplingConfig
from depthlens.models.load import load
from depthlens.sampling.generate import HFGenerator
from depthlens.studies.score import as_token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    lm = load(args.model)
    message = (
        "Calculate 5 - 3 - 6.\n\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    prompt = as_token_ids(lm.tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                                           add_generation_prompt=True, tokenize=True))  # fmt: skip
    results, reference = [], None
    for window in (0, 50, None):
        gen = HFGenerator(lm, SamplingConfig(max_new_tokens=args.max_new_tokens, readout_tokens=window))
        start = time.perf_counter()
        traces = gen.sample(prompt, list(range(args.n)))
        seconds = time.perf_counter() - start
        tokens = sum(len(t) for t in traces)
        ids = [t.token_ids for t in traces]
        reference = reference or ids
        assert ids == reference, "the readout window changed what was sampled"
        row = {"readout_tokens": "all" if window is None else window, "seconds": round(seconds, 2),
               "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)}  # fmt: skip
        results.append(row)
        print(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "n": args.n, "max_new_tokens": args.max_new_tokens, "runs": results}, f,
                      indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
