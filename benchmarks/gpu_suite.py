"""Everything the GPU-pace issues measure, in one prepared run on whatever CUDA device there is (issue 40, item 7;
issue 60, item 6).

Random weights of real shapes (nothing downloaded); each part guarded, so one failure is recorded and the rest go
on; the JSON is rewritten after every part. The parts (``PARTS``, in the order they run):
- ``env``: torch, transformers, device, driver, which depthlens.
- ``adapters``: every tiny adapter row (tests/conftest.py) scored on the device vs the CPU in float32: max |ΔJSD|
  in bits, settling depths equal, δ_TCB's relative difference.
- ``score_scaling``: ``score`` of a Qwen3-8B-shaped model (bf16) at 256 → 32k tokens against a bare forward of
  the same tokens, with peak memory above the weights.
- ``score_variants``: ``score`` of 8,192 tokens by default, without TCB, with δ_TCB in float64 (``exact``), every
  layer read out (no early exit), the old 512 MB budget, per-token output, eager lens; host transfers counted.
- ``sampler``: the HF sampler at n = 48 against ``model.generate`` on the same job (a full-batch warm-up first),
  readout none / first 50 / all tokens, with host transfers per step.
- ``layer_top_k``: ``score --tokens`` with each layer's top-K, K = 0 / 5 / 20, K = 5 profiled (benchmarks/gpu_parts.py).
- ``tcb``: ``score`` without TCB, with it and exact (float64 from bf16 weights): TCB's share, float32 vs exact.
- ``sampler_compile``: the sampler reading every token, ``compile`` auto / off / on, and auto with top-5.
- ``kernel``: the compiled readout kernel against the bare unembedding products (benchmarks/gpu_readout.py) on the
  qwen3-8b and gpt-oss-20b shapes at 512 and 4,096 tokens.
``--small`` runs the same parts at toy sizes on a CPU in a few minutes (tests/test_benchmarks.py runs it so).
``--deadline-s`` records the parts not begun by then as skipped, so a run fits a device lease.

    PYTHONPATH=src python benchmarks/gpu_suite.py --out docs/benchmarks/gpu_suite_h200.json

The before/after of issue 60 on one device, ≤ 8 minutes (docs/performance.md, "The H200's figures"):

    PYTHONPATH=.before/src python benchmarks/gpu_suite.py --parts env,layer_top_k,tcb --deadline-s 200 \
        --out before.json && PYTHONPATH=src python benchmarks/gpu_suite.py \
        --parts env,layer_top_k,tcb,sampler_compile,kernel --deadline-s 280 --out after.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.conftest: the tiny adapter rows

import gpu_parts  # noqa: E402
from gpu_common import Suite, peak_above, real_shape, sampler_batch  # noqa: E402
from gpu_common import record as make_record  # noqa: E402
from gpu_readout import measure  # noqa: E402
from overhead import counted_transfers  # noqa: E402

_record = make_record  # the name the first GPU run's extra scripts (extra7.py, prof7.py) import


def env(suite: Suite) -> dict:
    import transformers

    import depthlens

    info = {"torch": torch.__version__, "transformers": transformers.__version__, "device": str(suite.device)}
    info["depthlens"] = str(Path(depthlens.__file__).parent)  # which tree: before or after a change
    if suite.device.type == "cuda":
        props = torch.cuda.get_device_properties(suite.device)
        info.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
        try:
            query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            info["driver"] = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    return info


def adapters(suite: Suite) -> dict:
    """Every adapter row's tiny model on the device vs the CPU, float32, the same record."""
    from tests.conftest import TINY_CONFIGS, tiny_model

    import depthlens
    from depthlens.studies.score import score as score_records  # the results as dicts

    g = torch.Generator().manual_seed(0)
    record = [
        {
            "id": "a",
            "prompt_ids": torch.randint(3, 100, (12,), generator=g).tolist(),
            "completion_ids": torch.randint(3, 100, (40,), generator=g).tolist(),
        }
    ]
    rows = {}
    for model_type in sorted(TINY_CONFIGS):
        try:
            model = tiny_model(model_type)
            cpu = score_records(depthlens.wrap(model), record, tokens=True)[0]
            here = score_records(depthlens.wrap(copy.deepcopy(model).to(suite.device)), record, tokens=True)[
                0
            ]
            jsd = (torch.tensor(cpu["divergence"]) - torch.tensor(here["divergence"])).abs().max()
            rows[model_type] = {
                "max_abs_djsd_bits": float(jsd),
                "settling_equal": cpu["settling_depth"] == here["settling_depth"],
                "tcb_rel": abs(cpu["tcb_mean"] - here["tcb_mean"]) / abs(cpu["tcb_mean"]),
            }
        except Exception as exc:  # one architecture's failure is a row, not the end of the part
            rows[model_type] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    measured = [r["max_abs_djsd_bits"] for r in rows.values() if "max_abs_djsd_bits" in r]
    return {
        "rows": rows,
        "worst_max_abs_djsd_bits": max(measured, default=None),
        "all_settling_equal": all(r.get("settling_equal") for r in rows.values()),
        "errors": sorted(k for k, r in rows.items() if "error" in r),
    }


def score_scaling(suite: Suite, model: torch.nn.Module) -> dict:
    import depthlens
    from depthlens.studies.score import score as score_records  # the results as dicts

    lm = depthlens.wrap(model, name="qwen3-8b-shape")
    base = torch.cuda.memory_allocated(suite.device) if suite.device.type == "cuda" else 0
    rows = {}
    for tokens in (64, 256) if suite.small else (256, 2048, 8192, 32768):
        record = make_record(model.config.vocab_size, tokens)
        x = torch.tensor([record[0]["prompt_ids"] + record[0]["completion_ids"]], device=suite.device)

        def forward(x: torch.Tensor = x) -> None:
            with torch.inference_mode():
                model(x, logits_to_keep=1)

        bare = suite.best(forward)
        seconds = suite.best(lambda record=record: score_records(lm, record))
        rows[str(tokens)] = {
            "score_s": seconds,
            "bare_forward_s": bare,
            "vs_forward": round(seconds / bare, 2),
            "peak_above_weights_gib": peak_above(
                suite, lambda record=record: score_records(lm, record), base
            ),
        }
    return {"rows": rows}


def score_variants(suite: Suite, model: torch.nn.Module) -> dict:
    import depthlens
    from depthlens.config import ReadoutConfig, TCBConfig
    from depthlens.studies.score import score as score_records  # the results as dicts

    lm = depthlens.wrap(model, name="qwen3-8b-shape")
    record = make_record(model.config.vocab_size, 256 if suite.small else 8192)
    variants = {
        "default": {},
        "no_tcb": {"tcb": None},
        "tcb_exact": {"tcb": TCBConfig(exact=True)},
        "every_layer": {"readout": ReadoutConfig(early_exit=False)},
        "budget_512mb": {"readout": ReadoutConfig(memory_mb=512)},
        "tokens": {"tokens": True},
        "eager_lens": {"readout": ReadoutConfig(compile="off")},
    }
    rows = {}
    for name, kw in variants.items():
        try:
            seconds = suite.best(lambda kw=kw: score_records(lm, record, **kw))
            with counted_transfers() as counts:
                score_records(lm, record, **kw)
            rows[name] = {"seconds": seconds, "host_transfers": dict(counts)}
        except Exception as exc:  # one variant's failure is a row
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"tokens": len(record[0]["completion_ids"]), "rows": rows}


def sampler(suite: Suite, model: torch.nn.Module) -> dict:
    import depthlens
    from depthlens.config import ReadoutConfig, SamplingConfig
    from depthlens.sampling.hf import HFGenerator

    lm = depthlens.wrap(model, name="qwen3-8b-shape")
    n, new, prompt, generate = sampler_batch(suite, model)
    reference = suite.best(generate)  # first: the full-batch warm-up of the allocator and kernels
    rows = {"generate": {"seconds": reference, "tokens_per_s": round(n * new / reference, 1)}}
    for name, window in (("none", 0), ("first_50", 50), ("all", None)):
        gen = HFGenerator(lm, SamplingConfig(max_new_tokens=new, readout_tokens=window), ReadoutConfig())
        seconds = suite.best(lambda gen=gen: gen.sample(prompt, list(range(n))))
        steps = 0

        def count(_: int) -> None:
            nonlocal steps
            steps += 1

        gen.on_token = count
        with counted_transfers() as counts:
            gen.sample(prompt, list(range(n)))
        rows[f"readout_{name}"] = {
            "seconds": seconds,
            "tokens_per_s": round(n * new / seconds, 1),
            "vs_generate": round(reference / seconds, 2),
            "transfers_per_step": round(sum(counts.values()) / max(steps, 1), 2),
        }
    return {"n": n, "new_tokens": new, "rows": rows}


def kernel(suite: Suite) -> dict:
    cases = (
        [("tiny", 64)] if suite.small else [(s, t) for s in ("qwen3-8b", "gpt-oss-20b") for t in (512, 4096)]
    )
    rows = {}
    for shape, tokens in cases:
        result = measure(shape, tokens, "bfloat16" if suite.device.type == "cuda" else "float32", repeats=2)
        rows[f"{shape}@{tokens}"] = {
            r["path"]: {k: r[k] for k in ("vs_matmul", "roofline_fraction")} for r in result["rows"]
        }
    return {"rows": rows}


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of the suite: ``fn(suite)``, or ``fn(suite, model)`` with the Qwen3-8B-shaped model (built once, by
    the first part that needs it, so its failure is recorded there)."""

    fn: Callable[..., dict]
    model: bool = False


PARTS: dict[str, Part] = {
    "env": Part(env),
    "adapters": Part(adapters),
    "score_scaling": Part(score_scaling, model=True),
    "score_variants": Part(score_variants, model=True),
    "sampler": Part(sampler, model=True),
    "layer_top_k": Part(gpu_parts.layer_top_k, model=True),
    "tcb": Part(gpu_parts.tcb, model=True),
    "sampler_compile": Part(gpu_parts.sampler_compile, model=True),
    # Hooks for the readout features being built beside issue 60 — one row each when they land, e.g.
    # "target_trajectory": Part(gpu_parts.score_rows({"off": ..., "on": lambda: {"tokens": True, ...}}), model=True),
    # "jacobian_lens": Part(gpu_parts.score_rows({"logit": ..., "jacobian": lambda: {"readout": ...}}), model=True),
    "kernel": Part(kernel),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="toy sizes: a CPU dry run in a few minutes")
    parser.add_argument("--out", type=Path, default=Path("gpu_suite.json"))
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    parser.add_argument("--deadline-s", type=float, default=None, help="parts not begun by then are skipped")
    args = parser.parse_args()
    unknown = sorted(set(args.parts.split(",")) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {unknown}; known: {', '.join(PARTS)}")
    suite = Suite(args.out, args.small, args.deadline_s)
    built: dict[str, torch.nn.Module] = {}

    def model() -> torch.nn.Module:
        if "model" not in built:
            built["model"] = real_shape(suite)
        return built["model"]

    wanted = args.parts.split(",")
    for (
        name,
        part,
    ) in PARTS.items():  # the registry's order: the model is freed before the kernel's own shapes
        if name not in wanted:
            continue
        if part.model:
            suite.run(name, lambda part=part: part.fn(suite, model()))
        else:
            built.clear()
            suite.run(name, lambda part=part: part.fn(suite))


if __name__ == "__main__":
    main()
