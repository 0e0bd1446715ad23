"""What each layer's top-k costs (``--layer-top-k K``, issue 52 item 1): time, peak memory and store bytes of
``score --tokens`` on the default model, K against no top-k, each K in a fresh process (peak RSS is per process).

One record: a chat prompt and a completion of about ``--tokens`` tokens (a paragraph repeated), scored with every
token read out at every layer, into a Parquet store and a JSONL store. For each K: the wall time of the scoring,
the process's peak RSS, and the ``layer_top_ids`` + ``layer_top_probs`` bytes per token × layer × k (Parquet: the
columns' compressed size; JSONL: the characters of their arrays). Run it with ``OMP_NUM_THREADS=1``: the CPU
seconds of one thread then measure the work, which wall time on a shared machine does not.

    OMP_NUM_THREADS=1 python benchmarks/layer_top_cost.py --tokens 512 --ks 0 5 20 0 5 \
        --out docs/benchmarks/layer_top_cost.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from store_bytes import column_bytes  # a sibling script: benchmarks/ is on the path when run

PARAGRAPH = (
    "To add 17 and 25, first add the tens: 10 + 20 = 30. Then add the ones: 7 + 5 = 12. Finally 30 + 12 = 42, "
    "so the sum is 42. Checking by counting up from 25 by 17 also gives 42. "
)
FIELDS = ("layer_top_ids", "layer_top_probs")


def one(model: str, tokens: int, k: int) -> dict:
    """Score the record at ``k`` (0: no top-k) into both formats; this process's numbers."""
    from depthlens.config import ReadoutConfig, ScoreRun, StoreSpec
    from depthlens.models.load import load
    from depthlens.stores.jsonl import iter_jsonl
    from depthlens.studies.score import run_score

    lm = load(model, device="cpu")
    n_paragraph = len(lm.tokenizer(PARAGRAPH, add_special_tokens=False)["input_ids"])
    completion = PARAGRAPH * max(1, round(tokens / n_paragraph))
    record = {
        "id": "long",
        "messages": [{"role": "user", "content": "What is 17 + 25?"}],
        "completion": completion,
    }
    out: dict = {"k": k, "n_layers": lm.n_layers}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        src.write_text(json.dumps(record) + "\n")
        readout = ReadoutConfig(layer_top_k=k)
        began, began_cpu = time.perf_counter(), time.process_time()
        run_score(lm, ScoreRun(src, StoreSpec(Path(tmp) / "scores"), readout, tcb=None, tokens=True))
        out["seconds"] = round(time.perf_counter() - began, 2)
        out["cpu_seconds"] = round(
            time.process_time() - began_cpu, 2
        )  # steadier than wall time on a busy machine
        jsonl = Path(tmp) / "scores.jsonl"
        run_score(lm, ScoreRun(src, StoreSpec(jsonl), readout, tcb=None, tokens=True))
        (stored,) = iter_jsonl(jsonl)
        out["tokens"] = stored["token_count"]
        cells = stored["token_count"] * lm.n_layers * max(k, 1)
        if k:
            out["parquet_bytes_per_token_layer_k"] = round(
                column_bytes(Path(tmp) / "scores", *FIELDS) / cells, 2
            )
            chars = sum(len(json.dumps(stored[f], separators=(",", ":"))) for f in FIELDS)
            out["jsonl_bytes_per_token_layer_k"] = round(chars / cells, 2)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 5, 20])
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child process's K
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.model, args.tokens, args.one)))
        return
    rows = []
    for k in args.ks:
        cmd = [sys.executable, __file__, "--model", args.model, "--tokens", str(args.tokens), "--one", str(k)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": args.model, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
