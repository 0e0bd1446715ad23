"""The constants of ``--backend auto`` (``sampling.choose``) and the cost of the in-engine capture, measured.

    python benchmarks/backend_choice.py --model smollm2-135m-instruct --ns 8 16 48 --tokens 64 \
        --out docs/benchmarks/backend_choice_smollm2.json

For one model: the transformers sampler's load time and the vLLM engine's start (its compile cache warm: the
script starts it once beforehand), then tokens/s at each n with no readout, and seconds per read-out token (a
run reading every token out, minus the same run without: the same seeds sample the same tokens), for hf
(float32) and vLLM (the engine's dtype, default bfloat16). ``--plain``: also a vLLM engine without depthlens's
worker (vLLM's own worker class, no capture) — what the capture itself costs per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig


def _timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rates(gen_for, prompt, ns, tokens, reps) -> dict:
    """tokens/s without readout, and seconds per read-out token, at each n."""
    out = {}
    bare, full = gen_for(0), gen_for(None)
    bare.sample(prompt, [0, 1])  # warm-up
    for n in ns:
        seeds = list(range(n))
        made = sum(len(t) for t in bare.sample(prompt, seeds))
        plain_s = _timed(lambda s=seeds: bare.sample(prompt, s), reps)
        read_s = _timed(lambda s=seeds: full.sample(prompt, s), reps)
        out[n] = {
            "tokens": made,
            "tokens_per_s": round(made / plain_s, 1),
            "read_s_per_token": round((read_s - plain_s) / made, 5),
            "load_1min": os.getloadavg()[0],
        }
        print(n, out[n], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16", help="the vLLM engine's dtype")
    parser.add_argument("--ns", type=int, nargs="*", default=[8, 16, 48])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from depthlens.evals.loading import load_task
    from depthlens.models.info import load_info
    from depthlens.models.load import load
    from depthlens.sampling.hf import HFGenerator
    from depthlens.sampling.vllm.engine import JobSize, start_engine, stop_engine
    from depthlens.sampling.vllm.generator import EngineGenerator
    from depthlens.studies.generate import prompt_ids

    result: dict = {"model": args.model, "dtype": args.dtype, "tokens": args.tokens}
    result["hf_load_s"] = round(_timed(lambda: load(args.model, device="cpu"), 2), 2)
    lm = load(args.model, device="cpu")
    prompt = prompt_ids(lm, load_task("reasoning_gym:basic_arithmetic", 1, seed=0)[0])
    sampling = SamplingConfig(temperature=0.6, top_p=0.95, max_new_tokens=args.tokens)

    def hf_gen(window):
        return HFGenerator(lm, SamplingConfig(0.6, 0.95, args.tokens, window), ReadoutConfig())

    result["hf"] = _rates(hf_gen, prompt, args.ns, args.tokens, args.reps)
    info = load_info(args.model)
    config = EngineConfig(backend="vllm", dtype=args.dtype, max_model_len=len(prompt) + args.tokens + 8)
    job = JobSize(max(args.ns), len(prompt) + args.tokens + 8)
    stop_engine(start_engine(info, config, job))  # the compile cache is warm from here on
    start = time.perf_counter()
    engine = start_engine(info, config, job)
    result["vllm_start_s"] = round(time.perf_counter() - start, 1)

    def vllm_gen(window):
        s = SamplingConfig(sampling.temperature, sampling.top_p, args.tokens, window)
        return EngineGenerator(info, s, ReadoutConfig(), config, llm_engine=engine)

    result["vllm"] = _rates(vllm_gen, prompt, args.ns, args.tokens, args.reps)
    stop_engine(engine)
    if args.plain:
        result["vllm_plain"] = _plain(info, config, job, prompt, args)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


def _plain(info, config, job, prompt, args) -> dict:
    """tokens/s of vLLM's own worker class (no capture) through the same generator, no readout asked."""
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from depthlens.sampling.vllm.engine import engine_args, stop_engine
    from depthlens.sampling.vllm.generator import EngineGenerator
    from depthlens.sampling.vllm.scores import TokenScores

    kwargs = engine_args(info, config, job)
    del kwargs["worker_cls"]
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs, logits_processors=[TokenScores]))
    gen = EngineGenerator(
        info, SamplingConfig(0.6, 0.95, args.tokens, 0), ReadoutConfig(), config, llm_engine=engine
    )
    gen.sample(prompt, [0, 1])
    out = {}
    for n in args.ns:
        seeds = list(range(n))
        made = sum(len(t) for t in gen.sample(prompt, seeds))
        seconds = _timed(lambda s=seeds: gen.sample(prompt, s), args.reps)
        out[n] = {"tokens": made, "tokens_per_s": round(made / seconds, 1), "load_1min": os.getloadavg()[0]}
        print("plain", n, out[n], flush=True)
    stop_engine(engine)
    return out


if __name__ == "__main__":
    main()
