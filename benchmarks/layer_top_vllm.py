"""What ``--layer-top-k K`` costs inside the vLLM engine (docs/performance.md): tokens/s of the same sampled
responses with and without each layer's top-k, the worker reading every token out; with ``--worker``, the
worker's readout of one decode step alone (``lens.read_rows`` on the model's shapes), each K in turn, many times.

    python benchmarks/layer_top_vllm.py --model smollm2-135m-instruct --dtype float32 --n 8 --max-new-tokens 64 \
        --ks 0 5 20 --reps 3
    python benchmarks/layer_top_vllm.py --worker --n 8 --ks 0 5 20 --reps 40

``--worker``: the norm and unembedding are random modules of the model's sizes (the arithmetic, not the values,
is what is timed), fed c = ``--n`` rows of L − 1 states, blocked as ``request_readout`` blocks them. Without it: one
engine (compiled, as ``generate --backend vllm`` starts it; its start is reported, not counted); one warm-up
call; then per repetition each K in turn with the same seeds, so every K samples the same tokens (checked) and
the difference is the top-k's: a softmax and a top-k per layer on the logits the divergences already read, the
[L × K] ids and probabilities kept in the worker until taken, and their trip to the driver.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig


def worker(info: object, ks: list[int], rows: int, reps: int) -> dict[str, object]:
    """Seconds of one decode step's readout (``read_rows``) of ``rows`` positions for each K, interleaved."""
    import torch

    from depthlens.sampling.vllm.lens import EngineLens, read_rows
    from depthlens.sampling.vllm.settings import request_readout

    n_layers, d, vocab = info.n_layers, info.hidden_size, len(info.tokenizer)
    torch.manual_seed(0)
    norm, head = torch.nn.RMSNorm(d), torch.nn.Linear(d, vocab, bias=False)
    lens = EngineLens(norm, head, vocab)
    hidden = [torch.randn(rows, d) for _ in range(n_layers - 1)]
    final = torch.randn(rows, d)
    block = {k: request_readout(ReadoutConfig(layer_top_k=k), EngineConfig("vllm"), info).rows for k in ks}
    seconds: dict[int, list[float]] = {k: [] for k in ks}
    with torch.inference_mode():
        for rep in range(reps + 1):
            for k in ks:
                t0 = time.perf_counter()
                read_rows(lens, hidden, final, ("jsd",), block[k], top_k=k)
                if rep:  # the first round warms up
                    seconds[k].append(time.perf_counter() - t0)
    base = statistics.median(seconds[ks[0]])
    return {
        str(k): {
            "median_ms": 1e3 * statistics.median(s),
            "vs_first": statistics.median(s) / base,
            "block_rows": block[k],
        }
        for k, s in seconds.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="float32", help="the engine's weights dtype")
    parser.add_argument("--n", type=int, default=8, help="responses per call")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 5, 20], help="layer_top_k values (0: none)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--max-model-len", type=int, default=512, help="the engine's (512: the tests' compile cache)"
    )
    parser.add_argument("--worker", action="store_true", help="time the worker's readout of one step alone")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()

    from depthlens.models.info import load_info

    info = load_info(args.model)
    if args.worker:
        rows = worker(info, args.ks, args.n, args.reps)
        result = {"model": args.model, "rows_per_step": args.n, "n_layers": info.n_layers, "worker": rows}
        print(json.dumps(result, indent=2))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
        return

    from depthlens.sampling.vllm.engine import JobSize, start_engine
    from depthlens.sampling.vllm.generator import EngineGenerator

    engine = EngineConfig(backend="vllm", dtype=args.dtype, max_model_len=args.max_model_len)
    started = time.perf_counter()
    llm = start_engine(info, engine, JobSize(args.n, args.max_model_len))
    start_s = time.perf_counter() - started
    prompt = info.tokenizer("Count from one to forty in words: one, two,")["input_ids"]
    sampling = SamplingConfig(
        temperature=1.0, top_p=0.95, max_new_tokens=args.max_new_tokens, readout_tokens=None
    )
    seeds = list(range(args.n))
    gens = {
        k: EngineGenerator(info, sampling, ReadoutConfig(layer_top_k=k), engine, llm_engine=llm)
        for k in args.ks
    }
    gens[args.ks[0]].sample(prompt, seeds)  # warm-up
    seconds: dict[int, list[float]] = {k: [] for k in args.ks}
    tokens: dict[int, list[list[int]]] = {}
    for _ in range(args.reps):
        for k, gen in gens.items():
            t0 = time.perf_counter()
            traces = gen.sample(prompt, seeds)
            seconds[k].append(time.perf_counter() - t0)
            tokens.setdefault(k, [t.token_ids for t in traces])
            if tokens[k] != tokens[args.ks[0]]:
                raise SystemExit(
                    f"K = {k} sampled other tokens than K = {args.ks[0]}: the timings compare other work"
                )
    total = sum(len(t) for t in tokens[args.ks[0]])
    rows = {
        str(k): {
            "median_s": statistics.median(s),
            "min_s": min(s),
            "max_s": max(s),
            "tokens_per_s": total / statistics.median(s),
            "worker_bytes_per_token": info.n_layers * k * 8,  # int32 id + float32 probability, until taken
        }
        for k, s in seconds.items()
    }
    base = rows[str(args.ks[0])]["median_s"]
    for row in rows.values():
        row["vs_first"] = row["median_s"] / base
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "n": args.n,
        "tokens": total,
        "n_layers": info.n_layers,
        "engine_start_s": start_s,
        "rows": rows,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
