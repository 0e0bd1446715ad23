"""What the plumbing around the lens costs, where the arithmetic is cheap (issue 40, item 6; issue 60, item 5).

A GPU does the lens's matmuls so fast that per-layer copies, syncs and Python loops dominate. A small model on a
CPU reproduces that balance: a Qwen3-config model with d = 256, 8 layers and a 32k vocabulary (random weights,
nothing downloaded) spends little on arithmetic per token, so what ``score`` and the sampler add beside it shows.
In one run this reports
- ``score`` time / a bare forward of the same tokens, default settings and variants (no TCB, every layer,
  per-token output with and without each layer's top-5, TCB in float64), and TCB's share of ``score`` as its
  own row, two ways: timed inside one default call (``tcb_share_in_call``, the steadier) and as
  (default − no TCB) / default (``tcb_share_of_score``);
- sampler tokens/s / ``model.generate`` tokens/s at n = 48, with readout none / the first 50 tokens / all, and all
  through the compiled kernel (``--compile on``; compiled in the untimed warm-up);
- host transfers (calls of ``Tensor.cpu``, ``.item``, ``.tolist`` and ``bool(tensor)``) per readout
  chunk of ``score`` and per sampler step, counted by wrapping those methods;
- each goal beside its measure (``GOALS``), read on the first setting.

**Settings.** The verdict is read on **one thread and the process's CPU clock** (``1:cpu``, the default's first):
the proxy's ratios then hold at any load. On two threads and the wall clock (``2:wall``, measured beside it and
labelled so) the forward's large products use both cores while the readout's small operations do not, so the
ratios move with the machine's load (issue 60: ``score`` 13.0× a forward quiet, 7.2–9.3× at load 2–3, the same
tree). ``--settings 1:cpu`` skips the second. Runs against any depthlens tree on PYTHONPATH (a before/after is two
runs, one per tree, or one run per tree alternating). Nothing is asserted.

    OMP_NUM_THREADS=1 python benchmarks/overhead.py --out docs/benchmarks/overhead.json
    OMP_NUM_THREADS=1 python benchmarks/overhead.py --layers 36 --parts score --settings 1:cpu   # TCB's share
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# Before torch starts OpenMP: threads that wait passively, as the CLI sets it (docs/performance.md, "Threads chosen
# for the work"): two spinning threads on a shared machine cost 9–15× the CPU of one.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

TRANSFERS = ("cpu", "item", "tolist", "__bool__")  # .numpy() reads host memory: no transfer of its own


def proxy_model(vocab: int = 32768, hidden: int = 256, layers: int = 8, seed: int = 0) -> torch.nn.Module:
    """A random-init Qwen3-config causal LM of the given shape (float32, eval mode, no end-of-sequence id)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )
    model = Qwen3ForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@contextlib.contextmanager
def counted_transfers() -> Iterator[dict[str, int]]:
    """Count calls of the tensor methods that move data to the host (on a GPU, each is a sync)."""
    counts = dict.fromkeys(TRANSFERS, 0)
    originals = {name: getattr(torch.Tensor, name) for name in TRANSFERS}

    def wrapper(name: str, original: Callable) -> Callable:
        def counted(self: torch.Tensor, *args: object, **kwargs: object) -> object:
            counts[name] += 1
            return original(self, *args, **kwargs)

        return counted

    for name, original in originals.items():
        setattr(torch.Tensor, name, wrapper(name, original))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


CLOCK: list[Callable[[], float]] = [time.perf_counter]  # ``--clock cpu``: the process's CPU clock instead


def best_of(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocator, lazy inits, compiled kernels
    best = math.inf
    for _ in range(repeats):
        start = CLOCK[0]()
        fn()
        best = min(best, CLOCK[0]() - start)
    return best


def score_overhead(
    lm: object, model: torch.nn.Module, tokens: int, repeats: int, only: tuple[str, ...] = ()
) -> dict:
    """``score`` of one record of ``tokens`` completion tokens, against a bare forward of the same ids."""
    import depthlens.metrics.token_table as token_table
    from depthlens.config import ReadoutConfig, TCBConfig
    from depthlens.stores.inputs import InputRecord
    from depthlens.studies.score import score_records

    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (tokens + 16,), generator=torch.Generator().manual_seed(1)).tolist()
    records = [InputRecord("x", 1, {"prompt_ids": ids[:16], "completion_ids": ids[16:]})]
    x = torch.tensor([ids])

    def bare() -> None:
        with torch.inference_mode():
            model(x, logits_to_keep=1)

    def score(**kw: object) -> Callable[[], object]:
        return lambda: list(score_records(lm, records, **kw))

    variants: dict[str, dict] = {
        "default": {},
        "no_tcb": {"tcb": None},
        "every_layer": {"readout": ReadoutConfig(early_exit=False)},
        "tokens": {"tokens": True},
    }
    if "layer_top_k" in {f.name for f in dataclasses.fields(ReadoutConfig)}:  # trees after issue 52
        variants["tokens_top5"] = {"tokens": True, "readout": ReadoutConfig(layer_top_k=5)}
    if "exact" in {f.name for f in dataclasses.fields(TCBConfig)}:  # trees after issue 40
        variants["tcb_exact"] = {"tcb": TCBConfig(exact=True)}
    if only:
        variants = {name: kw for name, kw in variants.items() if name in only}
    forward = best_of(bare, repeats)
    rows: dict[str, dict] = {}
    for name, kw in variants.items():
        seconds = best_of(score(**kw), repeats)
        chunks = 0
        original = token_table.token_baselines  # called once per readout chunk in every tree

        def counting(*args: object, _original: Callable = original) -> object:
            nonlocal chunks
            chunks += 1
            return _original(*args)

        token_table.token_baselines = counting
        try:
            with counted_transfers() as counts:
                score(**kw)()
        finally:
            token_table.token_baselines = original
        total = sum(counts.values())
        rows[name] = {
            "seconds": round(seconds, 4),
            "vs_forward": round(seconds / forward, 2),
            "chunks": chunks,
            "host_transfers": counts,
            "transfers_per_chunk": round(total / max(chunks, 1), 1),
        }
        print(
            f"score {name:12s} {seconds:7.3f} s = {seconds / forward:5.1f}× forward  "
            f"{total / max(chunks, 1):6.1f} transfers/chunk over {chunks} chunks",
            flush=True,
        )
    shares = {}
    if "default" in variants:
        shares["tcb_share_in_call"] = tcb_in_call(score(), repeats)
    if "default" in rows and "no_tcb" in rows:
        default, no_tcb = rows["default"]["seconds"], rows["no_tcb"]["seconds"]
        shares["tcb_share_of_score"] = round((default - no_tcb) / default, 3)
    if "tokens_top5" in rows and "tokens" in rows:
        shares["top5_cost_on_tokens"] = round(
            rows["tokens_top5"]["seconds"] / rows["tokens"]["seconds"] - 1, 3
        )
    print(
        "score "
        + "  ".join(
            f"{k} {100 * v:+.1f} %" if k == "top5_cost_on_tokens" else f"{k} {100 * v:.1f} %"
            for k, v in shares.items()
        ),
        flush=True,
    )
    return {"tokens": tokens, "bare_forward_s": round(forward, 4), "variants": rows, **shares}


def tcb_in_call(call: Callable[[], object], repeats: int) -> float:
    """TCB's share of one default ``score`` call, timed inside it (``token_table.chunk_tcb``, every tree's TCB entry
    per chunk, on ``CLOCK``): a ratio within one call, steadier than two calls' difference on a loaded machine (on a
    CPU the work is done when each call returns). The call with the least total time of ``repeats``."""
    import depthlens.metrics.token_table as token_table

    original = token_table.chunk_tcb
    inside = [0.0]

    def timed(*args: object, **kwargs: object) -> object:
        start = CLOCK[0]()
        try:
            return original(*args, **kwargs)
        finally:
            inside[0] += CLOCK[0]() - start

    token_table.chunk_tcb = timed
    best = (math.inf, 0.0)
    try:
        for _ in range(repeats):
            inside[0] = 0.0
            start = CLOCK[0]()
            call()
            best = min(best, (CLOCK[0]() - start, inside[0]))
    finally:
        token_table.chunk_tcb = original
    return round(best[1] / best[0], 3)


def sampler_overhead(lm: object, model: torch.nn.Module, n: int, new_tokens: int, repeats: int) -> dict:
    """The HF sampler at n responses against ``model.generate`` on the same prompt and sampling settings."""
    from depthlens.config import ReadoutConfig, SamplingConfig
    from depthlens.sampling.hf import HFGenerator

    prompt = list(range(5, 37))
    x = torch.tensor([prompt] * n)

    def generate() -> None:
        with torch.inference_mode():
            model.generate(
                x,
                do_sample=True,
                temperature=0.6,
                top_p=0.95,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
            )

    reference = best_of(generate, repeats)
    reference_rate = n * new_tokens / reference
    rows: dict[str, dict] = {}
    variants = (
        ("none", 0, "off"),
        ("first_50", 50, "off"),
        ("all", None, "off"),
        ("all_compiled", None, "on"),
    )
    for name, window, compile_ in variants:
        sampling = SamplingConfig(max_new_tokens=new_tokens, readout_tokens=window)
        steps = 0

        def step(_: int) -> None:
            nonlocal steps
            steps += 1

        gen = HFGenerator(
            lm, sampling, ReadoutConfig(compile=compile_), on_token=step
        )  # best_of compiles first
        seconds = best_of(lambda gen=gen: gen.sample(prompt, list(range(n))), repeats)
        steps = 0
        with counted_transfers() as counts:
            traces = gen.sample(prompt, list(range(n)))
        made = sum(len(t) for t in traces)
        rate = made / seconds
        rows[name] = {
            "seconds": round(seconds, 3),
            "tokens_per_s": round(rate, 1),
            "vs_generate": round(rate / reference_rate, 2),
            "steps": steps,
            "host_transfers": counts,
            "transfers_per_step": round(sum(counts.values()) / max(steps, 1), 1),
        }
        print(
            f"sampler readout {name:9s} {rate:8.1f} tok/s = {rate / reference_rate:4.2f}× generate  "
            f"{sum(counts.values()) / max(steps, 1):6.1f} transfers/step",
            flush=True,
        )
    return {
        "n": n,
        "new_tokens": new_tokens,
        "generate_s": round(reference, 3),
        "generate_tokens_per_s": round(reference_rate, 1),
        "readout": rows,
    }


GOALS = (  # (what, where in a setting's result, bound, "max" or "min"): issue 60 item 5, read on the first setting
    ("score / forward, TCB on (default)", ("score", "variants", "default", "vs_forward"), 6.0, "max"),
    ("sampler / generate, no readout", ("sampler", "readout", "none", "vs_generate"), 0.95, "min"),
    ("sampler / generate, every token read out", ("sampler", "readout", "all", "vs_generate"), 0.6, "min"),
    (
        "each layer's top-5 on score --tokens (CPU: +5 % at most)",
        ("score", "top5_cost_on_tokens"),
        0.05,
        "max",
    ),
)
SETTINGS = {
    "1:cpu": "1 thread, CPU clock (the verdict)",
    "2:wall": "2 threads, wall clock (moves with the load)",
}


def goals(result: dict) -> list[dict]:
    """Each goal against what one setting measured (absent parts are left out)."""
    rows = []
    for what, path, bound, kind in GOALS:
        value: object = result
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int | float):
            met = value <= bound if kind == "max" else value >= bound
            rows.append({"goal": what, "measured": value, "bound": bound, "kind": kind, "met": met})
    return rows


def measure(setting: str, lm: object, model: torch.nn.Module, args: argparse.Namespace) -> dict:
    """Every part at one setting (``threads:clock``)."""
    threads, clock = setting.split(":")
    torch.set_num_threads(int(threads))
    CLOCK[0] = time.process_time if clock == "cpu" else time.perf_counter
    print(f"== {SETTINGS.get(setting, setting)}", flush=True)
    out: dict = {"label": SETTINGS.get(setting, setting), "threads": int(threads), "clock": clock}
    if "score" in args.parts:
        only = tuple(args.variants.split(",")) if args.variants else ()
        out["score"] = score_overhead(lm, model, args.tokens, args.repeats, only)
    if "sampler" in args.parts:
        out["sampler"] = sampler_overhead(lm, model, args.n, args.new_tokens, args.repeats)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=2048, help="completion tokens scored")
    parser.add_argument("--n", type=int, default=48, help="responses sampled at once")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per response")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--parts", default="score,sampler", help="comma-separated: score, sampler")
    parser.add_argument(
        "--variants",
        default="",
        help="score's variants to time, comma-separated (default: all of default, no_tcb, every_layer, tokens, "
        "tokens_top5, tcb_exact)",
    )
    parser.add_argument(
        "--settings",
        default="1:cpu,2:wall",
        help="threads:clock pairs, comma-separated; the first gives the verdict (clock: cpu = the process's CPU "
        "time, all threads; wall)",
    )
    parser.add_argument("--clock", choices=["wall", "cpu"], help="older flag: one setting, 1 thread if cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = (
        args.settings.split(",")
        if args.clock is None
        else [f"{1 if args.clock == 'cpu' else 2}:{args.clock}"]
    )

    import depthlens
    from depthlens.models.load import wrap

    model = proxy_model(args.vocab, args.hidden, args.layers)
    lm = wrap(model, name="qwen3-proxy")
    result: dict = {
        "depthlens": str(Path(depthlens.__file__).parent),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_before": os.getloadavg(),
            "torch": torch.__version__,
        },
        "model": {"vocab": args.vocab, "hidden": args.hidden, "layers": args.layers},
        "settings": {},
    }
    for setting in settings:
        result["settings"][setting] = measure(setting, lm, model, args)
    result["machine"]["load_after"] = os.getloadavg()
    result["goals"] = goals(result["settings"][settings[0]])
    print(f"== goals, read on {SETTINGS.get(settings[0], settings[0])}", flush=True)
    for row in result["goals"]:
        sign = "≤" if row["kind"] == "max" else "≥"
        print(
            f"{row['goal']}: {row['measured']} ({sign} {row['bound']}: {'met' if row['met'] else 'NOT met'})"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
