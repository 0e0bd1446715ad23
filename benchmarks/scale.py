"""Scoring throughput on Ray against one process (issue 13, item 7), on the real default model.

Each mode is the whole ``depthlens score`` command in a fresh process, timed from outside (wall seconds), scoring
the same N records (prompt + completion token ids, ``--tokens``):
- ``process-2t``: one process, 2 torch threads (the default on this machine);
- ``process-1t``: one process, 1 thread (``OMP_NUM_THREADS=1``) — the reference for Ray's overhead;
- ``process-2t-glibc``: as ``process-2t`` with glibc's default malloc thresholds (``DEPTHLENS_MALLOC=default``);
- ``ray-1w``, ``ray-2w``: ``score --ray`` on a local Ray (127.0.0.1) it starts itself, 1 or 2 actors × 1 CPU.
Each mode runs with N records and with 1 record, alternating, ``--reps`` times; the 1-record run is the fixed cost
(interpreter, model load; for Ray also its start and the actors'), the difference the marginal cost per record.
Ray's overhead per record is ray-1w's marginal cost minus process-1t's. Medians are reported.

    python benchmarks/scale.py --records 24 --tokens 64 --reps 3 --out docs/benchmarks/scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {
    "process-2t": ([], {}),
    "process-1t": ([], {"OMP_NUM_THREADS": "1"}),
    "process-2t-glibc": ([], {"DEPTHLENS_MALLOC": "default"}),  # glibc defaults, see models/allocator.py
    "ray-1w": (["--ray", "--workers", "1", "--cpus", "1", "--block-rows", "4"], {}),
    "ray-2w": (["--ray", "--workers", "2", "--cpus", "1", "--block-rows", "4"], {}),
}


def _records(n: int, tokens: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "id": f"r{i}",
            "prompt_ids": [rng.randrange(3, vocab) for _ in range(32)],
            "completion_ids": [rng.randrange(3, vocab) for _ in range(tokens)],
        }
        for i in range(n)
    ]


def _run(model: str, src: Path, out: Path, extra: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one scoring command (CPU time is not comparable: Ray's actors are not its children)."""
    shutil.rmtree(out, ignore_errors=True)
    command = [
        sys.executable,
        "-c",
        "from depthlens.cli.app import main; main()",
        "score",
        "--model",
        model,
        "--in",
        str(src),
        "--out",
        str(out),
        "--tokens",
        "-q",
        *extra,
    ]
    start = time.perf_counter()
    subprocess.run(command, env={**os.environ, **env}, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--records", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per record")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from depthlens.models.load import load_tokenizer

    vocab = len(load_tokenizer(args.model))
    tmp = Path(tempfile.mkdtemp(prefix="scale-"))
    inputs = {}
    for n in (1, args.records):
        inputs[n] = tmp / f"in-{n}.jsonl"
        inputs[n].write_text("".join(json.dumps(r) + "\n" for r in _records(n, args.tokens, vocab)))
    runs: dict[str, dict[int, list[float]]] = {m: {1: [], args.records: []} for m in args.modes}
    for rep in range(args.reps):
        for mode in args.modes:  # modes alternate, so each sees the same machine over the repetitions
            extra, env = MODES[mode]
            for n in (1, args.records):
                runs[mode][n].append(_run(args.model, inputs[n], tmp / "out", extra, env))
            print(
                f"rep {rep} {mode}: 1 record {runs[mode][1][-1]:.1f} s, {args.records} records "
                f"{runs[mode][args.records][-1]:.1f} s",
                flush=True,
            )
    results = {}
    for mode in args.modes:
        one = statistics.median(runs[mode][1])
        many = statistics.median(runs[mode][args.records])
        marginal = (many - one) / (args.records - 1)
        results[mode] = {
            "wall_1_s": round(one, 2),
            "wall_n_s": round(many, 2),
            "marginal_s_per_record": round(marginal, 3),
            "tokens_per_s_marginal": round(args.tokens / marginal, 1),
            "runs_wall_n_s": [round(w, 2) for w in runs[mode][args.records]],
        }
        print(
            f"{mode:11s} 1 record {one:6.1f} s  {args.records} records {many:6.1f} s  "
            f"marginal {marginal * 1000:7.0f} ms/record ({args.tokens / marginal:5.1f} tok/s)"
        )
    summary = {
        "model": args.model,
        "records": args.records,
        "tokens": args.tokens,
        "reps": args.reps,
        "load_1min": round(os.getloadavg()[0], 1),
        "modes": results,
    }
    if "ray-1w" in results and "process-1t" in results:
        overhead = results["ray-1w"]["marginal_s_per_record"] - results["process-1t"]["marginal_s_per_record"]
        summary["ray_overhead_s_per_record"] = round(overhead, 3)
        print(f"Ray's overhead per record (ray-1w − process-1t, marginal): {overhead * 1000:.0f} ms")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
