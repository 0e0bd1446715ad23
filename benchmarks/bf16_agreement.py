"""The bfloat16 engine's in-engine readout against the float32 transformers readout of the same token ids: the share
of equal settling depths and deep flags, max and mean |ΔJSD|, with the engine's own lens and with a float32 lens
(``RequestReadout.float32_lens``: float32 copies of the final norm and unembedding applied to the engine's bfloat16
states), and what each lens costs (readout seconds = a timed run minus the paired run of the same seeds without
readout; the tokens are checked identical).

    python benchmarks/bf16_agreement.py --model smollm2-135m-instruct --n 16 --tokens 64 --reps 2 \
        --out docs/benchmarks/bf16_agreement_smollm2.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import torch

from depthlens.config import DTRConfig, EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.metrics.dtr import deep_flags, settling_depth
from depthlens.metrics.token_table import reduce_readout
from depthlens.models.info import info_of
from depthlens.models.load import load
from depthlens.readout.stream import TokenSequence, iter_readout
from depthlens.studies.score_inputs import as_token_ids

MESSAGE = "Calculate 5 - 3 - 6.\n\nPlease reason step by step, and put your final answer within \\boxed{}."


def _timed(gen, prompt, seeds) -> tuple[list, float]:
    start = time.perf_counter()
    traces = gen.sample(prompt, seeds)
    return traces, time.perf_counter() - start


def agreement(lm, prompt, traces, dtr: DTRConfig) -> dict:
    """Engine rows against ``iter_readout`` + ``reduce_readout`` of the same ids (float32 transformers)."""
    traces = [t for t in traces if t.token_ids]  # a response that ended at once has no rows on either side
    seqs = [TokenSequence(prompt, t.token_ids) for t in traces]
    ref = reduce_readout(iter_readout(lm, seqs, ReadoutConfig()), len(seqs), lm.n_layers, "jsd")
    ours = torch.cat([torch.tensor(t.divergence) for t in traces])
    theirs = torch.cat([r.divergence for r in ref])
    depth, ref_depth = settling_depth(ours, dtr.g), settling_depth(theirs, dtr.g)
    deep = deep_flags(depth, lm.n_layers, dtr.rho)
    ref_deep = deep_flags(ref_depth, lm.n_layers, dtr.rho)
    diff = (ours - theirs).abs()
    return {
        "tokens": int(depth.numel()),
        "equal_settling_share": round(float((depth == ref_depth).float().mean()), 4),
        "max_settling_gap_layers": int((depth - ref_depth).abs().max()),
        "equal_deep_share": round(float((deep == ref_deep).float().mean()), 4),
        "max_abs_djsd_bits": round(float(diff.max()), 5),
        "mean_abs_djsd_bits": round(float(diff.mean()), 6),
    }


def main() -> None:
    from depthlens.sampling.vllm.engine import JobSize, start_engine
    from depthlens.sampling.vllm.generator import EngineGenerator

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    lm = load(args.model, device="cpu", dtype="float32")
    info = info_of(lm)
    prompt = as_token_ids(
        lm.tokenizer.apply_chat_template(
            [{"role": "user", "content": MESSAGE}], add_generation_prompt=True, tokenize=True
        )
    )
    config = EngineConfig(backend="vllm", dtype="bfloat16")
    engine = start_engine(info, config, JobSize(args.n, len(prompt) + args.tokens))
    sampling = SamplingConfig(max_new_tokens=args.tokens, readout_tokens=None)
    gen = EngineGenerator(info, sampling, ReadoutConfig(), config, llm_engine=engine)
    bare = EngineGenerator(
        info, dataclasses.replace(sampling, readout_tokens=0), ReadoutConfig(), config, llm_engine=engine
    )
    seeds = list(range(args.n))
    gen.sample(prompt, seeds[:2])  # warm-up
    result: dict = {
        "model": args.model,
        "engine_dtype": "bfloat16",
        "n": args.n,
        "max_new_tokens": args.tokens,
        "load_1min_start": round(os.getloadavg()[0], 1),
        "lens": {},
    }
    base = gen.request_readout
    for lens in ("engine", "float32"):
        gen.request_readout = dataclasses.replace(base, float32_lens=lens == "float32")
        readout_s = []
        for _ in range(args.reps):
            traces, with_s = _timed(gen, prompt, seeds)
            plain, without_s = _timed(bare, prompt, seeds)
            assert [t.token_ids for t in plain] == [t.token_ids for t in traces], (
                "the readout changed the tokens"
            )
            readout_s.append(round(with_s - without_s, 2))
        row = {"readout_seconds": readout_s, "generated_tokens": sum(len(t) for t in traces)}
        row.update(agreement(lm, prompt, traces, DTRConfig()))
        result["lens"][lens] = row
        print(lens, row, flush=True)
    result["load_1min_end"] = round(os.getloadavg()[0], 1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
