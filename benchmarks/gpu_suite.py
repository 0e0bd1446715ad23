"""Everything the GPU-pace issue measures, in one prepared run on whatever CUDA device there is (issue 40, item 7).

Random weights of real shapes (nothing downloaded); each part guarded, so one failure is recorded and the rest go
on; the JSON is rewritten after every part. Parts:
- ``env``: torch, transformers, device.
- ``adapters``: every tiny adapter row (tests/conftest.py) scored on the device vs the CPU in float32: max |ΔJSD|
  in bits, settling depths equal, δ_TCB's relative difference.
- ``score_scaling``: ``score`` of a Qwen3-8B-shaped model (bf16) at 256 → 32k tokens against a bare forward of
  the same tokens, with peak memory above the weights.
- ``score_variants``: ``score`` of 8,192 tokens by default, without TCB, with δ_TCB in float64 (``exact``), every
  layer read out (no early exit), the old 512 MB budget, per-token output, eager lens; host transfers counted.
- ``sampler``: the HF sampler at n = 48 against ``model.generate`` on the same job (a full-batch warm-up first),
  readout none / first 50 / all tokens, with host transfers per step.
- ``kernel``: the compiled readout kernel against the bare unembedding products (benchmarks/gpu_readout.py) on the
  qwen3-8b and gpt-oss-20b shapes at 512 and 4,096 tokens.
``--small`` runs the same parts at toy sizes on a CPU in under a minute (tests/test_benchmarks.py runs it so).

    PYTHONPATH=src python benchmarks/gpu_suite.py --out docs/benchmarks/gpu_suite_h200.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.conftest: the tiny adapter rows

from gpu_readout import measure  # noqa: E402
from overhead import counted_transfers  # noqa: E402

QWEN3_8B = dict(
    hidden_size=4096,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=12288,
    vocab_size=151936,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
)
TOY = dict(
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=1000,
    head_dim=16,
    max_position_embeddings=4096,
)


class Suite:
    """Runs the parts, each guarded and timed, and keeps the JSON on disk current."""

    def __init__(self, out: Path, small: bool) -> None:
        self.out, self.small = out, small
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.result: dict = {"small": small, "device": str(self.device), "parts": {}}

    def run(self, name: str, fn: Callable[[], dict]) -> None:
        start = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # a failed part is recorded; the rest of the suite still runs
            value = {
                "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                "trace": traceback.format_exc()[-3000:],
            }
        value["seconds"] = round(time.perf_counter() - start, 1)
        self.result["parts"][name] = value
        print(f"== {name} ({value['seconds']} s): {json.dumps(value, default=str)[:1500]}", flush=True)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.result, indent=1, default=str) + "\n")

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def best(self, fn: Callable[[], object], repeats: int = 2) -> float:
        fn()
        self.sync()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - start)
        return round(min(times), 4)


def env(suite: Suite) -> dict:
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__, "device": str(suite.device)}
    if suite.device.type == "cuda":
        props = torch.cuda.get_device_properties(suite.device)
        info.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1))
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


def real_shape(suite: Suite) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = TOY if suite.small else QWEN3_8B
    config = AutoConfig.for_model(
        "qwen3", eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False, **shape
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if suite.device.type == "cuda" else torch.float32
    with torch.device(suite.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.generation_config.eos_token_id = None
    return model.eval()


def _record(vocab: int, tokens: int, seed: int = 1) -> list[dict]:
    ids = torch.randint(3, vocab, (tokens + 16,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [{"id": "x", "prompt_ids": ids[:16], "completion_ids": ids[16:]}]


def _peak_above(suite: Suite, fn: Callable[[], object], base: int) -> float | None:
    if suite.device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats(suite.device)
    fn()
    return round((torch.cuda.max_memory_allocated(suite.device) - base) / 2**30, 3)


def score_scaling(suite: Suite, model: torch.nn.Module) -> dict:
    import depthlens
    from depthlens.studies.score import score as score_records  # the results as dicts

    lm = depthlens.wrap(model, name="qwen3-8b-shape")
    base = torch.cuda.memory_allocated(suite.device) if suite.device.type == "cuda" else 0
    rows = {}
    for tokens in (64, 256) if suite.small else (256, 2048, 8192, 32768):
        record = _record(model.config.vocab_size, tokens)
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
            "peak_above_weights_gib": _peak_above(
                suite, lambda record=record: score_records(lm, record), base
            ),
        }
    return {"rows": rows}


def score_variants(suite: Suite, model: torch.nn.Module) -> dict:
    import depthlens
    from depthlens.config import ReadoutConfig, TCBConfig
    from depthlens.studies.score import score as score_records  # the results as dicts

    lm = depthlens.wrap(model, name="qwen3-8b-shape")
    record = _record(model.config.vocab_size, 256 if suite.small else 8192)
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
    n, new = (8, 16) if suite.small else (48, 128)
    prompt = list(range(5, 37))
    x = torch.tensor([prompt] * n, device=suite.device)

    def generate() -> None:
        with torch.inference_mode():
            model.generate(
                x, do_sample=True, temperature=0.6, top_p=0.95, max_new_tokens=new, min_new_tokens=new
            )

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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="toy sizes: a CPU dry run in under a minute")
    parser.add_argument("--out", type=Path, default=Path("gpu_suite.json"))
    parser.add_argument("--parts", default="env,adapters,score_scaling,score_variants,sampler,kernel")
    args = parser.parse_args()
    suite = Suite(args.out, args.small)
    parts = args.parts.split(",")
    if "env" in parts:
        suite.run("env", lambda: env(suite))
    if "adapters" in parts:
        suite.run("adapters", lambda: adapters(suite))
    built: dict[str, torch.nn.Module] = {}

    def model() -> (
        torch.nn.Module
    ):  # built once, inside the first part that needs it (so its failure is recorded)
        if "model" not in built:
            built["model"] = real_shape(suite)
        return built["model"]

    for name, fn in (
        ("score_scaling", score_scaling),
        ("score_variants", score_variants),
        ("sampler", sampler),
    ):
        if name in parts:
            suite.run(name, lambda fn=fn: fn(suite, model()))
    built.clear()
    if "kernel" in parts:
        suite.run("kernel", lambda: kernel(suite))


if __name__ == "__main__":
    main()
