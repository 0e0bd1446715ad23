"""δ_TCB's default float32 path against the float64 reference on the offline models' own states (issue 40, item 2).

For each catalogue model: the final normalised states of a short text, δ_TCB by the anchored closed form in
float32 (the default) and in float64 (``--tcb-exact``), and a term-by-term float64 reference
sqrt(Σ_i o_i² ‖w̃_i − μ‖²) formed row by row, with no expansion of the norm. Prints and writes the worst relative
error of each path and the top probability of the most peaked token (where the old expansion cancelled).

    python benchmarks/tcb_precision.py --out docs/benchmarks/tcb_precision.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

TEXT = "The capital of France is Paris, and 2 + 2 = 4. Tom has 3 apples and buys 4 more, so he has 7 apples."


def reference_delta(unembed: object, states: torch.Tensor, block: int = 8192) -> torch.Tensor:
    """ε = 1 δ_TCB per state from Σ_i o_i² ‖w̃_i − μ‖², every row's term formed directly in float64."""
    weight = unembed.weight
    z = unembed.logits(states, torch.float64)
    y = unembed.post(z) if unembed.post is not None else z
    s = unembed.post.derivative(z) if unembed.post is not None else torch.ones_like(z)
    o = torch.log_softmax(y, -1).exp()
    out = []
    for t in range(states.shape[0]):
        k = int(o[t].argmax())
        anchor = weight[k].double() * s[t, k]
        others = o[t].clone()
        others[k] = 0.0
        centre = torch.zeros_like(anchor)  # μ − a = Σ_{j≠k} o_j (w̃_j − a)
        for lo in range(0, weight.shape[0], block):
            rows = weight[lo : lo + block].double() * s[t, lo : lo + block, None] - anchor
            centre += others[lo : lo + block] @ rows
        total = torch.zeros((), dtype=torch.float64)
        for lo in range(0, weight.shape[0], block):
            rows = weight[lo : lo + block].double() * s[t, lo : lo + block, None] - anchor - centre
            total += (o[t, lo : lo + block] ** 2 * (rows**2).sum(-1)).sum()
        out.append(1.0 / total.sqrt())
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models",
        default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct,gemma3-270m",
        help="comma-separated",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from depthlens.metrics.tcb import Unembedding, token_constraint_terms
    from depthlens.models.load import load
    from depthlens.readout.lens import LogitLens

    rows = []
    for name in args.models.split(","):
        lm = load(name, device="cpu")
        unembed = Unembedding.from_lens(LogitLens(lm.parts, vocab_size=len(lm.tokenizer)))
        ids = lm.tokenizer(TEXT, return_tensors="pt").input_ids
        with torch.no_grad():
            states = lm.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
        expected = reference_delta(unembed, states)
        started = time.perf_counter()
        fast = token_constraint_terms(unembed, states, unembed.row_norms_sq(torch.float32))["tcb"]
        fast_s = time.perf_counter() - started
        started = time.perf_counter()
        exact = token_constraint_terms(unembed, states, unembed.row_norms_sq(), exact=True)["tcb"]
        exact_s = time.perf_counter() - started
        top = torch.softmax(unembed.logits(states, torch.float64), -1).max(-1).values
        row = {
            "model": name,
            "tokens": int(states.shape[0]),
            "max_rel_err_float32": float(((fast - expected).abs() / expected).max()),
            "max_rel_err_float64": float(((exact - expected).abs() / expected).max()),
            "max_top_probability": float(top.max()),
            "seconds_float32": round(fast_s, 3),
            "seconds_float64": round(exact_s, 3),
        }
        rows.append(row)
        print(json.dumps(row))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"text": TEXT, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
