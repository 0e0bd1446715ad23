"""Scoring throughput on Ray against one process (issue 13, item 7), on the real default model.

Modes, each scoring the same N records (prompt + completion token ids, ``--tokens`` per-token output):
- ``process-2t``: one process, 2 torch threads (``score_file``, JSONL out) — today's way to use both cores;
- ``process-1t``: one process, 1 thread — the reference for Ray's overhead;
- ``ray-1w``, ``ray-2w``: ``score_ray`` on a local Ray (127.0.0.1), 1 or 2 actors × 1 CPU (1 thread) each.
Each mode runs with N records and with 1 record; the 1-record run is the fixed cost (actor start and model load
for Ray, model load for a process), the difference the marginal cost per record. Ray's overhead per record is
ray-1w's marginal cost minus process-1t's. Ray's own start (``ray.init``) is timed apart.

    python benchmarks/scale.py --records 48 --tokens 96 --out docs/benchmarks/scale.json
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path


def _records(n: int, tokens: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"id": f"r{i}", "prompt_ids": [rng.randrange(3, vocab) for _ in range(32)],
         "completion_ids": [rng.randrange(3, vocab) for _ in range(tokens)]}
        for i in range(n)
    ]  # fmt: skip


def _process(model: str, src: Path, out: Path, threads: int) -> float:
    import torch

    from depthlens.models.load import load
    from depthlens.studies.score import score_file

    torch.set_num_threads(threads)
    start = time.perf_counter()
    lm = load(model, device="cpu")
    score_file(lm, src, out, tokens=True, overwrite=True)
    return time.perf_counter() - start


def _ray(model: str, src: Path, out: Path, workers: int) -> float:
    from depthlens.studies.ray_score import score_ray

    start = time.perf_counter()
    score_ray(model, src, out, tokens=True, workers=workers, cpus=1, block_rows=4, overwrite=True,
              load_kwargs={"device": "cpu"})  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--records", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=96, help="completion tokens per record")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from depthlens.models.load import load_tokenizer
    from depthlens.studies.ray_score import connect

    vocab = len(load_tokenizer(args.model))
    tmp = Path(tempfile.mkdtemp(prefix="scale-"))
    inputs = {}
    for n in (1, args.records):
        inputs[n] = tmp / f"in-{n}.jsonl"
        inputs[n].write_text("".join(json.dumps(r) + "\n" for r in _records(n, args.tokens, vocab)))
    start = time.perf_counter()
    connect(None, num_cpus=2)
    ray_init = time.perf_counter() - start
    runs = {
        "process-2t": lambda src, out: _process(args.model, src, out.with_suffix(".jsonl"), 2),
        "process-1t": lambda src, out: _process(args.model, src, out.with_suffix(".jsonl"), 1),
        "ray-1w": lambda src, out: _ray(args.model, src, out, 1),
        "ray-2w": lambda src, out: _ray(args.model, src, out, 2),
    }
    results: dict[str, dict[str, float]] = {}
    for name, run in runs.items():
        one = run(inputs[1], tmp / f"{name}-1")
        many = run(inputs[args.records], tmp / f"{name}-n")
        marginal = (many - one) / (args.records - 1)
        results[name] = {"wall_1_s": one, "wall_n_s": many, "marginal_s_per_record": marginal,
                         "records_per_s": args.records / many,
                         "tokens_per_s_marginal": args.tokens / marginal}  # fmt: skip
        print(f"{name:11s} 1 record {one:6.2f} s  {args.records} records {many:6.2f} s  "
              f"marginal {marginal * 1000:7.1f} ms/record ({args.tokens / marginal:6.0f} tok/s)")  # fmt: skip
    overhead = results["ray-1w"]["marginal_s_per_record"] - results["process-1t"]["marginal_s_per_record"]
    print(f"ray.init {ray_init:.2f} s; Ray's overhead per record (ray-1w − process-1t, marginal) "
          f"{overhead * 1000:.1f} ms")  # fmt: skip
    summary = {"model": args.model, "records": args.records, "tokens": args.tokens, "ray_init_s": ray_init,
               "ray_overhead_s_per_record": overhead, "modes": results}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
