"""``--backend auto``'s decision and the vLLM engine's job-sized KV cache: pure functions, no engine started."""

from __future__ import annotations

import math
import types

import pytest

from depthlens.config import EngineConfig
from depthlens.sampling.choose import HF, VLLM, Costs, Job, break_even_tokens, pick_backend


def test_small_jobs_go_to_hf_large_ones_to_vllm():
    small = Job(responses=8, max_new_tokens=32, concurrent=8, readout_tokens=16)  # the README's first job
    large = Job(responses=48 * 30, max_new_tokens=512, concurrent=48, readout_tokens=50)
    assert pick_backend("smollm2-135m-instruct", small, vllm_installed=True, cuda=False) == "hf"
    assert pick_backend("smollm2-135m-instruct", large, vllm_installed=True, cuda=False) == "vllm"
    # the decision is the faster of the two estimates, and flips at the break-even
    n = 16
    tokens = break_even_tokens(n)
    below, above = Job(int(tokens * 0.9) // 100, 100, n, 0), Job(int(tokens * 1.1) // 100 + 1, 100, n, 0)
    assert pick_backend("m", below, True, False) == "hf" and pick_backend("m", above, True, False) == "vllm"


def test_never_vllm_where_it_cannot_run_the_job():
    large = Job(10_000, 512, 48)
    assert pick_backend("/models/SmolLM2.Q4_1.gguf", large, vllm_installed=True, cuda=False) == "hf"
    assert pick_backend("/models/SmolLM2.Q4_1.gguf", large, vllm_installed=True, cuda=True) == "hf"
    assert pick_backend("m", large, vllm_installed=False, cuda=True) == "hf"
    assert pick_backend("m", None, vllm_installed=True, cuda=False) == "hf"  # unknown size: no engine start
    assert pick_backend("m", Job(1, 8, 1), vllm_installed=True, cuda=True) == "vllm"


def test_costs_interpolate_between_measured_concurrency():
    costs = Costs(10.0, ((8, 80.0), (32, 160.0)), 0.01)
    assert costs.rate(8) == 80.0 and costs.rate(32) == 160.0 and costs.rate(64) == 160.0
    assert costs.rate(16) == pytest.approx(120.0)  # halfway in log n
    assert costs.rate(4) == 40.0  # fewer rows per step than measured: proportionally fewer tokens per step
    job = Job(10, 80, 8, 20)
    assert costs.seconds(job) == pytest.approx(10.0 + 800 / 80.0 + 200 * 0.01)
    assert math.isinf(break_even_tokens(8, hf=VLLM, vllm=HF))  # a slower engine never catches up


def test_resolve_backend_auto_uses_the_job(monkeypatch):
    import depthlens.sampling.choose as generate

    monkeypatch.delenv(generate.AUTO_ENV, raising=False)
    monkeypatch.setattr(generate, "vllm_available", lambda: True)
    large = Job(48 * 30, 512, 48, 50)
    assert generate.resolve_backend("auto", model="smollm2-135m-instruct", job=large) in ("vllm", "hf")
    assert generate.resolve_backend("auto", model="x.gguf", job=large) == "hf"
    assert generate.resolve_backend("auto", recorded="vllm", model="x", job=Job(1, 1, 1)) == "vllm"
    monkeypatch.setenv(generate.AUTO_ENV, "vllm")
    assert generate.resolve_backend("auto", job=Job(1, 1, 1)) == "vllm"


def _info(layers=30, kv_heads=3, heads=9, hidden=576, context=8192):
    from depthlens.models.info import ModelInfo

    config = types.SimpleNamespace(
        num_hidden_layers=layers,
        num_key_value_heads=kv_heads,
        num_attention_heads=heads,
        hidden_size=hidden,
        max_position_embeddings=context,
        vocab_size=49152,
    )
    return ModelInfo("m", "/m", tokenizer=[0] * 49152, config=config, end_ids=frozenset())


def test_the_cpu_kv_cache_is_sized_from_the_job(monkeypatch):
    import torch

    from depthlens.models.info import kv_bytes_per_token, kv_cache_bytes
    from depthlens.sampling.vllm.engine import JobSize, engine_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = _info()
    per_token = kv_bytes_per_token(info.config, "bfloat16")
    assert per_token == 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 KV heads of 64, bfloat16
    job = JobSize(requests=8, longest=32 + 100)
    args = engine_args(info, EngineConfig(backend="vllm"), job)
    assert args["max_model_len"] == 2048  # a bucket vLLM's compile cache keeps (it hashes the length)
    # sized for the job (8 × 132 tokens) but never below one max_model_len sequence, which vLLM requires
    floor = kv_cache_bytes(per_token, 1, 2048)
    assert (
        args["kv_cache_memory_bytes"] == max(kv_cache_bytes(per_token, 8, 132), floor) < 100 * 2**20
    )  # not 4 GiB
    assert kv_cache_bytes(per_token, 8, 132) == int((8 * 2 + 1) * 128 * per_token * 1.25)
    big = engine_args(info, EngineConfig(backend="vllm"), JobSize(48, 2100))
    assert big["max_model_len"] == 4096 and big["kv_cache_memory_bytes"] == kv_cache_bytes(
        per_token, 48, 2100
    )
    assert engine_args(_info(context=1024), EngineConfig(backend="vllm"), job)["max_model_len"] == 1024
    explicit = engine_args(info, EngineConfig(backend="vllm", kv_cache_gib=0.5, max_model_len=4096), job)
    assert explicit["kv_cache_memory_bytes"] == 2**29 and explicit["max_model_len"] == 4096
    unknown = engine_args(info, EngineConfig(backend="vllm", max_model_len=1024))
    assert unknown["kv_cache_memory_bytes"] == kv_cache_bytes(per_token, 8, 1024)
    assert args["worker_cls"].endswith("ReadoutCPUWorker") and args["use_tqdm_on_load"] is False
