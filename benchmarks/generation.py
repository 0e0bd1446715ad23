"""Sampling throughput with and without the same-pass logit-lens readout (docs/performance.md).

    python benchmarks/generation.py --model smollm2-135m-instruct --n 8 --max-new-tokens 128
    python benchmarks/generation.py --compare 8 16 48 --max-new-tokens 128 --out docs/benchmarks/generation_vs_hf.json

    python benchmarks/generation.py --backend hf vllm --model smollm2-135m-instruct --dtype float32 --ns 8 16 48 \
        --max-new-tokens 128 --thinkn-tokens 512 --thinkn-n 16 --out docs/benchmarks/backends.json

With ``--backend``: one model and dtype per call; tokens/s of each backend at each n, hf and vllm alternating per
n, wall and CPU seconds, after a warm-up call (vLLM's engine start is reported, not counted); with
``--readout-tokens`` each timing is paired with one of the same seeds without the readout (the same tokens), and
the difference is the readout's seconds (both backends read out inside their steps: hf in its forward pass, vLLM
in its worker). Think@n vs Cons@n wall and CPU time per backend (readout of the 50-token prefix included) at
``--thinkn-n`` with ``--thinkn-tokens``.

With ``--compare``: for each n, depthlens's batched sampler against ``model.generate`` (same sampling settings,
``num_return_sequences=n``), and the Think@n two-phase flow (prefixes for all n, finish the top half) against
Cons@n (finish all n), both reading out the 50-token prefix.

Greedy-free sampling (temperature 0.6, top-p 0.95) of n responses to one chat prompt, once per readout window
(none, the first 50 tokens, every token); the sampled tokens are identical across windows (checked), so the
timings compare the same work plus the readout.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import time

from depthlens.config import SamplingConfig
from depthlens.models.load import load
from depthlens.sampling.hf import HFGenerator
from depthlens.studies.score_inputs import as_token_ids


def _hf_generate(lm, prompt: list[int], n: int, max_new_tokens: int, end_ids: set[int]) -> tuple[float, int]:
    import torch

    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(
            torch.tensor([prompt]),
            do_sample=True,
            temperature=0.6,
            top_p=0.95,
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            eos_token_id=sorted(end_ids),
            pad_token_id=lm.tokenizer.pad_token_id or 0,
        )
    seconds = time.perf_counter() - start
    tokens = 0
    for row in out[:, len(prompt) :].tolist():  # count up to and including each row's end token
        ends = [i for i, t in enumerate(row) if t in end_ids]
        tokens += ends[0] + 1 if ends else len(row)
    return seconds, tokens


def compare(lm, prompt: list[int], ns: list[int], max_new_tokens: int) -> list[dict]:
    from depthlens.config import DTRConfig, VotingConfig
    from depthlens.evals.answers import extract_answer
    from depthlens.sampling.backend import end_token_ids
    from depthlens.studies.thinkn import think_at_n_live

    def key(trace) -> str | None:
        text = lm.tokenizer.decode(trace.token_ids, skip_special_tokens=True)
        answer = extract_answer(text, finished=trace.finish != "length")
        return answer.text if answer else None

    rows = []
    for n in ns:
        seeds = list(range(n))
        plain = HFGenerator(lm, SamplingConfig(max_new_tokens=max_new_tokens, readout_tokens=0))
        start = time.perf_counter()
        ours = sum(len(t) for t in plain.sample(prompt, seeds))
        ours_s = time.perf_counter() - start
        hf_s, hf_tokens = _hf_generate(lm, prompt, n, max_new_tokens, end_token_ids(lm))
        prefix = HFGenerator(lm, SamplingConfig(max_new_tokens=max_new_tokens, readout_tokens=50))
        start = time.perf_counter()
        cons_tokens = sum(len(t) for t in prefix.sample(prompt, seeds))
        cons_s = time.perf_counter() - start
        start = time.perf_counter()
        _, _, think_tokens = think_at_n_live(
            prefix, prompt, seeds, VotingConfig(n=n, eta=0.5, rank_prefix=50), DTRConfig(), key
        )
        think_s = time.perf_counter() - start
        row = {
            "n": n,
            "depthlens_tokens_per_s": round(ours / ours_s, 1),
            "hf_generate_tokens_per_s": round(hf_tokens / hf_s, 1),
            "speedup_vs_hf_generate": round((ours / ours_s) / (hf_tokens / hf_s), 2),
            "cons_at_n_seconds": round(cons_s, 1),
            "cons_at_n_tokens": cons_tokens,
            "think_at_n_seconds": round(think_s, 1),
            "think_at_n_tokens": think_tokens,
            "think_over_cons_wall": round(think_s / cons_s, 2),
        }
        rows.append(row)
        print(row)
    return rows


LONG = "Write a long, detailed essay on the history of mathematics, from Babylon to the computer age."


def _generator(name: str, lm, hf_lm, dtype: str, sampling, engine):
    from depthlens.config import EngineConfig
    from depthlens.models.info import info_of
    from depthlens.sampling.vllm.generator import EngineGenerator

    if name == "hf":
        return HFGenerator(hf_lm, sampling)
    config = EngineConfig(
        backend="vllm", dtype=dtype, enforce_eager=engine.eager, max_model_len=engine.max_len
    )
    return EngineGenerator(info_of(lm), sampling, engine=config, llm_engine=engine.llm)


@contextlib.contextmanager
def _readout_clock(gen):
    """Kept for the Think@n rows' shape: both backends read out inside their steps now (nothing to clock apart)."""
    yield [0.0]


def _timed_sample(gen, prompt: list[int], seeds: list[int], bare=None) -> tuple[list, float, float, float]:
    """(traces, total seconds, of which readout seconds, CPU seconds of this process — on a shared machine the
    fairer figure: wall time there is mostly waiting for a core). ``bare``: the same generator without the
    readout; the readout's seconds are the difference of the two runs (the same seeds sample the same tokens)."""
    start, cpu = time.perf_counter(), time.process_time()
    traces = gen.sample(prompt, seeds)
    total, cpu = time.perf_counter() - start, time.process_time() - cpu
    readout = 0.0
    if bare is not None:
        start = time.perf_counter()
        plain = bare.sample(prompt, seeds)
        readout = total - (time.perf_counter() - start)
        assert [t.token_ids for t in plain] == [t.token_ids for t in traces], "the readout changed the tokens"
    return traces, total, readout, cpu


def _load_time() -> float:
    return round(os.getloadavg()[0], 1)


def backends(args) -> dict:
    """One model, one dtype per call (one engine per process); hf and vllm alternate per n and repetition, so
    both see the same machine load."""
    import types

    from depthlens.config import DTRConfig, EngineConfig, VotingConfig
    from depthlens.evals.answers import extract_answer
    from depthlens.models.info import info_of
    from depthlens.sampling.vllm.engine import JobSize, start_engine
    from depthlens.studies.thinkn import think_at_n_live

    dtype = args.dtype
    lm = load(
        args.model, dtype=args.hf_dtype
    )  # hf's model; the vLLM backend uses only its tokenizer and config
    hf_lm = lm
    max_len = max(2048, args.thinkn_tokens + 256)  # prompt + the longest response
    start = time.perf_counter()
    config = EngineConfig(backend="vllm", dtype=dtype, enforce_eager=not args.compile, max_model_len=max_len)
    engine = types.SimpleNamespace(
        llm=start_engine(info_of(lm), config, JobSize(max([*args.ns, args.thinkn_n, 2]), max_len)),
        max_len=max_len,
        eager=not args.compile,
    )
    result: dict = {
        "model": args.model,
        "dtype": dtype,
        "hf_dtype": args.hf_dtype,
        "compiled_engine": args.compile,
        "max_new_tokens": args.max_new_tokens,
        "readout_tokens": args.readout_tokens,
        "vllm_engine_start_s": round(time.perf_counter() - start, 1),
        "rows": [],
        "thinkn": [],
    }
    prompt = _chat_prompt(lm, MESSAGE)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, readout_tokens=args.readout_tokens)
    gens = {name: _generator(name, lm, hf_lm, dtype, sampling, engine) for name in args.backend}
    bare = dataclasses.replace(sampling, readout_tokens=0)
    bares = {
        name: _generator(name, lm, hf_lm, dtype, bare, engine) if args.readout_tokens else None
        for name in args.backend
    }
    for gen in gens.values():
        gen.sample(prompt, [0, 1])  # warm-up
    for n in args.ns:
        for rep in range(args.reps):
            for name, gen in gens.items():
                traces, seconds, readout_s, cpu_s = _timed_sample(gen, prompt, list(range(n)), bares[name])
                tokens = sum(len(t) for t in traces)
                row = {
                    "backend": name,
                    "n": n,
                    "rep": rep,
                    "tokens": tokens,
                    "seconds": round(seconds, 2),
                    "readout_seconds": round(readout_s, 2),
                    "tokens_per_s_sampling": round(tokens / (seconds - readout_s), 1),
                    "tokens_per_s_with_readout": round(tokens / seconds, 1),
                    "cpu_seconds": round(cpu_s, 1),
                    "tokens_per_cpu_s": round(tokens / cpu_s, 1),
                    "load_1min": _load_time(),
                }
                result["rows"].append(row)
                print(row, flush=True)
    if args.thinkn_tokens:
        long_prompt = _chat_prompt(lm, LONG)
        n = args.thinkn_n
        sampling = SamplingConfig(max_new_tokens=args.thinkn_tokens, readout_tokens=50)

        def key(trace) -> str | None:
            found = extract_answer(lm.tokenizer.decode(trace.token_ids, skip_special_tokens=True))
            return found.text if found else None

        for name in args.backend:
            gen = _generator(name, lm, hf_lm, dtype, sampling, engine)
            cons, cons_s, cons_readout, cons_cpu = _timed_sample(gen, long_prompt, list(range(n)))
            voting = VotingConfig(n=n, eta=0.5, rank_prefix=50)
            with _readout_clock(gen) as spent:
                start, cpu = time.perf_counter(), time.process_time()
                _, _, think_tokens = think_at_n_live(
                    gen, long_prompt, list(range(n)), voting, DTRConfig(), key
                )
            think_s, think_cpu = time.perf_counter() - start, time.process_time() - cpu
            row = {
                "backend": name,
                "n": n,
                "cons_at_n_seconds": round(cons_s, 1),
                "cons_at_n_readout_seconds": round(cons_readout, 1),
                "cons_at_n_tokens": sum(len(t) for t in cons),
                "think_at_n_seconds": round(think_s, 1),
                "think_at_n_readout_seconds": round(spent[0], 1),
                "think_at_n_tokens": think_tokens,
                "think_over_cons_wall": round(think_s / cons_s, 2),
                "cons_at_n_cpu_seconds": round(cons_cpu, 1),
                "think_at_n_cpu_seconds": round(think_cpu, 1),
                "think_over_cons_cpu": round(think_cpu / cons_cpu, 2),
                "load_1min": _load_time(),
            }
            result["thinkn"].append(row)
            print(row, flush=True)
    return result


MESSAGE = "Calculate 5 - 3 - 6.\n\nPlease reason step by step, and put your final answer within \\boxed{}."


def _chat_prompt(lm, message: str) -> list[int]:
    return as_token_ids(
        lm.tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument(
        "--compare", type=int, nargs="*", help="n values: vs model.generate and Think@n vs Cons@n"
    )
    parser.add_argument("--backend", nargs="*", choices=["hf", "vllm"], help="compare generation backends")
    parser.add_argument("--dtype", default="float32", help="with --backend: the vLLM engine's weights dtype")
    parser.add_argument(
        "--hf-dtype", default="float32", help="with --backend: the hf sampler's weights dtype"
    )
    parser.add_argument("--ns", type=int, nargs="*", default=[8, 16, 48], help="with --backend")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="with --backend: vLLM's compiled engine (default: --enforce-eager)",
    )
    parser.add_argument("--reps", type=int, default=1, help="with --backend: repetitions per n")
    parser.add_argument(
        "--readout-tokens",
        type=int,
        default=0,
        help="with --backend: all-layer readout of the first N tokens",
    )
    parser.add_argument(
        "--thinkn-tokens", type=int, default=0, help="with --backend: Think@n vs Cons@n length"
    )
    parser.add_argument("--thinkn-n", type=int, default=16, help="with --backend: Think@n vs Cons@n n")
    args = parser.parse_args()
    if args.backend:
        result = backends(args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
        return
    lm = load(args.model)
    prompt = _chat_prompt(lm, MESSAGE)
    if args.compare:
        rows = compare(lm, prompt, args.compare, args.max_new_tokens)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(
                    {"model": args.model, "max_new_tokens": args.max_new_tokens, "rows": rows}, f, indent=2
                )
        return
    results, reference = [], None
    for window in (0, 50, None):
        gen = HFGenerator(lm, SamplingConfig(max_new_tokens=args.max_new_tokens, readout_tokens=window))
        start = time.perf_counter()
        traces = gen.sample(prompt, list(range(args.n)))
        seconds = time.perf_counter() - start
        tokens = sum(len(t) for t in traces)
        ids = [t.token_ids for t in traces]
        reference = reference or ids
        assert ids == reference, "the readout window changed what was sampled"
        row = {
            "readout_tokens": "all" if window is None else window,
            "seconds": round(seconds, 2),
            "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1),
        }
        results.append(row)
        print(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"model": args.model, "n": args.n, "max_new_tokens": args.max_new_tokens, "runs": results},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
