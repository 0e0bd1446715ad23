"""The deep-thinking paper's Table 2 protocol in one command, where the compute is (docs/findings.md §6.7).

Per task: sample a pool of responses per question (the vLLM backend by default), every response's first ℓ = 50
tokens read out at every layer; then Think@n at n = 48, η 0.5, ℓ 50, with every method beside it — Cons@n,
random@n (Think@n's control), Short@n (length alone), Think@n within length strata (DTR with length held fixed),
Mean@n, Long@n, Self-Certainty@n and DeepConf's variants — each as its exact expectation over the draws of n from the
pool (all C(pool, n) where that is at most 10⁵, else 10⁴ seeded draws, counted in the summary), the 10 trials beside
them, and the paired tests over questions on the exact figures; then Table 1 with length held fixed (`depthlens
correlate`: the within-question partial r and the length-matched AUC of prefix DTR) and the report over every task
(Table 2 pooled over the tasks, Think@n − random@n judged against 0).

    python examples/paper_protocol.py runs/paper                      # Qwen3-4B-Thinking on AIME 2024 + 2025
    python examples/paper_protocol.py runs/paper --model Qwen/Qwen3-8B --tasks aime2025 hmmt_feb2025
    python examples/paper_protocol.py runs/paper --dry-run            # print the commands, run nothing

The defaults are the paper's (n = 48, η 0.5, ℓ 50, 10 trials; Qwen3 thinking models sampled at temperature 0.6,
top-p 0.95); `--pool` (default 64) is the pool each trial draws n from (pool 50 makes the expectation exact over all
C(50, 48) = 1,225 draws). The hub tasks (`aime2024`, `aime2025`, `hmmt_feb2025`, `gpqa_diamond`) need the hub or
`--data FILE` with their rows; any `depthlens generate --task` works (a reasoning-gym family, a `.jsonl`). Every
store resumes (`--resume`): run the same line again after a stop. `--readout all` reads every token out (Table 1 over
whole responses; +12 % time on the H200 below).

Cost per 1,000 questions on one H200 (from /work/shared/gpu/h200-2026-11-28, `gpu_suite_h200.json`; a Qwen3-8B
-shaped model in bfloat16 — a 4B model costs less; vLLM was not measured there, so these are the hf sampler's):
    sampling with the first 50 tokens read out, 48 responses at once: 1,361 generated tokens / s
    tokens per question: pool 64 × 6,408 (the paper's GPT-OSS-120B AIME25 Cons@48 of 307.6k tokens / 48) = 410k
    410k / 1,361 = 301 s per question → 1,000 questions: 3.01·10⁵ s = 83.7 H200-hours
    --readout all (1,216 tokens / s): 410k / 1,216 = 337 s → 93.7 H200-hours
    the votes on a CPU: ≈ 7 CPU-s per question at n = 48 of 64 (10⁴ draws; 6.5 of them DeepConf's 12 variants),
    ≈ 2 CPU-hours per 1,000 questions (measured on this repository's 2-core CPU under load, an upper bound)
The sampler's rate was measured at 128 new tokens; at the thousands of tokens of a reasoning chain attention costs
more per token, so read the hours as a lower bound for the hf sampler (vLLM's paged attention is the reason the
recipe defaults to it). AIME has 30 questions a year: a +2-point selection effect at the spread measured in §6.4
needs 340–490 questions (80 % power), so the protocol is meant to run over several AIME-style sets together.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

PAPER = {"n": 48, "eta": 0.5, "prefix": 50, "trials": 10}
"""The paper's Table 2 setting (n responses, η kept, ℓ_prefix tokens ranked on, trials)."""


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="run directory: one store per task under OUT/<task>")
    p.add_argument(
        "--model", default="Qwen/Qwen3-4B-Thinking-2507", help="a hub id, local directory or catalogue name"
    )
    p.add_argument(
        "--tasks", nargs="+", default=["aime2024", "aime2025"], help="depthlens generate --task values"
    )
    p.add_argument("--data", type=Path, help="the rows of a hub task from a local JSONL (one task only)")
    p.add_argument("--questions", type=int, help="the first N questions of each task (default: all)")
    p.add_argument("--task-config", help="reasoning-gym generator settings, as for depthlens generate")
    p.add_argument("--n", type=int, default=PAPER["n"])
    p.add_argument("--pool", type=int, default=64, help="responses per question each trial draws n from")
    p.add_argument("--max-new-tokens", type=int, default=32768)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--readout", default=str(PAPER["prefix"]), help="tokens read out per response: N or all")
    p.add_argument("--backend", default="vllm", help="vllm (the default, on CUDA), hf or auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return p.parse_args(argv)


def commands(args: argparse.Namespace) -> list[list[str]]:
    """Every command of the protocol, in order: per task generate, thinkn --from, correlate; then report."""
    if args.data is not None and len(args.tasks) != 1:
        raise SystemExit("--data gives the rows of one task: name one in --tasks")
    if args.pool < args.n:
        raise SystemExit(f"--pool {args.pool} is smaller than --n {args.n}: each trial draws n from the pool")
    out: list[list[str]] = []
    for task in args.tasks:
        store = args.out / task.replace(":", "_").replace("/", "_")
        generate = ["generate", "--model", args.model, "--task", task, "--pool", str(args.pool)]
        generate += ["--max-new-tokens", str(args.max_new_tokens), "--readout-tokens", args.readout]
        generate += [
            "--temperature",
            str(args.temperature),
            "--top-p",
            str(args.top_p),
            "--backend",
            args.backend,
        ]
        generate += [
            "--device",
            args.device,
            "--seed",
            str(args.seed),
            "--task-seed",
            "0",
            "--out",
            str(store),
        ]
        generate += ["--resume"]
        for flag, value in (
            ("--data", args.data),
            ("--questions", args.questions),
            ("--task-config", args.task_config),
        ):
            if value is not None:
                generate += [flag, str(value)]
        vote = ["thinkn", "--from", str(store), "--n", str(args.n), "--eta", str(PAPER["eta"])]
        vote += [
            "--prefix",
            str(PAPER["prefix"]),
            "--trials",
            str(PAPER["trials"]),
            "--methods",
            "all",
            "--overwrite",
        ]
        correlate = [
            "correlate",
            str(store),
            "--out",
            str(args.out / f"correlation-{store.name}"),
            "--no-sweeps",
        ]
        out += [generate, vote, correlate]
    out.append(["report", str(args.out)])
    return out


def main(argv: list[str]) -> None:
    args = parse(argv)
    depthlens = shlex.split(os.environ.get("DEPTHLENS", "depthlens"))
    for command in commands(args):
        line = [*depthlens, *command]
        print("$ " + shlex.join(line), flush=True)
        if not args.dry_run:
            subprocess.run(line, check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
