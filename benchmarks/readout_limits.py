"""The readout against its floor and its peers, on the model's own text (issue 6, items 1, 3a and 4).

One forward pass gives the hidden states; then, on the same tokens and layers, it times
- ``matmul``: the bare unembedding products, normed state × W_U, for layers 1..L−1 (the floor);
- ``full``: depthlens's readout — per-layer log-softmax, JSD to the final layer, settling, DTR;
- ``early-exit``: the same scores with each token's layer walk stopped at its settling depth (identical results);
- ``compiled``: both with the fused compiled kernel (``metrics.fused``; compiled before timing);
- ``loop``: the per-token loop a replication would write (per token and layer: norm, unembed, softmax, JSD), on
  the first ``--loop-tokens`` tokens and reported per token.
Numbers go to docs/performance.md; nothing is asserted.

    python benchmarks/readout_limits.py --tokens 512 --out docs/benchmarks/readout_limits.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

PROMPT = "A farmer has 17 sheep, buys 25 more, then sells 9. Explain step by step how many sheep he has now."


CLOCK = [time.perf_counter]  # ``--clock cpu``: the process's CPU clock (all threads), for a machine not quiet


def _timed(fn, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        start = CLOCK[0]()
        fn()
        best = min(best, CLOCK[0]() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=512, help="generated tokens read out")
    parser.add_argument("--loop-tokens", type=int, default=32, help="tokens timed in the per-token loop")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.clock == "cpu":
        CLOCK[0] = time.process_time

    from depthlens.config import DTRConfig, ReadoutConfig
    from depthlens.metrics.divergence import js_divergence
    from depthlens.metrics.dtr import deep_flags, deep_thinking_ratio
    from depthlens.metrics.token_table import reduce_readout, sequence_scores
    from depthlens.models.load import load
    from depthlens.readout.stream import TokenSequence, iter_readout, lens_for
    from depthlens.studies.score_inputs import as_token_ids

    torch.manual_seed(0)
    lm = load(args.model, device="cpu")
    tok = lm.tokenizer
    prompt = as_token_ids(
        tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    )
    with torch.inference_mode():  # the model's own text: sampled, no end-of-turn stop, exactly --tokens long
        out = lm.model.generate(
            torch.tensor([prompt]),
            max_new_tokens=args.tokens,
            min_new_tokens=args.tokens,
            do_sample=True,
            temperature=0.7,
            top_p=0.95,
        )
    completion = out[0, len(prompt) :].tolist()
    seq = TokenSequence(prompt, completion)
    config = ReadoutConfig()
    dtr = DTRConfig()
    chunks = list(iter_readout(lm, [seq], config))  # the forward pass, done once, not timed
    n_layers, n_tokens = lm.n_layers, len(completion)

    def full() -> dict:
        (table,) = reduce_readout(chunks, 1, n_layers, "jsd")
        return sequence_scores(table, dtr, n_layers)

    def early() -> dict:
        (table,) = reduce_readout(chunks, 1, n_layers, "jsd", settle_at=dtr.g)
        return sequence_scores(table, dtr, n_layers)

    def full_compiled() -> dict:
        (table,) = reduce_readout(chunks, 1, n_layers, "jsd", compiled=True)
        return sequence_scores(table, dtr, n_layers)

    def early_compiled() -> dict:
        (table,) = reduce_readout(chunks, 1, n_layers, "jsd", settle_at=dtr.g, compiled=True)
        return sequence_scores(table, dtr, n_layers)

    lens = lens_for(lm, config)
    weight = lm.parts.unembed.weight[: lens.vocab_size or None]
    normed = [[lens.normed(h) for h in c._hidden] for c in chunks]

    def matmul() -> None:
        with torch.inference_mode():
            for layers in normed:
                for x in layers:
                    x @ weight.T

    a = full()
    for fn in (early, full_compiled, early_compiled):  # compiles here, untimed
        b = fn()
        assert a["dtr"] == b["dtr"] and torch.equal(a["settling_depth"], b["settling_depth"]), fn.__name__

    t_full, t_early, t_matmul, t_full_c, t_early_c = (
        _timed(f, args.repeats) for f in (full, early, matmul, full_compiled, early_compiled)
    )

    # The per-token loop a replication would write, from the same hidden states.
    hidden = [torch.cat([c._hidden[layer] for c in chunks]) for layer in range(n_layers - 1)]
    final = torch.cat([c.final.logprobs for c in chunks])
    m = min(args.loop_tokens, n_tokens)

    def loop() -> float | None:
        deep = []
        with torch.inference_mode():
            for t in range(m):
                settled = n_layers
                for layer in range(n_layers - 1):
                    p = torch.log_softmax(lens.logits_from_normed(lens.normed(hidden[layer][t])), -1)
                    d = float(js_divergence(final[t], p))
                    if d <= dtr.g and settled == n_layers:
                        settled = layer + 1
                deep.append(settled)
        return deep_thinking_ratio(deep_flags(torch.tensor(deep), n_layers, dtr.rho))

    t_loop = _timed(loop, 1) * n_tokens / m  # extrapolated to all tokens (it is linear in tokens)

    rows = {
        "matmul": t_matmul,
        "full": t_full,
        "early-exit": t_early,
        "full, compiled": t_full_c,
        "early-exit, compiled": t_early_c,
        "loop (per-token, extrapolated)": t_loop,
    }
    result = {
        "model": args.model,
        "tokens": n_tokens,
        "layers": n_layers,
        "vocab": int(weight.shape[0]),
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "cpu": platform.processor() or platform.machine(),
        "dtr": a["dtr"],
        "mean_settling_depth": a["mean_settling_depth"],
        "seconds": rows,
        "tokens_per_s": {k: n_tokens / v for k, v in rows.items()},
        "full_over_matmul": t_full / t_matmul,
        "full_compiled_over_matmul": t_full_c / t_matmul,
        "early_exit_speedup": t_full / t_early,
        "early_exit_speedup_compiled": t_full_c / t_early_c,
        "full_over_loop_speedup": t_loop / t_full,
        "early_over_loop_speedup": t_loop / t_early,
        "best_over_loop_speedup": t_loop / min(t_full, t_early, t_full_c, t_early_c),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
