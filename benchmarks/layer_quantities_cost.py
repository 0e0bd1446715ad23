"""What the per-layer quantities cost (issue 58 items 4–5): CPU seconds of ``score --tokens`` on the default model
with the target trajectory, tracked ids, each layer's entropy or a caller's statistic, against the same scoring
without them — each setting in a fresh process, the settings interleaved (A B C … A B C …) so a drift of the shared
machine's speed falls on all of them alike.

One record: a chat prompt and a completion of about ``--tokens`` tokens (a paragraph repeated), every token read
out at every layer (``tokens``: no early exit), into a Parquet store. Run it with ``OMP_NUM_THREADS=1``: the CPU
seconds of one thread then measure the work, which wall time on a shared machine does not.

    OMP_NUM_THREADS=1 python benchmarks/layer_quantities_cost.py --tokens 512 --rounds 2 \\
        --out docs/benchmarks/layer_quantities_cost.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from layer_top_cost import PARAGRAPH  # a sibling script: benchmarks/ is on the path when run

SETTINGS = {
    "none": {},
    "target": {"layer_target": True},
    "track4": {"track": (17, 28, 42, 100)},  # four tracked ids: one rank pass each
    "track16": {"track": tuple(range(100, 116))},  # sixteen: one bucketed count
    "entropy": {"layer_entropy": True},
    "stat_entropy": {"stat": True},  # the same entropy as a caller's statistic (layer_stats)
    "all": {"layer_target": True, "track": (17, 28, 42, 100), "layer_entropy": True},
}


def entropy(lp: Any) -> Any:
    """A caller's statistic: each row's entropy in nats, from a block of log-probabilities [rows, V]."""
    return -(lp.exp() * lp).sum(-1)


def one(model: str, tokens: int, name: str) -> dict:
    """Score the record with setting ``name``; this process's numbers."""
    from depthlens.config import ReadoutConfig, ScoreRun, StoreSpec
    from depthlens.models.load import load
    from depthlens.stores.parquet import iter_store
    from depthlens.studies.score import run_score

    lm = load(model, device="cpu")
    n_paragraph = len(lm.tokenizer(PARAGRAPH, add_special_tokens=False)["input_ids"])
    completion = PARAGRAPH * max(1, round(tokens / n_paragraph))
    record = {
        "id": "long",
        "messages": [{"role": "user", "content": "What is 17 + 25?"}],
        "completion": completion,
    }
    settings = dict(SETTINGS[name])
    stats = {"entropy": entropy} if settings.pop("stat", False) else None
    out: dict = {"setting": name, "n_layers": lm.n_layers}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        src.write_text(json.dumps(record) + "\n")
        run = ScoreRun(src, StoreSpec(Path(tmp) / "scores"), ReadoutConfig(**settings), tcb=None, tokens=True)
        began, began_cpu = time.perf_counter(), time.process_time()
        run_score(lm, run, layer_stats=stats)
        out["seconds"] = round(time.perf_counter() - began, 2)
        out["cpu_seconds"] = round(time.process_time() - began_cpu, 2)
        (stored,) = iter_store(Path(tmp) / "scores")
        out["tokens"] = stored["token_count"]
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process's setting
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.model, args.tokens, args.one)))
        return
    rows = []
    for _ in range(args.rounds):
        for name in args.settings:
            cmd = [
                sys.executable,
                __file__,
                "--model",
                args.model,
                "--tokens",
                str(args.tokens),
                "--one",
                name,
            ]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    base = statistics.median(r["cpu_seconds"] for r in rows if r["setting"] == "none")
    summary = {
        name: {
            "cpu_seconds_median": statistics.median(r["cpu_seconds"] for r in rows if r["setting"] == name),
            "vs_none": round(
                statistics.median(r["cpu_seconds"] for r in rows if r["setting"] == name) / base - 1, 4
            ),
        }
        for name in args.settings
    }
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"model": args.model, "tokens": args.tokens, "rows": rows, "summary": summary}
        args.out.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
