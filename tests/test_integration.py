"""On the real default model (SmolLM2-135M-Instruct, 30 layers): the same invariants as on tiny models."""

from __future__ import annotations

import json

import pytest
import torch

from depthlens.metrics.reference import reference_divergences
from depthlens.models import catalogue
from depthlens.studies.score import score
from depthlens.studies.score_inputs import tokenize

pytestmark = pytest.mark.integration

RECORDS = [
    {
        "id": "chat",
        "messages": [{"role": "user", "content": "What is 17 + 25?"}],
        "completion": "17 + 25 = 42. The answer is 42.",
    },
    {
        "id": "plain",
        "prompt": "The capital of France is",
        "completion": " Paris, which is also its largest city.",
    },
]


def test_catalogue_copy_is_the_verified_one():
    marker = catalogue.converted_dir(catalogue.DEFAULT_MODEL) / "depthlens-complete"
    if not marker.exists():
        pytest.skip("default model not installed")
    # The marker certifies the GGUF it was converted from and every converted file (size + sha256).
    assert (
        json.loads(marker.read_text())["gguf_sha256"] == catalogue.CATALOGUE[catalogue.DEFAULT_MODEL].sha256
    )
    assert catalogue.damage(catalogue.DEFAULT_MODEL, deep=True) is None


def test_real_model_streaming_equals_reference(real_model):
    assert real_model.n_layers == 30
    seq = tokenize(real_model, RECORDS[0], "chat")
    (result,) = score(real_model, [RECORDS[0]], tokens=True)
    expected, final = reference_divergences(real_model, seq)
    torch.testing.assert_close(torch.tensor(result["divergence"]), expected, atol=2e-5, rtol=1e-4)
    log_prob = final.gather(1, torch.tensor(seq.completion_ids)[:, None]).mean().item()
    assert result["log_prob"] == pytest.approx(log_prob, rel=1e-5)


def test_real_model_scores_are_sane_and_batch_invariant(real_model):
    one = score(real_model, RECORDS, tokens=True, batch_size=1)
    two = score(real_model, RECORDS, tokens=True, batch_size=2)
    for a, b in zip(one, two, strict=True):
        torch.testing.assert_close(
            torch.tensor(a["divergence"]), torch.tensor(b["divergence"]), atol=1e-4, rtol=1e-3
        )
        assert 0 <= a["dtr"] <= 1
        assert 1 <= a["mean_settling_depth"] <= 30
        assert a["tokens"][0] in ("17", "␣17", "1", "␣Paris", "Paris")  # readable labels, not "Ġ17"
        assert all(row[-1] == 0 for row in a["divergence"])
        assert all(0 <= d <= 1 for row in a["divergence"] for d in row)
        assert a["log_prob"] < 0 and a["neg_perplexity"] <= -1 and a["self_certainty"] > 0
    # A fluent, easy answer: most tokens are predictable, so the model is fairly sure of them.
    assert one[1]["log_prob"] > -3
