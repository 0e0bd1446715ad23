"""What every part of the GPU suite shares (benchmarks/gpu_suite.py, benchmarks/gpu_parts.py): the real shapes, the
guarded, timed run of each part, and the random-init model and record of Qwen3-8B's shape."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

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

    def __init__(self, out: Path, small: bool, deadline_s: float | None = None) -> None:
        self.out, self.small = out, small
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.result: dict = {"small": small, "device": str(self.device), "parts": {}}
        self.began = time.perf_counter()
        self.deadline_s = (
            deadline_s  # parts not begun by then are recorded as skipped (a device lease is short)
        )

    def run(self, name: str, fn: Callable[[], dict]) -> None:
        start = time.perf_counter()
        try:
            if self.deadline_s is not None and start - self.began > self.deadline_s:
                raise TimeoutError(
                    f"not begun: {start - self.began:.0f} s past the start, deadline {self.deadline_s} s"
                )
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


def record(vocab: int, tokens: int, seed: int = 1) -> list[dict]:
    ids = torch.randint(3, vocab, (tokens + 16,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [{"id": "x", "prompt_ids": ids[:16], "completion_ids": ids[16:]}]


def peak_above(suite: Suite, fn: Callable[[], object], base: int) -> float | None:
    if suite.device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats(suite.device)
    fn()
    return round((torch.cuda.max_memory_allocated(suite.device) - base) / 2**30, 3)


def sampler_batch(suite: Suite, model: torch.nn.Module) -> tuple[int, int, list[int], Callable[[], None]]:
    """The sampler rows' batch — n copies of one 32-id prompt, ``new`` tokens each (8 × 16 with ``--small``, else
    48 × 128) — and ``model.generate`` sampling it as the sampler does (temperature 0.6, top-p 0.95, every token)."""
    n, new = (8, 16) if suite.small else (48, 128)
    prompt = list(range(5, 37))
    x = torch.tensor([prompt] * n, device=suite.device)

    def generate() -> None:
        with torch.inference_mode():
            model.generate(
                x, do_sample=True, temperature=0.6, top_p=0.95, max_new_tokens=new, min_new_tokens=new
            )

    return n, new, prompt, generate
