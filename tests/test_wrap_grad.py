"""``wrap`` leaves the caller's model as it was (issue 57, item 3): parameters that require grad still do after a
wrap and every kind of read, none of them gets a ``.grad``, and no read builds an autograd graph (reads run under
``torch.inference_mode``)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import depthlens
from depthlens.models.load import wrap
from tests.conftest import TINY_CONFIGS, CharTokenizer

RECORDS = [
    {"id": "a", "prompt_ids": [3, 4, 5], "completion_ids": [6, 7, 8, 9]},
    {"id": "b", "prompt_ids": [3], "completion_ids": [10, 11]},
]


def _trainable() -> torch.nn.Module:
    """A fresh tiny llama as a caller has it mid-training: every parameter requires grad, one frozen on purpose."""
    config = AutoConfig.for_model("llama", **TINY_CONFIGS["llama"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.model.embed_tokens.weight.requires_grad_(False)  # a caller's own choice, kept as well
    return model


def _flags(model: torch.nn.Module) -> dict[str, bool]:
    return {name: p.requires_grad for name, p in model.named_parameters()}


@contextlib.contextmanager
def _no_graph() -> Iterator[list[tuple[int, ...]]]:
    """Every tensor autograd saves for a backward pass (only a graph being built saves any)."""
    saved: list[tuple[int, ...]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield saved


def test_the_hook_sees_a_graph_being_built():
    """The check below is live: an ordinary forward of the trainable model saves tensors for backward."""
    model = _trainable()
    with _no_graph() as saved:
        model(input_ids=torch.tensor([[3, 4, 5]]))
    assert saved


@pytest.mark.parametrize(
    "read",
    ["score", "score_top_k_tcb", "score_compiled", "generate"],
)
def test_wrap_and_read_leave_the_parameters_as_they_were(read):
    model = _trainable()
    before = _flags(model)
    assert any(before.values()) and not all(before.values())
    lm = wrap(model, CharTokenizer(), name="tiny-llama")
    assert _flags(model) == before
    with _no_graph() as saved:
        if read == "score":
            table = depthlens.score(lm, RECORDS, tokens=True)
        elif read == "score_top_k_tcb":
            table = depthlens.score(lm, RECORDS, tokens=True, layer_top_k=3, tcb=True)
        elif read == "score_compiled":  # the fused kernel (or its eager fallback) reads the lens itself
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # without a C++ compiler the eager fallback answers
                table = depthlens.score(lm, RECORDS, compile="on")
        else:
            table = depthlens.generate(
                lm,
                "reasoning_gym:chain_sum",
                task_config="min_terms=2,max_terms=2,max_digits=1",
                questions=1,
                pool=2,
                max_new_tokens=6,
            )
    assert table.num_rows > 0
    assert saved == []  # no read saved a tensor for backward: no graph was built
    assert _flags(model) == before
    assert all(p.grad is None for p in model.parameters())
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()  # the caller's modes restored


def test_a_wrapped_model_still_trains():
    """After a read the caller can go on training the model: its parameters take gradients as before."""
    model = _trainable()
    lm = wrap(model, CharTokenizer(), name="tiny-llama")
    depthlens.score(lm, RECORDS)
    model.train()
    out = model(input_ids=torch.tensor([[3, 4, 5, 6]]), labels=torch.tensor([[3, 4, 5, 6]]))
    out.loss.backward()
    assert model.lm_head.weight.grad is not None and model.model.embed_tokens.weight.grad is None


def test_a_lens_fit_takes_no_gradient_on_the_models_weights(tmp_path):
    """A tuned lens's fit needs autograd for its translators only: the wrapped model's weights get no ``.grad``
    and keep their flags (``models.load.frozen`` for the fit's duration)."""
    from depthlens.config import LensFitConfig
    from depthlens.readout.stream import TokenSequence
    from depthlens.studies.lens_fit import fit_lens

    model = _trainable()
    before = _flags(model)
    lm = wrap(model, name="tiny-llama")
    gen = torch.Generator().manual_seed(0)
    seqs = [TokenSequence([1], torch.randint(3, 100, (30,), generator=gen).tolist()) for _ in range(4)]
    cfg = LensFitConfig(max_tokens=100, steps=2, checkpoint_every=2, batch_tokens=16, layers_per_step=1)
    assert fit_lens(lm, seqs, tmp_path / "lens", cfg, data="synthetic")["steps"] == 2
    assert _flags(model) == before
    assert all(p.grad is None for p in model.parameters())
