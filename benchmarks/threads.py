"""Threads chosen for the work (issue 49): what a sampling run costs in CPU and wall seconds on one and two
intra-op threads, OpenMP's idle threads spinning (torch's default) or sleeping (``OMP_WAIT_POLICY=PASSIVE``, what
the CLI sets), on the machine as it is and beside an induced load (busy processes, one per core).

    python benchmarks/threads.py --model smollm2-135m-instruct --n 8 --new-tokens 32 --repeats 2 \\
        --out docs/benchmarks/threads.json

Each setting runs in a fresh process (OpenMP reads its wait policy when it starts, at ``import torch``) that
loads the model, samples one untimed response, then ``--n`` responses of ``--new-tokens`` tokens through the hf
sampler with every token read out (JSD), timed with the process's CPU clock (all threads) and the wall clock.
``default`` is what a ``depthlens generate`` run chooses (``models.threads``). Settings take turns within each
repeat, so each sees the same machine; the load average is recorded beside each row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SETTINGS: dict[str, tuple[int | None, str | None]] = {  # name → (threads, OMP_WAIT_POLICY; None = unset)
    "default": (None, "PASSIVE"),
    "2 threads, passive": (2, "PASSIVE"),
    "2 threads, active": (2, None),
    "1 thread, active": (1, None),
}


def child(model: str, n: int, new_tokens: int, threads: int | None) -> None:
    import torch

    from depthlens.config import ReadoutConfig, SamplingConfig
    from depthlens.models.load import load
    from depthlens.models.threads import use_threads
    from depthlens.sampling.hf import HFGenerator

    lm = load(model, dtype="float32")
    used = use_threads("sample", lm.device.type, threads)
    prompt = lm.tokenizer("Explain in two sentences why the sky is blue.")["input_ids"]
    sampling = SamplingConfig(max_new_tokens=new_tokens, readout_tokens=None)
    gen = HFGenerator(lm, sampling, ReadoutConfig(compile="off"))
    HFGenerator(lm, SamplingConfig(max_new_tokens=2), ReadoutConfig(compile="off")).sample(prompt, [0])
    cpu, wall = time.process_time(), time.perf_counter()
    traces = gen.sample(prompt, list(range(n)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    tokens = sum(len(t) for t in traces)
    print(json.dumps({"threads": used, "torch_threads": torch.get_num_threads(), "tokens": tokens,
                      "cpu_s": round(cpu, 2), "wall_s": round(wall, 2)}))  # fmt: skip


def run_setting(args: argparse.Namespace, name: str) -> dict[str, Any]:
    threads, policy = SETTINGS[name]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    command = [sys.executable, __file__, "--child", "--model", args.model, "--n", str(args.n)]
    command += ["--new-tokens", str(args.new_tokens)] + (["--threads", str(threads)] if threads else [])
    load = os.getloadavg()[0]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return {"setting": name, "load_1min": round(load, 2), **json.loads(out.strip().splitlines()[-1])}


def busy(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--busy", type=int, default=1, help="busy processes of the induced load")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.model, args.n, args.new_tokens, args.threads)
        return
    report: dict[str, Any] = {"cpu": os.cpu_count(), "settings": vars(args) | {"out": str(args.out)}}
    for load in ("as is", "induced"):
        spinners = busy(args.busy) if load == "induced" else []
        try:
            runs = [run_setting(args, name) for _ in range(args.repeats) for name in args.settings]
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        rows = []
        for name in args.settings:
            mine = [r for r in runs if r["setting"] == name]
            rows.append({
                "setting": name,
                "threads": mine[0]["threads"],
                "cpu_s": statistics.median(r["cpu_s"] for r in mine),
                "wall_s": statistics.median(r["wall_s"] for r in mine),
                "tokens": mine[0]["tokens"],
                "load_1min": [r["load_1min"] for r in mine],
            })  # fmt: skip
        best = min(r["cpu_s"] for r in rows)
        for row in rows:
            row["cpu_vs_best"] = round(row["cpu_s"] / best, 2)
            print(json.dumps({"load": load, **row}), flush=True)
        report[load] = {"runs": runs, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
