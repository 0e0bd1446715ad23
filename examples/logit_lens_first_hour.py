"""What does layer l predict here? depthlens's answer beside a logit lens written from transformers alone.

    python examples/logit_lens_first_hour.py [MODEL] [--k 5]

On one text (a prompt and its completion, as token ids so both sides read the same tokens) it asks
``depthlens.score(..., tokens=True, layer_top_k=K)`` for each layer's K most probable tokens, then computes the
same from transformers: ``output_hidden_states=True`` → the final norm → ``lm_head`` → softmax → ``topk``. It prints,
for every completion token, each fifth layer's top-1 from depthlens with its probability, and whether the plain
lens agrees; then the agreement over every cell: ids equal up to ties, probabilities within 1e-4
(docs/logit-lens.md). Runs in about 10 s on a CPU with the default model (``smollm2-135m-instruct``).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

import depthlens

PROMPT = "The capital of France is"
COMPLETION = " Paris, and the capital of Italy is Rome."


def plain_logit_lens(
    model: Any, final_norm: Any, prompt_ids: list[int], completion_ids: list[int], k: int
) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """Each layer's top-k for every completion token, from transformers alone: (ids, probs), each [T, L, K], and
    the whole distributions [T, L, V].

    Position i's hidden state predicts token i + 1, so the completion's T tokens are read from the T positions
    before them. transformers' ``hidden_states`` are the embeddings then one per block, the last already through
    the final norm; the others get it here."""
    inputs = torch.tensor([prompt_ids + completion_ids])
    at = slice(len(prompt_ids) - 1, inputs.shape[1] - 1)
    head = model.get_output_embeddings()
    with torch.no_grad():
        hidden = model(input_ids=inputs, output_hidden_states=True).hidden_states
        states = [final_norm(h[0, at]) for h in hidden[1:-1]] + [hidden[-1][0, at]]
        probs = torch.softmax(torch.stack([head(s) for s in states], dim=1).float(), dim=-1)
    top_probs, top_ids = probs.topk(k, dim=-1)
    return top_ids.numpy(), top_probs.numpy(), probs


def compare(lm: Any, prompt_ids: list[int], completion_ids: list[int], k: int) -> dict[str, Any]:
    """depthlens's ``layer_top_ids`` / ``layer_top_probs`` of one text and the plain lens's, with how far apart
    they are: ``ties`` counts the cells whose ids differ where the plain lens gives both the same probability
    (within 1e-6), ``other`` the cells that differ otherwise (0 when the two agree)."""
    record = {"id": "text", "prompt_ids": prompt_ids, "completion_ids": completion_ids}
    table = depthlens.score(lm, [record], tokens=True, layer_top_k=k, progress=False)
    ids = depthlens.matrices(table, "layer_top_ids")[0]
    probs = depthlens.matrices(table, "layer_top_probs")[0]
    plain_ids, plain_probs, plain = plain_logit_lens(
        lm.model, lm.parts.final_norm, prompt_ids, completion_ids, k
    )
    differ = ids != plain_ids
    mine_in_plain = plain.gather(-1, torch.from_numpy(ids.astype(np.int64))).numpy()
    tied = np.abs(mine_in_plain - plain_probs) <= 1e-6
    return {
        "table": table,
        "ids": ids,
        "probs": probs,
        "plain_ids": plain_ids,
        "plain_probs": plain_probs,
        "max_prob_diff": float(np.abs(probs - plain_probs).max()),
        "ties": int((differ & tied).sum()),
        "other": int((differ & ~tied).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()
    lm = depthlens.load(args.model, device="cpu")
    prompt_ids = lm.tokenizer(PROMPT)["input_ids"]
    completion_ids = lm.tokenizer(COMPLETION, add_special_tokens=False)["input_ids"]
    result = compare(lm, prompt_ids, completion_ids, args.k)

    row = result["table"].to_pylist()[0]
    labels, tokens = row["layer_top_tokens"], row["tokens"]
    n_layers = result["ids"].shape[1]
    shown = sorted({*range(5, n_layers, 5), n_layers})
    print(
        f"{lm!r}\neach layer's top-1 (probability); '=' where the plain transformers lens has the same id\n"
    )
    print(f"{'token':>10} | " + " | ".join(f"{'layer ' + str(layer):>16}" for layer in shown))
    for t, token in enumerate(tokens):
        cells = []
        for layer in shown:
            same = "=" if result["ids"][t, layer - 1, 0] == result["plain_ids"][t, layer - 1, 0] else "≠"
            cells.append(f"{labels[t][layer - 1][0][:10]:>10} {result['probs'][t, layer - 1, 0]:.2f}{same}")
        print(f"{token[:10]:>10} | " + " | ".join(cells))
    cells = result["ids"].size
    print(
        f"\n{cells} cells (tokens × layers × K): ids differ in {result['ties'] + result['other']} "
        f"({result['ties']} ties, {result['other']} otherwise); max |Δ probability| = {result['max_prob_diff']:.2e}"
    )
    ok = result["other"] == 0 and result["max_prob_diff"] <= 1e-4
    print("agree: ids equal up to ties, probabilities within 1e-4" if ok else "DISAGREE")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
