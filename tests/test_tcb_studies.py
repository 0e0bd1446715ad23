"""The TCB studies: the geometry counterfactual against a brute-force Jacobian, the drop rule, and each study
end to end on a tiny model (tables and figures written)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from depthlens.metrics.tcb import final_output
from depthlens.metrics.tcb_geometry import geometry_ablation, sharp_drops, v_eff_band
from depthlens.stats.correlation import pearson, spearman
from depthlens.studies.tcb_studies import generation_trace, geometry, prompt_set, prompt_variants, regimes
from tests.test_cli import run
from tests.test_tcb import _states, _unembedding, reference_frobenius


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_geometry_counterfactual_equals_brute_force(model_type):
    """With o fixed, ‖(diag(o) − o oᵀ) W̃'‖_F where the top-k rows of W̃ moved about their weighted centroid."""
    lm, unembed = _unembedding(model_type)
    states = _states(lm, 3.0)
    k, alphas = 5, (0.5, 1.0, 1.5)
    got = geometry_ablation(unembed, states, unembed.row_norms_sq(), k, alphas)
    out = final_output(unembed, states)
    for t in range(states.shape[0]):
        o, s = out.o[t], out.slope_or_ones[t]
        rows = unembed.weight.double() * s[:, None]
        top = o.topk(k).indices
        centroid = (o[top, None] * rows[top]).sum(0) / o[top].sum()
        for alpha in alphas:
            moved = rows.clone()
            moved[top] = centroid + alpha * (rows[top] - centroid)
            jac = (torch.diag(o) - torch.outer(o, o)) @ moved
            assert got[f"frobenius_{alpha:g}"][t].item() == pytest.approx(
                torch.linalg.matrix_norm(jac).item(), rel=1e-9
            )


@pytest.mark.parametrize("scale", [30.0, 100.0])
def test_geometry_counterfactual_keeps_its_digits_on_peaked_outputs(scale):
    """α = 1 is the model as it is: on outputs peaked to 1 − 1e-20 and beyond (where the origin-expanded form lost
    every digit) ‖J‖_F equals the term-by-term float64 reference."""
    lm, unembed = _unembedding("llama")
    states = _states(lm, scale)
    got = geometry_ablation(unembed, states, unembed.row_norms_sq(), 5, (1.0,))["frobenius_1"]
    expected = reference_frobenius(unembed, states)
    finite = expected > 0
    assert finite.any()
    assert ((got[finite] - expected[finite]).abs() / expected[finite]).max().item() <= 1e-9


def test_sharp_drop_rule():
    tcb = torch.tensor([1.0, 1.1, 0.9, 1.0, 0.05, 1.0, 0.08, 1.0], dtype=torch.float64)
    confident = torch.zeros(8, dtype=torch.float64)  # log p = 0: perplexity 1
    assert sharp_drops(tcb, confident, window=4).nonzero().flatten().tolist() == [4, 6]
    unsure = torch.full((8,), -2.0, dtype=torch.float64)  # perplexity e² > 2: not flagged
    assert not sharp_drops(tcb, unsure, window=4).any()


def test_pearson_and_bands():
    x, y = [1.0, 2.0, 3.0, 5.0], [2.0, 4.0, 6.5, 7.0]
    assert pearson(torch.tensor(x), torch.tensor(y)) == pytest.approx(float(np.corrcoef(x, y)[0, 1]))
    assert pearson(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])) is None
    assert pearson(torch.ones(4), torch.arange(4.0)) is None
    assert spearman(
        torch.tensor([1.0, 2.0, 3.0, 100.0]), torch.tensor([1.0, 4.0, 9.0, 16.0])
    ) == pytest.approx(1.0)
    assert [v_eff_band(v) for v in (1.0, 19.99, 20.0, 100.0, 5e4)] == ["<20", "<20", "20–100", ">100", ">100"]


def test_shipped_prompt_sets():
    diverse, low = prompt_set("diverse"), prompt_set("low_veff")
    assert len(diverse) == 48 and len(low) == 41
    assert len({p["id"] for p in diverse + low}) == len(diverse) + len(low)


def test_regimes_and_geometry_on_a_tiny_model(tiny_chat):
    sets = {"diverse": prompt_set("diverse")[:6], "low_veff": prompt_set("low_veff")[:5]}
    result = regimes(tiny_chat, sets)
    assert [s["set"] for s in result["summary"]] == ["diverse", "low_veff", "V_eff ≥ 4", "V_eff < 4"]
    assert (
        len(result["rows"]) == 11 and result["summary"][2]["prompts"] + result["summary"][3]["prompts"] == 11
    )
    assert all(r["tcb"] > 0 and r["v_eff"] >= 1 for r in result["rows"])
    geo = geometry(tiny_chat, ["1 2 3", "4 5"], top_k=4)
    assert len(geo["rows"]) == 6 + 4  # every position of the character-tokenised prompts, BOS included
    total = next(s for s in geo["summary"] if s["band"] == "all")
    assert total["positions"] == 10 and 0 <= total["ordered_share"] <= 1


def test_prompt_variants_and_trace_on_a_tiny_model(tiny_chat):
    # the character tokenizer makes long prompts: templates × shots kept within the tiny model's 256 positions
    result = prompt_variants(tiny_chat, "reasoning_gym:chain_sum", 2, ("bare",), (0, 1), max_new_tokens=6)
    assert [(s["template"], s["shots"]) for s in result["summary"]] == [("bare", 0), ("bare", 1)]
    assert len(result["rows"]) == 4
    assert all(s["perplexity"] >= 1 and s["tcb_mean"] > 0 for s in result["summary"])
    trace = generation_trace(tiny_chat, "1 2", max_new_tokens=8)
    assert len(trace["rows"]) == trace["summary"]["tokens"] >= 1
    assert all(r["perplexity"] >= 1 for r in trace["rows"])


@pytest.mark.integration
def test_tcb_commands_write_table_and_figure(real_model, monkeypatch, capsys, tmp_path):
    code, _, err = run(
        monkeypatch,
        capsys,
        "tcb",
        "trace",
        "--out",
        tmp_path,
        "--max-new-tokens",
        "12",
        "--prompt",
        "Name a colour.",
    )
    assert code in (0, None), err
    for name in ("trace.csv", "trace.json", "trace.md", "trace.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "trace.json").read_text())["summary"]["tokens"] >= 1
    manifest = json.loads((tmp_path / "trace.progress.jsonl.manifest.json").read_text())
    assert manifest["precision"] == {"weights": "Q4_1, dequantised to float32", "compute_dtype": "float32"}


def test_every_template_renders_with_shots():
    from depthlens.evals.tasks import Question
    from depthlens.studies.tcb_studies import TEMPLATES, _messages

    q, shot = Question("q", "1 + 2 =", "3"), Question("s", "4 + 4 =", "8")
    for name in TEMPLATES:
        messages = _messages(name, q, [shot])
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        assert "1 + 2 =" in messages[-1]["content"] and "{question}" not in messages[-1]["content"]
        assert messages[1]["content"] == r"The answer is \boxed{8}."
    assert r"\boxed{}" in _messages("paper", q, [])[0]["content"]
