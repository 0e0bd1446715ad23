"""A notebook's first hour with depthlens, cell by cell: a model, a pool of answers with every token's depth,
Think@n against Cons@n, and one response's token × layer heatmap (docs/python.md).

    python examples/notebook.py [MODEL] [OUT]     # SmolLM2-135M: 8 questions × 8 answers × 80 tokens, CPU

The recipe is the one the default model answers (docs/view.md): reasoning-gym's chain_sum with two one-digit
terms, 80 new tokens. NOTEBOOK_QUESTIONS and NOTEBOOK_TOKENS shrink it (the tests run it on a tiny model).
"""

import os
import sys
from pathlib import Path

import depthlens
from depthlens.viz.heatmap import draw_divergence_heatmap

model = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
out = Path(sys.argv[2] if len(sys.argv) > 2 else "runs/notebook")
out.mkdir(parents=True, exist_ok=True)

# 1. A model: a catalogue name, a directory or a hub id — or depthlens.wrap(transformers_model, tokenizer).
lm = depthlens.load(model, device="cpu")

# 2. A pool of 8 answers per question, every token read out at every layer: one row per response.
pool = depthlens.generate(
    lm,
    "reasoning_gym:chain_sum",
    task_config="min_terms=2,max_terms=2,max_digits=1",
    questions=int(os.environ.get("NOTEBOOK_QUESTIONS", 8)),
    pool=8,
    max_new_tokens=int(os.environ.get("NOTEBOOK_TOKENS", 80)),
    readout_tokens=None,  # every token (the default reads out the first 50)
)
responses = pool.to_pandas()
columns = ["id", "answer", "correct", "token_count", "dtr", "dtr_prefix", "mean_settling_depth"]
print(responses[columns].to_string(max_rows=12))
print(
    f"right {responses.correct.mean():.0%}, cut at max_new_tokens {(responses.finish == 'length').mean():.0%}"
)

# 3. Think@n (keep the half of n with the deepest first 25 tokens, then vote) against Cons@n (vote over all n) and
# against random@n (a vote over a random half: its control).
methods = depthlens.think_at_n(pool, methods=["cons@n", "think@n", "random@n"], n=4, prefix=25).to_pandas()
control = methods.vs == "random@n"  # the last row: Think@n against random@n, its control
shown = ["method", "accuracy_mean", "accuracy_std", "cost_mean", "cost_vs_cons"]
print(methods[~control][shown].to_string(index=False))
print(methods[control][["method", "vs", "diff", "diff_lo", "diff_hi", "p"]].to_string(index=False))
print("\n".join(methods.attrs["notes"]))  # what the vote says about itself (depthlens.notes)
methods.to_csv(out / "thinkn.csv", index=False)

# 4. One right response (else any) as a heatmap: divergence from the final layer, each token's settling depth.
record = max(pool.to_pylist(), key=lambda r: bool(r["correct"]))
figure = draw_divergence_heatmap(  # a matplotlib Figure (shown under the cell in Jupyter), also written
    record, out / "heatmap.png", title=f"{record['id']}: {record['text'][:60]!r}"
)
print(f"heatmap: {out / 'heatmap.png'}")
