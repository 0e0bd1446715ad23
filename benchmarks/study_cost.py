"""What the findings study costs before it runs (issue 44): tokens read out per CPU-second of `generate
--readout-tokens all`, JSD alone, at the study's batch size, compiled vs eager, and the answer lengths that choose
its response length.

    python benchmarks/study_cost.py --model smollm2-135m-instruct qwen2.5-coder-0.5b-instruct \
        --questions 1 --pool 16 --max-new-tokens 192 --out docs/benchmarks/study_cost.json

Per model and compile setting: one store of ``--questions`` × ``--pool`` responses on the study's first family
(basic_arithmetic, two one-digit terms), the hf sampler in float32, every token read out at every layer (JSD only),
timed with the process's CPU clock (all threads) and the wall clock around ``studies.generate.generate`` (the model
is loaded once per model, outside the timing). The compiled setting first runs a two-token warm-up whose time is
reported as ``compile_s`` (once per process, i.e. once per store of the study). The same seeds in both settings
sample the same tokens; the difference is the readout kernel. The load average is recorded before and after: a
CPU-second is only comparable between runs on a quiet machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from depthlens.config import GenerateRun, ReadoutConfig, SamplingConfig, StoreSpec, TaskSpec
from depthlens.evals.loading import task_questions
from depthlens.models.load import load
from depthlens.stores.samples import iter_samples
from depthlens.studies.generate import generate

FAMILY = TaskSpec(
    name="reasoning_gym:basic_arithmetic",
    questions=1,
    task_config="min_terms=2,max_terms=2,max_digits=1,allow_parentheses=false,allow_negation=false",
)


def _run(lm: Any, task: TaskSpec, pool: int, max_new: int, compile_: str, out: Path) -> dict[str, Any]:
    run = GenerateRun(
        store=StoreSpec(out=out, overwrite=True),
        pool=pool,
        batch_size=pool,  # the study's batch: a question's whole pool at once
        sampling=SamplingConfig(max_new_tokens=max_new, readout_tokens=None),
        readout=ReadoutConfig(divergence="jsd", compile=compile_),  # type: ignore[arg-type]
        task=task,
    )
    questions = task_questions(task)
    cpu, wall = time.process_time(), time.perf_counter()
    generate(lm, run, questions)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    records = [r for r in iter_samples(out) if r.get("status") == "ok"]
    lengths = [int(r["token_count"]) for r in records]
    return {
        "compile": compile_,
        "responses": len(records),
        "tokens": sum(lengths),
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "tokens_per_cpu_s": round(sum(lengths) / cpu, 2),
        "lengths": lengths,
        "cut_at_max": sum(r["finish"] == "length" for r in records),
        "correct": sum(bool(r.get("correct")) for r in records),
    }


def measure(model: str, questions: int, pool: int, max_new: int, settings: list[str]) -> dict[str, Any]:
    lm = load(model, dtype="float32")
    task = dataclasses.replace(FAMILY, questions=questions)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for compile_ in settings:
            compile_s = None
            if compile_ == "on":  # compile once, outside the timing (once per store of the study)
                start = time.perf_counter()
                _run(lm, dataclasses.replace(FAMILY, questions=1), 2, 2, "on", Path(tmp) / "warm")
                compile_s = round(time.perf_counter() - start, 1)
            row = _run(lm, task, pool, max_new, compile_, Path(tmp) / compile_)
            rows.append({**row, "compile_s": compile_s})
            print(json.dumps({k: v for k, v in row.items() if k != "lengths"}), flush=True)
    return {"model": model, "n_layers": lm.n_layers, "runs": rows}


def study_cost(
    results: list[dict[str, Any]], questions: int, pool: int, families: int
) -> list[dict[str, Any]]:
    """CPU-hours of one store per model (``questions`` × ``pool`` on a family), from the measured tokens per
    response and tokens per CPU-second of the faster setting."""
    cost = []
    for result in results:
        best = max(result["runs"], key=lambda r: r["tokens_per_cpu_s"])
        mean_len = statistics.mean(best["lengths"])
        tokens = questions * pool * mean_len
        cost.append(
            {
                "model": result["model"],
                "setting": best["compile"],
                "tokens_per_family": round(tokens),
                "cpu_hours_per_family": round(tokens / best["tokens_per_cpu_s"] / 3600, 2),
                "cpu_hours_all_families": round(families * tokens / best["tokens_per_cpu_s"] / 3600, 2),
            }
        )
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", nargs="+", default=["smollm2-135m-instruct"])
    parser.add_argument("--questions", type=int, default=1)
    parser.add_argument("--pool", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--compile", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument("--study-questions", type=int, default=30, help="questions per family in the study")
    parser.add_argument("--families", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = [measure(m, args.questions, args.pool, args.max_new_tokens, args.compile) for m in args.model]
    report = {
        "cpu": os.cpu_count(),
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "settings": vars(args) | {"out": str(args.out)},
        "results": results,
        "study": study_cost(results, args.study_questions, args.pool, args.families),
    }
    print(json.dumps(report["study"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
