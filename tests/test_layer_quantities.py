"""Per-layer quantities besides the divergence (issue 58 items 4–6, ``metrics.layer_quantities``): the target
trajectory (the read-out token's log-probability and rank at every layer), tracked ids, each layer's entropy and a
caller's own statistic, against plain computations; ranks with ties; the contract a statistic is held to; and the
hidden states ``score`` hands back — on a tiny random-init model (the default model's check is in
tests/test_layer_quantities_real.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from depthlens.config import ReadoutConfig
from depthlens.errors import ConfigError, InputError
from depthlens.metrics.baselines import token_entropy
from depthlens.metrics.layer_quantities import (
    LayerQuantities,
    StatisticError,
    count_above,
    layer_entropy,
    probe_stats,
    target_trajectory,
)
from depthlens.sampling.step_layout import StepLayout
from depthlens.studies.score import score
from tests.tolerance import assert_float32_equal, wrong_layer

RECORD = {"id": "a", "prompt_ids": [1, 5, 9], "completion_ids": [4, 17, 6, 30, 2, 11]}


def brute_ranks(logprobs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """How many entries of each row are strictly greater than the row's entries at ``ids`` [c, M]: one Python
    comparison per entry — the definition, nothing clever."""
    rows = zip(logprobs.tolist(), ids.tolist(), strict=True)
    return torch.tensor([[sum(v > row[i] for v in row) for i in wanted] for row, wanted in rows])


def test_ranks_count_the_strictly_more_probable_and_ties_share_the_better_rank():
    logprobs = torch.log_softmax(torch.tensor([[2.0, 2.0, 1.0, 3.0, 2.0]]), dim=-1)
    lp, rank = target_trajectory(logprobs, torch.tensor([0]))
    assert rank.tolist() == [1]  # only token 3 is more probable; tokens 1 and 4 tie with it
    assert lp.item() == pytest.approx(float(logprobs[0, 0]))
    ranks = count_above(logprobs, logprobs[:, [3, 0, 1, 4, 2]])
    assert ranks.tolist() == [[0, 1, 1, 1, 4]]  # the three tied tokens share rank 1; the least probable has 4


@pytest.mark.parametrize("m", [1, 3, 8, 9, 40])  # up to 8 ids one pass each, more one bucketed count
def test_ranks_of_many_tracked_ids_equal_the_definition_with_ties(m):
    torch.manual_seed(m)
    logits = torch.randint(-4, 5, (5, 60)).float()  # nine distinct values over 60 tokens: ties everywhere
    logprobs = torch.log_softmax(logits, dim=-1)
    ids = torch.stack([torch.randperm(60)[:m] for _ in range(5)])
    ids[:, -1] = ids[:, 0]  # an id tracked twice in a row gets the same rank twice
    ranks = count_above(logprobs, logprobs.gather(1, ids))
    assert ranks.dtype == torch.int64 and torch.equal(ranks, brute_ranks(logprobs, ids))


def test_entropy_and_the_target_against_float64():
    torch.manual_seed(1)
    logprobs = torch.log_softmax(torch.randn(4, 300) * 3, dim=-1)
    p = logprobs.double().exp()
    assert_float32_equal(layer_entropy(logprobs), -(p * p.log()).sum(-1), what="entropy")
    assert torch.equal(layer_entropy(logprobs), token_entropy(logprobs))  # the final layer's baseline, alike
    masked = logprobs.clone()
    masked[0, :5] = -torch.inf  # tokens the lens gives no mass: 0 · log 0 = 0, not NaN
    assert torch.isfinite(layer_entropy(masked)).all()
    targets = torch.tensor([0, 10, 299, 5])
    lp, rank = target_trajectory(logprobs, targets)
    assert torch.equal(lp, logprobs[torch.arange(4), targets])
    assert torch.equal(rank, brute_ranks(logprobs, targets[:, None])[:, 0])


def test_layer_quantities_name_their_fields_and_widths():
    stat = (("top2", lambda lp: lp.topk(2, -1).values, 2),)
    quantities = LayerQuantities(target=True, track=(3, 7, 9), entropy=True, stats=stat)
    assert quantities.fields() == {
        "layer_target_logprobs": 0,
        "layer_target_ranks": 0,
        "layer_track_logprobs": 3,
        "layer_track_ranks": 3,
        "layer_entropy": 0,
        "layer_stat_top2": 2,
    }
    values = quantities.of_layer(torch.log_softmax(torch.randn(5, 20), -1), torch.arange(5))
    assert {k: tuple(v.shape) for k, v in values.items()} == {
        "layer_target_logprobs": (5,),
        "layer_target_ranks": (5,),
        "layer_track_logprobs": (5, 3),
        "layer_track_ranks": (5, 3),
        "layer_entropy": (5,),
        "layer_stat_top2": (5, 2),
    }
    assert not LayerQuantities()


def _nan(lp: torch.Tensor) -> torch.Tensor:
    return lp.sum(-1) * float("nan")


@pytest.mark.parametrize(
    ("fn", "said"),
    [
        (lambda lp: 1 / 0, r"layer_stats\['bad'\]: raised ZeroDivisionError: division by zero"),
        (_nan, r"layer_stats\['bad'\]: returned NaN or ±inf; it must return finite numbers"),
        (lambda lp: lp.sum(-1).log(), r"layer_stats\['bad'\]: returned NaN or ±inf"),  # log of a negative sum
        (lambda lp: lp[:1].sum(-1), r"layer_stats\['bad'\]: returned shape \[1\] for a block of 2 rows"),
        (
            lambda lp: lp[:, :, None],
            r"layer_stats\['bad'\]: returned shape \[2, 50, 1\] .* \[rows\] or \[rows, m\]",
        ),
        (lambda lp: "text", r"layer_stats\['bad'\]: returned str, not a tensor of numbers"),
    ],
)
def test_a_statistic_that_breaks_its_contract_is_refused_by_name(fn, said):
    with pytest.raises(StatisticError, match=said) as caught:
        probe_stats({"bad": fn}, vocab=50)
    assert "\n" not in str(caught.value) and caught.value.setting == "layer_stats"


def test_a_statistics_name_and_value_are_checked_too():
    with pytest.raises(StatisticError, match=r"layer_stats\['a b'\]: a statistic's name must be"):
        probe_stats({"a b": lambda lp: lp.sum(-1)}, 50)
    with pytest.raises(StatisticError, match=r"layer_stats\['x'\]: is int, not a function"):
        probe_stats({"x": 3}, 50)
    probed = probe_stats({"ok": lambda lp: lp.max(-1).values, "two": lambda lp: lp.topk(2, -1).values}, 50)
    assert [(name, width) for name, _, width in probed] == [("ok", 0), ("two", 2)]
    quantities = LayerQuantities(stats=(("shifty", lambda lp: lp[:, : lp.shape[0]], 2),))
    with pytest.raises(StatisticError, match=r"m = 2 before; m must be the same on every block"):
        quantities.of_layer(torch.zeros(3, 10), None)  # 3 rows give m = 3 here


def test_readout_config_refuses_bad_per_layer_settings():
    assert ReadoutConfig(track=[5, 2]).track == (5, 2)
    cases = {
        r"track=\[5, 5\]: must name each token id once": {"track": (5, 5)},
        r"track=\[-1\]: must be token ids": {"track": (-1,)},
        r"track='12': must be a list of token ids": {"track": "12"},
        r"track=\[12\]: token id 12 is past the model's vocabulary of 10": {"track": (12,), "vocab_size": 10},
        r"must be at most 100 token ids, not 101": {"track": tuple(range(101))},
        r"layer_target=1: must be true or false": {"layer_target": 1},
    }
    for said, settings in cases.items():
        with pytest.raises(ConfigError, match=said):
            ReadoutConfig(**settings)


def plain_layers(lm, seq: dict) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Every layer's full log-softmax of every completion token from one plain forward — hidden state → final
    norm → unembedding → log_softmax (layer L: the model's own logits) — [T, L, V], and the hidden states at the
    read-out positions (``output_hidden_states``, each [T, d])."""
    ids = torch.tensor([seq["prompt_ids"] + seq["completion_ids"]])
    with torch.no_grad():  # the caller's own model keeps its grad flags (wrap): the reference too
        out = lm.model(input_ids=ids, output_hidden_states=True)
        at = slice(len(seq["prompt_ids"]) - 1, ids.shape[1] - 1)  # position i predicts token i + 1
        layers = [lm.parts.unembed(lm.parts.final_norm(h[0, at])) for h in out.hidden_states[1:-1]]
    logits = torch.stack([*layers, out.logits[0, at]], dim=1)
    return torch.log_softmax(logits.float(), dim=-1), tuple(h[0, at] for h in out.hidden_states)


def test_score_equals_a_plain_per_layer_log_softmax(tiny_llama):
    track = (3, 40, 77)

    def top_gap(lp: torch.Tensor) -> torch.Tensor:  # a caller's statistic: the top-2 gap and the log-sum-exp
        top = lp.topk(2, dim=-1).values
        return torch.stack([top[:, 0] - top[:, 1], lp.logsumexp(-1)], dim=-1)

    readout = ReadoutConfig(layer_target=True, track=track, layer_entropy=True)
    [result] = score(
        tiny_llama, [RECORD], readout=readout, tokens=True, tcb=None, layer_stats={"gap": top_gap}
    )
    plain, _ = plain_layers(tiny_llama, RECORD)  # [T, L, V]
    targets = torch.tensor(RECORD["completion_ids"])
    want_lp = plain.gather(-1, targets[:, None, None].expand(-1, plain.shape[1], 1))[..., 0]
    got = {k: np.asarray(v) for k, v in result.items() if k.startswith("layer_")}
    assert got["layer_target_logprobs"].shape == (6, tiny_llama.n_layers)
    mutants = [("a wrong layer", wrong_layer(got["layer_target_logprobs"]))]
    assert_float32_equal(got["layer_target_logprobs"], want_lp, rounded=True, what="target", mutants=mutants)
    assert (got["layer_target_ranks"] == (plain > want_lp[..., None]).sum(-1).numpy()).all()
    tracked = plain[..., list(track)]
    assert_float32_equal(got["layer_track_logprobs"], tracked, rounded=True, what="tracked ids")
    assert (got["layer_track_ranks"] == (plain[..., None, :] > tracked[..., None]).sum(-1).numpy()).all()
    entropy = -(plain.double().exp() * plain.double()).sum(-1)
    assert_float32_equal(got["layer_entropy"], entropy, rounded=True, what="entropy")
    stat = torch.stack([top_gap(plain[:, layer]) for layer in range(plain.shape[1])], dim=1)
    assert_float32_equal(got["layer_stat_gap"], stat, rounded=True, what="a caller's statistic")
    assert got["layer_stat_gap"].shape == (6, tiny_llama.n_layers, 2)
    assert not (got["layer_target_ranks"] == 0).all()  # not trivially the top token everywhere


def test_score_returns_the_hidden_states_of_the_layers_asked_for(tiny_llama):
    """``hidden_layers``: (T, k, d) float32 equal to ``output_hidden_states`` at the read-out positions (0: the
    embeddings, l: block l's output, L: the model's last hidden state); segments and chunks of any budget alike."""
    layers = [0, 1, tiny_llama.n_layers]
    _, hidden = plain_layers(tiny_llama, RECORD)
    for memory_mb in (None, 16):
        readout = ReadoutConfig(memory_mb=memory_mb)
        [result] = score(tiny_llama, [RECORD], readout=readout, tcb=None, hidden_layers=layers)
        states = result["hidden_states"]
        assert states.shape == (6, 3, tiny_llama.model.config.hidden_size) and states.dtype == np.float32
        want = torch.stack([hidden[layer] for layer in layers], dim=1)
        assert_float32_equal(
            states, want, what="hidden states", mutants=[("a wrong layer", np.roll(states, 1, 1))]
        )
    [plain] = score(tiny_llama, [RECORD], tcb=None)
    assert "hidden_states" not in plain  # none unless asked


def test_bad_hidden_layers_and_per_token_settings_without_tokens_are_refused(tiny_llama):
    L = tiny_llama.n_layers
    cases = {
        rf"hidden_layers=\[0, {L + 1}\]: layer {L + 1} is out of range: layers are 0..{L}": {
            "hidden_layers": [0, L + 1]
        },
        r"hidden_layers=\[-1\]: layer -1 is out of range": {"hidden_layers": [-1]},
        r"hidden_layers=\[1, 1\]: must name each layer once": {"hidden_layers": [1, 1]},
        r"layer_stats=\['m'\]: each statistic is kept per token and layer: add tokens=True": {
            "layer_stats": {"m": lambda lp: lp.max(-1).values},
            "tokens": False,
        },
    }
    for said, settings in cases.items():
        with pytest.raises(InputError, match=said):
            score(tiny_llama, [RECORD], tcb=None, **settings)
    with pytest.raises(
        InputError,
        match=r"layer_target=True: the target trajectory is kept per token and layer: add tokens=True",
    ):
        score(tiny_llama, [RECORD], tcb=None, readout=ReadoutConfig(layer_target=True))
    with pytest.raises(ConfigError, match=r"track=\[3, 101\]: token id 101 is past .*vocabulary of 101"):
        score(tiny_llama, [RECORD], tcb=None, tokens=True, readout=ReadoutConfig(track=(3, 101)))


def test_hidden_states_past_the_memory_budget_are_refused_with_their_size(tiny_llama):
    """Every record's hidden states are returned together: their sum is checked against ``memory_mb`` before any
    record is read, and the refusal says the size."""
    d = tiny_llama.model.config.hidden_size
    records = [{**RECORD, "id": str(i), "completion_ids": [4] * 2000} for i in range(22)]  # 44,000 tokens
    size = 44_000 * 4 * d * 4 / 2**20
    said = rf"hidden_layers=\[0, 1, 2, 3\]: 44,000 tokens × 4 layers × {d} × 4 B = {size:,.1f} MB .* budget of 16 MB"
    with pytest.raises(InputError, match=said):
        score(tiny_llama, records, tcb=None, readout=ReadoutConfig(memory_mb=16), hidden_layers=[0, 1, 2, 3])


def test_the_step_layout_carries_the_per_layer_values():
    layout = StepLayout(n_scores=4, kinds=("jsd",), n_layers=3, fields=(("a", 0), ("b", 2)))
    tokens = torch.tensor([7, 8])
    values = {"a": torch.rand(2, 3), "b": torch.randint(0, 9, (2, 3, 2))}
    row = layout.pack(tokens, [torch.zeros(2)] * 4, [torch.rand(2, 3)], None, torch.zeros(2), values).numpy()
    assert row.shape == (2, layout.width(read=True)) == (2, 1 + 4 + 3 + 3 + 6 + 1)
    decoded = layout.values(row)
    np.testing.assert_array_equal(decoded["a"], values["a"].double().numpy())
    np.testing.assert_array_equal(decoded["b"], values["b"].numpy())
    assert layout.nonfinite(row).tolist() == [0, 0]
    with pytest.raises(ValueError, match="no b was given"):
        layout.pack(
            tokens, [torch.zeros(2)] * 4, [torch.rand(2, 3)], None, torch.zeros(2), {"a": values["a"]}
        )


def test_the_sampler_keeps_what_score_reads_of_the_same_tokens(tiny_chat):
    """The transformers sampler takes the per-layer quantities in the pass that samples (its one step row) and a
    caller's statistic with them; ``score`` of the same tokens gives the same values (ranks equal, floats within
    float32 reordering)."""
    from depthlens.config import SamplingConfig
    from depthlens.sampling.hf import HFGenerator

    readout = ReadoutConfig(layer_target=True, track=(3, 9), layer_entropy=True)
    stats = {"max": lambda lp: lp.max(-1).values}
    sampling = SamplingConfig(max_new_tokens=8, readout_tokens=5, temperature=1.0)
    prompt = [1, 5, 9, 14, 20, 7]
    for trace in HFGenerator(tiny_chat, sampling, readout, layer_stats=stats).sample(prompt, [3, 4]):
        n = min(5, len(trace.token_ids))
        record = {"id": "x", "prompt_ids": prompt, "completion_ids": trace.token_ids[:n]}
        [scored] = score(tiny_chat, [record], readout=readout, tokens=True, tcb=None, layer_stats=stats)
        assert set(trace.layer_values) == {k for k in scored if k.startswith("layer_")}
        for field, rows in trace.layer_values.items():
            if field.endswith("_ranks"):
                assert rows == scored[field], field
            else:
                assert_float32_equal(rows, scored[field], rounded=True, what=field)


def test_a_statistic_raising_on_real_data_is_named_mid_run(tiny_llama):
    """A statistic that passes the probe but fails on a layer's real block is still refused by name."""
    calls = {"n": 0}

    def flaky(lp: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] > 1:  # the probe passes, the first real block does not
            raise RuntimeError("boom")
        return lp.max(-1).values

    with pytest.raises(StatisticError, match=re.escape("layer_stats['flaky']: raised RuntimeError: boom")):
        score(tiny_llama, [RECORD], tcb=None, tokens=True, layer_stats={"flaky": flaky})


def test_the_trajectory_plot_draws_from_a_result_and_says_what_is_missing(tiny_llama, tmp_path):
    from depthlens.stores.arrow import to_pandas, to_table
    from depthlens.viz.trajectory import draw_target_trajectory

    readout = ReadoutConfig(layer_target=True, track=(3, 9))
    [result] = score(tiny_llama, [RECORD], readout=readout, tokens=True, tcb=None)
    png = draw_target_trajectory(result, tmp_path / "t.png", track_labels=["a", "b"])
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5000
    row = to_pandas(to_table([result])).iloc[0]  # a DataFrame row draws alike
    assert draw_target_trajectory(row, tmp_path / "t.svg", tokens=[0, 2]).read_text().startswith("<?xml")
    with pytest.raises(
        InputError, match=r"holds no target trajectory; score it with tokens and layer_target"
    ):
        draw_target_trajectory({"id": "x"}, tmp_path / "n.png")
    with pytest.raises(InputError, match=r"tokens=\[9\]: must be read-out token indices in 0..5"):
        draw_target_trajectory(result, tmp_path / "n.png", tokens=[9])
    with pytest.raises(InputError, match=r"track_labels=\['a'\]: must name each of the 2 tracked ids"):
        draw_target_trajectory(result, tmp_path / "n.png", track_labels=["a"])
