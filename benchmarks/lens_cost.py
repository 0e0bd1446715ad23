"""What a fitted lens costs the readout (issue 58 item 8): ``score --tokens`` of one record on the default model under
the logit lens, a tuned lens and a Jacobian lens, in one process, in rounds (logit, tuned, jacobian, logit, …) so a
drift of the machine's speed falls on every lens alike; each lens's CPU seconds per round, and the ratio to the
logit lens's in the same round.

A fitted lens adds one d × d product per layer before the norm (tuned: and a bias) to the unembedding's d × V:
d / V = 576 / 49,152 = 1.2 % of its FLOPs on SmolLM2. The lenses here are random matrices of the model's shape
(their values do not change the cost). Run it with ``OMP_NUM_THREADS=1``: one thread's CPU seconds measure the
work, which wall time on a shared machine does not.

    OMP_NUM_THREADS=1 python benchmarks/lens_cost.py --tokens 512 --rounds 5 --out docs/benchmarks/lens_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

PARAGRAPH = (
    "To add 17 and 25, first add the tens: 10 + 20 = 30. Then add the ones: 7 + 5 = 12. Finally 30 + 12 = 42, "
    "so the sum is 42. Checking by counting up from 25 by 17 also gives 42. "
)


def lenses(lm, folder: Path) -> dict[str, str]:
    """A random tuned lens and a random J-lens of ``lm``'s shape in ``folder``: kind → the ``--lens`` text."""
    from depthlens.readout.jacobian import save_artifact
    from depthlens.readout.lens_files import hidden_size, model_fingerprint
    from depthlens.readout.tuned import save_lens

    d, n = hidden_size(lm), lm.n_layers - 1
    gen = torch.Generator().manual_seed(0)
    weight = torch.eye(d) + 0.01 * torch.randn(n, d, d, generator=gen)
    stamp = {"model": lm.name, "model_hash": model_fingerprint(lm), "n_layers": lm.n_layers, "d": d}
    save_lens(folder / "tuned", weight, 0.01 * torch.randn(n, d, generator=gen), dict(stamp))
    save_artifact(folder / "j.pt", weight, 1, {"depthlens": stamp}, torch.float16)
    return {"logit": "logit", "tuned": f"tuned:{folder / 'tuned'}", "jacobian": f"jacobian:{folder / 'j.pt'}"}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from depthlens.models.load import load
    from depthlens.studies.resolve import readout
    from depthlens.studies.score import score

    lm = load(args.model, device="cpu")
    n_paragraph = len(lm.tokenizer(PARAGRAPH, add_special_tokens=False)["input_ids"])
    record = {
        "id": "long",
        "messages": [{"role": "user", "content": "What is 17 + 25?"}],
        "completion": PARAGRAPH * max(1, round(args.tokens / n_paragraph)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        configs = {kind: readout(lens=text) for kind, text in lenses(lm, Path(tmp)).items()}
        for config in configs.values():  # warm-up: each lens's matrices loaded, the kernels touched
            score(lm, [record], readout=config, tcb=None, tokens=True)
        seconds: dict[str, list[float]] = {kind: [] for kind in configs}
        for _ in range(args.rounds):
            for kind, config in configs.items():
                began = time.process_time()
                (result,) = score(lm, [record], readout=config, tcb=None, tokens=True)
                seconds[kind].append(time.process_time() - began)
    ratios = {
        kind: [round(a / b, 3) for a, b in zip(values, seconds["logit"], strict=True)]
        for kind, values in seconds.items()
        if kind != "logit"
    }
    summary = {
        "model": args.model,
        "tokens": result["token_count"],
        "n_layers": lm.n_layers,
        "threads": torch.get_num_threads(),
        "cpu_seconds": {k: [round(v, 2) for v in values] for k, values in seconds.items()},
        "median_cpu_seconds": {k: round(statistics.median(v), 2) for k, v in seconds.items()},
        "ratio_to_logit_per_round": ratios,
        "median_ratio_to_logit": {k: round(statistics.median(v), 3) for k, v in ratios.items()},
    }
    print(json.dumps(summary, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
