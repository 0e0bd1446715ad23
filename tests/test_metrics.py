"""Hand-worked settling/DTR tables, divergence properties and baselines against direct formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from depthlens.config import DTRConfig, ReadoutConfig
from depthlens.errors import ConfigError
from depthlens.metrics.baselines import sequence_baselines, token_baselines
from depthlens.metrics.divergence import cosine_distance, js_divergence, kl_divergence, layer_divergence
from depthlens.metrics.dtr import (
    deep_flags,
    deep_thinking_ratio,
    deep_threshold,
    mean_settling_depth,
    settling_depth,
)

# (divergences D_{t,1..L}, g, expected settling depth c_t, why)
SETTLING_CASES = [
    ([0.9, 0.8, 0.7, 0.0], 0.5, 4, "only the last layer is below g"),
    ([0.1, 0.9, 0.8, 0.0], 0.5, 1, "settles at layer 1 even though later layers diverge again"),
    ([0.9, 0.4, 0.6, 0.0], 0.5, 2, "non-monotone: the cumulative minimum keeps the dip at layer 2"),
    ([0.7, 0.5, 0.3, 0.0], 0.5, 2, "a tie with g counts as settled (≤ g)"),
    ([0.7, 0.50001, 0.3, 0.0], 0.5, 3, "just above g does not"),
    ([0.6, 0.6, 0.6, 0.0], 0.0, 4, "g = 0: only the final layer settles"),
    ([0.6, 0.6, 0.6, 0.0], 1.0, 1, "g = 1 bit: everything settles at once"),
]


@pytest.mark.parametrize(("row", "g", "expected", "why"), SETTLING_CASES, ids=[c[3] for c in SETTLING_CASES])
def test_settling_depth_hand_worked(row, g, expected, why):
    assert settling_depth(torch.tensor([row]), g).tolist() == [expected], why


def test_settling_depth_rows_are_independent():
    table = torch.tensor([c[0] for c in SETTLING_CASES[:4]])
    assert settling_depth(table, 0.5).tolist() == [4, 1, 2, 2]


# (L, ρ, rule, first deep layer)
THRESHOLD_CASES = [
    (10, 0.8, "spec", 8),  # the paper's Figure 3: deep regime = layers 8–10
    (10, 0.8, "paper-literal", 2),  # ⌈(1 − 0.8)·10⌉ as Algorithm 1 prints it
    (30, 0.85, "spec", 26),  # ⌈25.5⌉
    (30, 0.85, "paper-literal", 5),  # ⌈4.5⌉
    (24, 0.85, "spec", 21),  # ⌈20.4⌉
    (36, 0.95, "spec", 35),  # ⌈34.2⌉
    (10, 1.0, "spec", 10),
    (10, 1.0, "paper-literal", 1),  # clamped to layer 1
]


@pytest.mark.parametrize(("n_layers", "rho", "rule", "expected"), THRESHOLD_CASES)
def test_deep_threshold(n_layers, rho, rule, expected):
    assert deep_threshold(n_layers, rho, rule) == expected


def test_deep_flags_and_dtr_both_rules():
    settling = torch.tensor([10, 8, 7, 2, 1, 9])
    spec = deep_flags(settling, 10, 0.8, "spec")
    assert spec.tolist() == [True, True, False, False, False, True]
    assert deep_thinking_ratio(spec) == pytest.approx(0.5)
    literal = deep_flags(settling, 10, 0.8, "paper-literal")
    assert literal.tolist() == [True, True, True, True, False, True]
    assert deep_thinking_ratio(literal) == pytest.approx(5 / 6)
    assert deep_thinking_ratio(spec, prefix=2) == 1.0
    assert deep_thinking_ratio(spec, prefix=4) == 0.5
    assert deep_thinking_ratio(spec, prefix=100) == pytest.approx(0.5)  # prefix longer than the text
    assert mean_settling_depth(settling) == pytest.approx(37 / 6)


def test_empty_sequence_gives_none():
    empty = torch.zeros(0, dtype=torch.long)
    assert deep_thinking_ratio(deep_flags(empty, 10, 0.85)) is None
    assert mean_settling_depth(empty) is None
    assert sequence_baselines(torch.zeros(0), torch.zeros(0), torch.zeros(0))["log_prob"] is None


def _logprobs(*rows):
    return torch.log(torch.tensor(rows, dtype=torch.float32))


def test_jsd_properties():
    g = torch.Generator().manual_seed(0)
    p = torch.log_softmax(torch.randn(50, 300, generator=g) * 3, -1)
    q = torch.log_softmax(torch.randn(50, 300, generator=g) * 3, -1)
    d = js_divergence(p, q)
    torch.testing.assert_close(d, js_divergence(q, p))  # symmetric
    assert (d >= 0).all() and (d <= 1).all()  # bits, bounded by 1
    torch.testing.assert_close(js_divergence(p, p), torch.zeros(50), atol=1e-6, rtol=0)
    torch.testing.assert_close(js_divergence(p, q, base=math.e), d * math.log(2))


def test_jsd_disjoint_supports_is_exactly_one_bit():
    p, q = _logprobs([1.0, 0.0]), _logprobs([0.0, 1.0])
    assert js_divergence(p, q).item() == pytest.approx(1.0, abs=1e-6)
    assert js_divergence(p, q, base=math.e).item() == pytest.approx(math.log(2), abs=1e-6)


def _direct_jsd(p, q):
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    m = (p + q) / 2

    def kl(a, b):
        mask = a > 0
        return float(np.sum(a[mask] * np.log2(a[mask] / b[mask])))

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def test_jsd_and_kl_against_direct_formulas():
    p, q = [0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.4, 0.4]
    assert js_divergence(_logprobs(p), _logprobs(q)).item() == pytest.approx(_direct_jsd(p, q), rel=1e-5)
    q2 = [0.25, 0.25, 0.25, 0.25]
    direct_kl = sum(a * math.log(a / b) for a, b in zip(p, q2, strict=True) if a > 0)
    assert kl_divergence(_logprobs(p), _logprobs(q2)).item() == pytest.approx(direct_kl, rel=1e-5)


def test_cosine_distance():
    x = torch.tensor([[1.0, 0.0], [1.0, 1.0], [2.0, 0.0]])
    y = torch.tensor([[0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    torch.testing.assert_close(cosine_distance(x, y), torch.tensor([1.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="normalised hidden states"):
        layer_divergence("cosine", x, y)
    with pytest.raises(ValueError, match="unknown divergence 'l2'"):
        layer_divergence("l2", x, y)  # type: ignore[arg-type]


def test_token_baselines_against_direct_formulas():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(7, 40, generator=g, dtype=torch.float64) * 2
    targets = torch.randint(0, 40, (7,), generator=g)
    logp = torch.log_softmax(logits, -1)
    base = token_baselines(logp.float(), targets)
    p = logp.exp()
    for t in range(7):
        assert base["log_prob"][t].item() == pytest.approx(logp[t, targets[t]].item(), rel=1e-5)
        assert base["entropy"][t].item() == pytest.approx(-(p[t] * logp[t]).sum().item(), rel=1e-5)
        uniform_kl = sum((1 / 40) * math.log((1 / 40) / p[t, v].item()) for v in range(40))
        assert base["self_certainty"][t].item() == pytest.approx(uniform_kl, rel=1e-5)
    seq = sequence_baselines(base["log_prob"], base["entropy"], base["self_certainty"])
    mean_lp = logp.gather(1, targets[:, None]).mean().item()
    assert seq["token_count"] == 7 and seq["reverse_token_count"] == -7
    assert seq["log_prob"] == pytest.approx(mean_lp, rel=1e-5)
    assert seq["log_prob_sum"] == pytest.approx(7 * mean_lp, rel=1e-5)
    assert seq["neg_perplexity"] == pytest.approx(-math.exp(-mean_lp), rel=1e-5)
    assert seq["neg_entropy"] == pytest.approx(-base["entropy"].double().mean().item(), rel=1e-6)
    assert seq["self_certainty"] == pytest.approx(base["self_certainty"].double().mean().item(), rel=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"g": -0.1}, r"g=-0.1: must be a finite number ≥ 0 \(DTRConfig.g; default 0.5\)"),
        ({"g": float("nan")}, r"g=nan: .* \(DTRConfig.g"),
        ({"rho": 0.0}, r"rho=0.0: must be in \(0, 1\] \(DTRConfig.rho"),
        ({"rho": 1.5}, r"rho=1.5: .* \(DTRConfig.rho"),
        (
            {"deep_rule": "literal"},
            r"deep_rule='literal': must be one of spec, paper-literal \(DTRConfig.deep_rule\)",
        ),
        ({"dtr_prefix_tokens": 0}, r"dtr_prefix_tokens=0: must be ≥ 1 token \(DTRConfig.dtr_prefix_tokens"),
    ],
)
def test_invalid_dtr_settings_are_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DTRConfig(**kwargs)


def test_configs_round_trip_and_reject_unknown_keys():
    config = DTRConfig(g=0.3, dtr_prefix_tokens=50)
    assert DTRConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['gg'\]"):
        DTRConfig.from_dict({"gg": 0.3})
    with pytest.raises(ConfigError, match=r"^divergence='js': .* \(ReadoutConfig.divergence\)"):
        ReadoutConfig(divergence="js")  # type: ignore[arg-type]
