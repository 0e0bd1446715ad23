"""The per-layer quantities on the real default model (SmolLM2-135M-Instruct) against a plain transformers
computation a TransformerLens user would write — every hidden state through the model's final norm and ``lm_head``,
the full ``log_softmax`` per layer (the model's own logits at layer L) — for the target trajectory, tracked ids,
each layer's entropy and a caller's statistic; and ``hidden_layers`` against ``output_hidden_states``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.config import ReadoutConfig
from depthlens.studies.score import score
from tests.tolerance import assert_float32_equal, shifted, wrong_layer

pytestmark = pytest.mark.integration

RECORD = {
    "id": "x",
    "prompt": "The capital of France is",
    "completion": " Paris, and the capital of Italy is Rome.",
}


def plain(real_model) -> tuple[list[int], torch.Tensor, tuple[torch.Tensor, ...]]:
    """(completion ids, [T, L, V] float32 log-probabilities, the L + 1 hidden states at the read-out positions)."""
    model, tokenizer = real_model.model, real_model.tokenizer
    prompt = tokenizer(RECORD["prompt"])["input_ids"]
    completion = tokenizer(RECORD["completion"], add_special_tokens=False)["input_ids"]
    inputs = torch.tensor([prompt + completion])
    with torch.no_grad():
        out = model(input_ids=inputs, output_hidden_states=True)
        at = slice(len(prompt) - 1, inputs.shape[1] - 1)  # position i predicts token i + 1
        # hidden_states[-1] is already normed by transformers; earlier layers get the final norm here
        logits = [model.lm_head(model.model.norm(h[0, at])) for h in out.hidden_states[1:-1]] + [
            out.logits[0, at]
        ]
        logprobs = torch.log_softmax(torch.stack(logits, dim=1).float(), dim=-1)
    return completion, logprobs, tuple(h[0, at] for h in out.hidden_states)


def test_the_target_trajectory_tracked_ids_entropy_and_a_statistic_equal_plain_transformers(real_model):
    tokenizer = real_model.tokenizer
    track = tuple(tokenizer(" Paris Rome", add_special_tokens=False)["input_ids"])  # two tokens followed
    assert len(track) == 2

    def margin(lp: torch.Tensor) -> torch.Tensor:  # a caller's statistic: the top-1 − top-2 log-prob margin
        top = lp.topk(2, dim=-1).values
        return top[:, 0] - top[:, 1]

    readout = ReadoutConfig(layer_target=True, track=track, layer_entropy=True)
    [result] = score(
        real_model, [RECORD], readout=readout, tokens=True, tcb=None, layer_stats={"margin": margin}
    )
    completion, logprobs, _ = plain(real_model)
    assert result["token_ids"] == completion
    T, L = len(completion), real_model.n_layers
    targets = torch.tensor(completion)
    want = logprobs.gather(-1, targets[:, None, None].expand(T, L, 1))[..., 0]  # [T, L]
    got = np.asarray(result["layer_target_logprobs"])
    assert got.shape == (T, L)
    mutants = [("a wrong layer", wrong_layer(got)), ("a dropped token", shifted(got))]
    assert_float32_equal(got, want, rounded=True, what="target log-probabilities", mutants=mutants)
    # ranks equal outright where no other token is within float32 rounding of the target (1e-4: the two
    # computations' log-probabilities differ by ~1e-6); near such a tie, off by at most the tokens in it
    ranks, plain_ranks = (
        np.asarray(result["layer_target_ranks"]),
        (logprobs > want[..., None]).sum(-1).numpy(),
    )
    within = ((logprobs - want[..., None]).abs() < 1e-4).sum(-1).numpy()  # the target itself counts 1
    assert (ranks[within == 1] == plain_ranks[within == 1]).all() and (within == 1).mean() > 0.95
    assert (np.abs(ranks - plain_ranks) <= within - 1).all()
    assert (ranks[:, 0] > ranks[:, -1]).mean() > 0.5  # layer 1 ranks the token lower than the model does
    tracked = logprobs[..., list(track)]
    assert_float32_equal(result["layer_track_logprobs"], tracked, rounded=True, what="tracked ids")
    assert np.asarray(result["layer_track_ranks"]).shape == (T, L, 2)
    entropy = -(logprobs.double().exp() * logprobs.double()).sum(-1)
    assert_float32_equal(result["layer_entropy"], entropy, rounded=True, what="entropy")
    stat = torch.stack([margin(logprobs[:, layer]) for layer in range(L)], dim=1)
    assert_float32_equal(result["layer_stat_margin"], stat, rounded=True, what="a caller's statistic")


def test_hidden_layers_equal_output_hidden_states(real_model):
    L = real_model.n_layers
    layers = [0, 1, L // 2, L]
    [result] = score(real_model, [RECORD], tcb=None, hidden_layers=layers)
    _, _, hidden = plain(real_model)
    states = result["hidden_states"]
    assert states.shape == (len(hidden[0]), 4, real_model.model.config.hidden_size)
    want = torch.stack([hidden[layer] for layer in layers], dim=1)
    assert_float32_equal(
        states, want, what="hidden states", mutants=[("a wrong layer", np.roll(states, 1, 1))]
    )
