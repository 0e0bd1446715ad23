"""Tensor parallelism on CPU worker processes (gloo): the in-engine readout at TP = 3 on SmolLM2 (9 heads, 3 KV
heads) and TP = 2 on Qwen2.5-Coder-0.5B (14 heads, 2 KV heads) gives the values TP = 1 gives.

Under TP each rank holds a shard of the unembedding; ``compute_logits`` all-gathers the vocabulary, every rank
runs the same lens calls (each is a collective) and rank 0 keeps the rows. Slow: two engines per model, and a
TP engine's first start compiles in every worker (~9 min for TP = 3 here; ~1 min once cached), so the module
carries the ``tp`` marker, which ``make test`` deselects: run it with ``pytest -m tp tests/test_vllm_tp.py``.
"""

from __future__ import annotations

import pytest
import torch

from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.metrics.dtr import settling_depth
from depthlens.models import catalogue
from depthlens.readout.stream import TokenSequence
from depthlens.sampling.choose import vllm_available

pytestmark = [
    pytest.mark.tp,  # deselected by default (pyproject addopts); run with: pytest -m tp tests/test_vllm_tp.py
    pytest.mark.integration,
    pytest.mark.skipif(not vllm_available(), reason="needs the vllm extra: pip install 'depthlens[vllm]'"),
]

CASES = {"smollm2-tp3": ("smollm2-135m-instruct", 3), "qwen-tp2": ("qwen2.5-coder-0.5b-instruct", 2)}
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=6, readout_tokens=None)


def _read(info, tensor_parallel_size):
    """Greedy tokens, their divergences (JSD, KL) and a teacher-forced record's, on an engine of that TP size."""
    from depthlens.sampling.vllm.engine import JobSize, start_engine, stop_engine
    from depthlens.sampling.vllm.generator import EngineGenerator
    from depthlens.sampling.vllm.prefill import EngineScorer

    config = EngineConfig(
        backend="vllm", dtype="float32", max_model_len=256, tensor_parallel_size=tensor_parallel_size
    )
    engine = start_engine(info, config, JobSize(2, 256))
    try:
        prompt = info.tokenizer("The capital of France is")["input_ids"]
        trace = EngineGenerator(info, GREEDY, ReadoutConfig(also=("kl",)), config, llm_engine=engine).sample(
            prompt, [0]
        )[0]
        seq = TokenSequence(prompt, info.tokenizer(" Paris, and that of Spain is Madrid.")["input_ids"])
        table = EngineScorer(info, ReadoutConfig(), config, llm_engine=engine).tables([seq])[0]
    finally:
        stop_engine(engine)
    return trace, table


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_parallel_readout_equals_one_worker(case):
    from depthlens.models.info import load_info

    name, size = CASES[case]
    if not catalogue.is_installed(name):
        pytest.skip(f"{name} not installed; depthlens models --install {name}")
    info = load_info(name)
    one, one_table = _read(info, 1)
    many, many_table = _read(info, size)
    assert many.token_ids == one.token_ids
    # float32; the sharded matmuls sum in another order than one worker's (≤ 1e-5 bits measured)
    div, ref = torch.tensor(many.divergence), torch.tensor(one.divergence)
    assert (div - ref).abs().max() <= 1e-4
    assert torch.equal(settling_depth(div, 0.5), settling_depth(ref, 0.5))
    assert torch.allclose(torch.tensor(many.also["kl"]), torch.tensor(one.also["kl"]), rtol=1e-4, atol=5e-4)
    assert (many_table.divergence - one_table.divergence).abs().max() <= 1e-4
    assert torch.equal(settling_depth(many_table.divergence, 0.5), settling_depth(one_table.divergence, 0.5))
