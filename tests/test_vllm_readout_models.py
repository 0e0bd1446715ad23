"""The in-engine readout on the other catalogue models (compiled, float32), against the transformers readout of the
same token ids: Qwen2.5-Coder-0.5B (EAGLE-3 aux capture, a padded vocabulary cut to the tokenizer's),
Gemma-3-270m (no aux path: the in-graph hook capture) and the same Gemma with its final logits soft-capped
(Gemma-3-270m's own config sets no soft-capping; the copy sets 30, as Gemma 2 does, so ``compute_logits``'s cap
is exercised on both sides).

One engine at a time (module-scoped, one per model); each model's first start compiles for minutes, and the three
take 3-8 min on a 2-core CPU, so the module carries the ``vllm_models`` marker, which ``make test`` deselects: run
it with ``pytest -m vllm_models tests/test_vllm_readout_models.py``.
"""

from __future__ import annotations

import json

import pytest
import torch

from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.metrics.dtr import settling_depth
from depthlens.metrics.token_table import reduce_readout
from depthlens.models import catalogue
from depthlens.readout.stream import TokenSequence, iter_readout
from depthlens.sampling.choose import vllm_available
from depthlens.sampling.hf import HFGenerator

pytestmark = [
    pytest.mark.vllm_models,  # deselected by default (pyproject addopts): pytest -m vllm_models
    pytest.mark.integration,
    pytest.mark.skipif(not vllm_available(), reason="needs the vllm extra: pip install 'depthlens[vllm]'"),
]

ENGINE = EngineConfig(backend="vllm", dtype="float32", max_model_len=256)
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=6, readout_tokens=None)
BITS = 1e-4  # the bound; float32 kernels differ in summation order only (~1e-5 bits measured)
MODELS = {"qwen": "qwen2.5-coder-0.5b-instruct", "gemma": "gemma3-270m", "gemma-softcap": "gemma3-270m"}
CAPTURE = {"qwen": "aux", "gemma": "hooks", "gemma-softcap": "hooks"}


def _softcapped(tmp_path_factory, name: str) -> str:
    """A directory that is ``name``'s catalogue copy with ``final_logit_softcapping`` = 30 in its config."""
    source = catalogue.converted_dir(name)
    target = tmp_path_factory.mktemp("softcap")
    for path in source.iterdir():
        if path.name != "config.json":
            (target / path.name).symlink_to(path)
    config = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": 30.0}))
    return str(target)


@pytest.fixture(scope="module", params=list(MODELS))
def case(request, tmp_path_factory):
    from depthlens.models.info import load_info
    from depthlens.models.load import load
    from depthlens.sampling.vllm.engine import JobSize, start_engine

    name = MODELS[request.param]
    if not catalogue.is_installed(name):
        pytest.skip(f"{name} not installed; depthlens models --install {name}")
    model = _softcapped(tmp_path_factory, name) if request.param == "gemma-softcap" else name
    lm = load(model, device="cpu", dtype="float32")
    info = load_info(model)
    engine = start_engine(info, ENGINE, JobSize(2, 256))
    yield request.param, lm, info, engine
    del engine


def test_generation_and_prefill_equal_the_transformers_readout(case):
    from depthlens.sampling.vllm.engine import readout_capture
    from depthlens.sampling.vllm.generator import EngineGenerator
    from depthlens.sampling.vllm.prefill import EngineScorer

    key, lm, info, engine = case
    assert readout_capture(engine) == CAPTURE[key]
    if key == "gemma-softcap":
        assert lm.parts.logit_post is not None and lm.parts.logit_post.scale == 30.0
    prompt = info.tokenizer("The capital of France is")["input_ids"]
    readout = ReadoutConfig(also=("kl",))
    ours = EngineGenerator(info, GREEDY, readout, ENGINE, llm_engine=engine).sample(prompt, [0])[0]
    hf = HFGenerator(lm, GREEDY, readout).sample(prompt, [0])[0]
    assert ours.token_ids == hf.token_ids
    div, hf_div = torch.tensor(ours.divergence), torch.tensor(hf.divergence)
    assert (div - hf_div).abs().max() <= BITS
    assert torch.equal(settling_depth(div, 0.5), settling_depth(hf_div, 0.5))
    assert torch.allclose(torch.tensor(ours.log_prob), torch.tensor(hf.log_prob), atol=1e-4)

    seq = TokenSequence(prompt, info.tokenizer(" Paris, and that of Spain is Madrid.")["input_ids"])
    table = EngineScorer(info, ReadoutConfig(), ENGINE, llm_engine=engine).tables([seq])[0]
    expected = reduce_readout(iter_readout(lm, [seq], ReadoutConfig()), 1, lm.n_layers, "jsd")[0]
    assert (table.divergence - expected.divergence).abs().max() <= BITS
    assert torch.equal(settling_depth(table.divergence, 0.5), settling_depth(expected.divergence, 0.5))
    assert torch.allclose(table.log_prob, expected.log_prob, atol=1e-4)
