"""Every adapter row, on a tiny random model of its family: the lens reproduces the model's own logits."""

from __future__ import annotations

import pytest
import torch

from depthlens.errors import UnsupportedArchitectureError
from depthlens.models.adapters import ADAPTERS, resolve_parts
from depthlens.readout.lens import LogitLens
from tests.conftest import TINY_CONFIGS, tiny_model

FAMILIES = sorted(ADAPTERS)


def test_every_adapter_row_has_a_tiny_model():
    assert set(ADAPTERS) <= set(TINY_CONFIGS)


def _forward_with_last_block(model, ids):
    parts = resolve_parts(model)
    captured = {}

    def hook(_module, _args, output):
        captured["h"] = output[0] if isinstance(output, tuple) else output

    handle = parts.blocks[-1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
    finally:
        handle.remove()
    return parts, out, captured["h"]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_lens_at_last_layer_equals_model_logits(model_type):
    model = tiny_model(model_type)
    ids = torch.randint(3, 90, (1, 12), generator=torch.Generator().manual_seed(1))
    parts, out, last_block = _forward_with_last_block(model, ids)
    lens = LogitLens(parts)
    torch.testing.assert_close(lens.logits(last_block), out.logits.float(), atol=1e-4, rtol=1e-4)
    assert parts.n_layers == len(out.hidden_states) - 1
    if parts.last_hidden_normed:  # hidden_states[-1] is already normed: the gotcha the adapter records
        torch.testing.assert_close(parts.final_norm(last_block), out.hidden_states[-1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_lens_at_earlier_layers_is_norm_then_unembedding(model_type):
    model = tiny_model(model_type)
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(2))
    parts, out, _ = _forward_with_last_block(model, ids)
    lens = LogitLens(parts)
    for h in out.hidden_states[1:-1]:
        torch.testing.assert_close(lens.logits(h), _post(parts, parts.unembed(parts.final_norm(h))))
        torch.testing.assert_close(
            LogitLens(parts, final_norm=False).logits(h), _post(parts, parts.unembed(h))
        )


def _post(parts, z):
    z = z.float()
    return parts.logit_post(z) if parts.logit_post is not None else z


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text", "granite", "cohere"])
def test_logit_post_processing_is_applied(model_type):
    parts = resolve_parts(tiny_model(model_type))
    assert parts.logit_post is not None
    z = torch.linspace(-50, 50, 11)
    assert not torch.equal(parts.logit_post(z), z)


def test_unknown_architecture_names_known_ones_and_the_fix():
    model = tiny_model("llama")
    model.config.model_type = "falcon-x"
    try:
        with pytest.raises(
            UnsupportedArchitectureError, match=r"model_type 'falcon-x' has no adapter \(known: .*llama"
        ):
            resolve_parts(model)
        with pytest.raises(UnsupportedArchitectureError, match="pass blocks, final_norm and unembed"):
            resolve_parts(model)
        # Explicit paths make an unknown family usable.
        parts = resolve_parts(model, blocks="model.layers", final_norm="model.norm", unembed="lm_head")
        assert parts.n_layers == 3
    finally:
        model.config.model_type = "llama"


def test_wrong_explicit_path_names_the_part():
    model = tiny_model("llama")
    with pytest.raises(UnsupportedArchitectureError, match=r"could not find the final norm at model\.ln_f"):
        resolve_parts(model, final_norm="model.ln_f")
