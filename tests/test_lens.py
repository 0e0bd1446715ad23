"""The tuned lens (issue 43): the fit recovers a known affine map, identity translators read exactly what the logit
lens reads, a lens fitted to another model is refused by name, and the top-k settling rule."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest
import torch

from depthlens.config import LensFitConfig, LensSpec, ReadoutConfig
from depthlens.errors import ConfigError, InputError
from depthlens.readout.lens import LogitLens, TunedLens
from depthlens.readout.lenses import resolve_lens
from depthlens.readout.stream import TokenSequence, iter_readout
from depthlens.readout.tuned import hidden_size, model_fingerprint, save_lens
from depthlens.studies.lens_fit import (
    States,
    fit_lens,
    fit_translators,
    fit_warning,
    heldout_kl,
    least_squares,
)
from depthlens.studies.resolve import readout as run_readout
from tests.conftest import tiny_model


def _synthetic(lm, n: int, seed: int) -> tuple[States, torch.Tensor, torch.Tensor]:
    """States whose last-block state is a known affine map of every earlier layer's: h_L = A h_l + b."""
    d, gen = hidden_size(lm), torch.Generator().manual_seed(seed)
    a = torch.eye(d) + 0.3 * torch.randn(d, d, generator=gen) / d**0.5
    b = 0.5 * torch.randn(d, generator=gen)
    hidden = torch.randn(lm.n_layers - 1, n, d, generator=gen)
    return States(hidden, hidden[0] @ a.T + b), a, b


def test_fit_recovers_a_known_affine_map(tiny_llama):
    train, a, b = _synthetic(tiny_llama, 400, seed=0)
    weight, bias = least_squares(train.hidden[0], train.last, ridge=0.0)
    torch.testing.assert_close(weight, a, atol=1e-4, rtol=0)
    torch.testing.assert_close(bias, b, atol=1e-4, rtol=0)
    # The KL steps start there and stay: at the known map p_l = p_L, the KL's minimum.
    cfg = LensFitConfig(steps=10, lr=1e-3, batch_tokens=32, layers_per_step=2, ridge=0.0)
    lens = LogitLens(tiny_llama.parts)
    with torch.enable_grad():
        weight, bias, steps = fit_translators(lens, dataclasses.replace(train, hidden=train.hidden[:1]), cfg)
    assert steps == 10
    torch.testing.assert_close(weight[0], a, atol=0.02, rtol=0)
    held, _, _ = _synthetic(tiny_llama, 100, seed=1)
    held = dataclasses.replace(held, hidden=held.hidden[:1], last=held.hidden[0] @ a.T + b)
    kl = heldout_kl(lens, held, weight, bias)
    assert kl["tuned"][0] < 1e-3 < kl["logit"][0]


def test_kl_steps_lower_the_held_out_kl_from_a_poor_start(tiny_llama):
    """Started from a ridge so strong the least-squares map is nearly zero, Adam's KL steps bring p_l toward p_L."""
    train, a, b = _synthetic(tiny_llama, 400, seed=0)
    train = dataclasses.replace(train, hidden=train.hidden[:1])
    lens = LogitLens(tiny_llama.parts)
    held, _, _ = _synthetic(tiny_llama, 100, seed=1)
    held = dataclasses.replace(held, hidden=held.hidden[:1], last=held.hidden[0] @ a.T + b)
    cfg = LensFitConfig(steps=0, ridge=1e3)
    before = heldout_kl(lens, held, *fit_translators(lens, train, cfg)[:2])["tuned"][0]
    with torch.enable_grad():
        weight, bias, _ = fit_translators(
            lens, train, dataclasses.replace(cfg, steps=150, lr=3e-2, batch_tokens=64)
        )
    assert heldout_kl(lens, held, weight, bias)["tuned"][0] < 0.5 * before


def _identity_lens(lm, path):
    d, n = hidden_size(lm), lm.n_layers - 1
    stamp = {"model": lm.name, "model_hash": model_fingerprint(lm), "n_layers": lm.n_layers, "d": d}
    stamp["heldout_kl"] = {"logit": [0.5] * n, "tuned": [0.5] * n}  # identity: the logit lens's own
    return save_lens(path, torch.eye(d).repeat(n, 1, 1), torch.zeros(n, d), stamp)


def test_identity_translators_equal_the_logit_lens_exactly(tiny_llama, tmp_path):
    _identity_lens(tiny_llama, tmp_path / "lens")
    seqs = [TokenSequence([1, 5, 9], [7, 3, 11, 20, 4]), TokenSequence([1], [8, 8, 30])]
    tuned = ReadoutConfig(lens=f"tuned:{tmp_path / 'lens'}")
    for plain, other in zip(
        iter_readout(tiny_llama, seqs), iter_readout(tiny_llama, seqs, tuned), strict=True
    ):
        assert isinstance(other.lens, TunedLens) and not isinstance(plain.lens, TunedLens)
        for x, y in zip(plain.layer_blocks(rows=64), other.layer_blocks(rows=64), strict=True):
            assert x[0] == y[0] and torch.equal(x[1], y[1]) and torch.equal(x[2], y[2])
        for layer in range(1, plain.n_layers):
            assert torch.equal(
                plain.layer_rows(layer, torch.tensor([0]))[0], other.layer_rows(layer, torch.tensor([0]))[0]
            )


def test_a_lens_fitted_to_another_model_is_refused_by_name(tiny_llama, tmp_path):
    from depthlens.models.load import wrap

    _identity_lens(tiny_llama, tmp_path / "lens")
    other = wrap(tiny_model("llama", seed=1), name="other-llama")
    seqs = [TokenSequence([1, 5], [7, 3])]
    with pytest.raises(InputError, match=r"fitted to .*model_hash"):
        list(iter_readout(other, seqs, ReadoutConfig(lens=f"tuned:{tmp_path / 'lens'}")))
    deeper = wrap(tiny_model("llama", num_hidden_layers=4))
    with pytest.raises(InputError, match="n_layers 3 ≠ 4"):
        list(iter_readout(deeper, seqs, ReadoutConfig(lens=f"tuned:{tmp_path / 'lens'}")))
    with pytest.raises(InputError, match="no fitted lens there"):
        list(iter_readout(tiny_llama, seqs, ReadoutConfig(lens=f"tuned:{tmp_path / 'none'}")))
    with pytest.raises(ConfigError, match=r"^lens='tuned': must be logit, tuned:PATH or jacobian:PATH"):
        ReadoutConfig(lens="tuned")
    assert str(LensSpec.parse("tuned:x/y")) == "tuned:x/y"


def test_fit_lens_writes_a_resumable_stamped_lens(tiny_llama, tmp_path):
    gen = torch.Generator().manual_seed(0)
    seqs = [TokenSequence([1], torch.randint(3, 100, (30,), generator=gen).tolist()) for _ in range(6)]
    cfg = LensFitConfig(max_tokens=150, steps=4, checkpoint_every=2, batch_tokens=16, layers_per_step=1)
    stamp = fit_lens(tiny_llama, seqs, tmp_path / "lens", cfg, data="synthetic")
    assert stamp["steps"] == 4 and stamp["n_layers"] == 3 and stamp["tokens"]["heldout"] > 0
    assert len(stamp["heldout_kl"]["tuned"]) == 2 and set(stamp["heldout_dtr"]) == {"logit", "tuned"}
    assert not (tmp_path / "lens" / "checkpoint.pt").exists()  # a finished fit leaves only the lens
    umask = os.umask(0)
    os.umask(umask)
    for file in ("translators.safetensors", "lens.json"):  # both as the umask says (not 0600)
        assert stat.S_IMODE((tmp_path / "lens" / file).stat().st_mode) == 0o666 & ~umask

    def interrupt(step, loss):
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # interrupted at step 4: the checkpoint of step 2 stays
        fit_lens(tiny_llama, seqs, tmp_path / "part", dataclasses.replace(cfg, steps=6), progress=interrupt)
    assert (tmp_path / "part" / "checkpoint.pt").exists()
    more = fit_lens(tiny_llama, seqs, tmp_path / "part", dataclasses.replace(cfg, steps=6), resume=True)
    assert more["steps"] == 6 and not (tmp_path / "part" / "checkpoint.pt").exists()
    # Resumed 4 → 6 equals a fit run 0 → 6 at once: the minibatches are seeded by step.
    once = fit_lens(tiny_llama, seqs, tmp_path / "once", dataclasses.replace(cfg, steps=6))
    assert once["heldout_kl"] == more["heldout_kl"]


def test_a_short_fit_that_moves_dtr_says_so():
    cfg = LensFitConfig()  # 200 steps
    moved = {"logit": 0.35, "tuned": 0.57}
    warning = fit_warning({"steps": 7, "heldout_dtr": moved}, dataclasses.replace(cfg, steps=7))
    assert warning is not None and warning.startswith("the fit stopped after 7 KL steps (fewer than 50)")
    assert "from 0.35 (logit lens) to 0.57" in warning
    assert "--max-seconds 600 ran out" in fit_warning({"steps": 120, "heldout_dtr": moved}, cfg)
    assert fit_warning({"steps": 200, "heldout_dtr": moved}, cfg) is None  # converged as asked
    assert (
        fit_warning({"steps": 7, "heldout_dtr": {"logit": 0.35, "tuned": 0.4}}, cfg) is None
    )  # barely moved


TOPK_CASES = [  # (agreement per layer 1..L, the top-k settling depth by the rule's words)
    ([1, 1, 1, 1], 1),
    ([0, 0, 0, 1], 4),
    ([0, 0, 0, 0], 4),  # layer L agrees by definition
    ([1, 0, 1, 1], 3),  # agreeing once does not settle: it must hold to the end
    ([1, 1, 0, 1], 4),
    ([0, 1, 1, 0], 2),  # column L is taken as agreeing, whatever the table says
    ([0, 1, 1, 1], 2),
]


def test_topk_settling_equals_a_direct_computation_on_a_table_of_cases():
    from depthlens.metrics.dtr import topk_settling_depth

    table = torch.tensor([row for row, _ in TOPK_CASES], dtype=torch.bool)
    expected = [case[1] for case in TOPK_CASES]
    assert topk_settling_depth(table).tolist() == expected
    direct = [min(lay + 1 for lay in range(4) if all(row[lay:-1]) or lay == 3) for row, _ in TOPK_CASES]
    assert direct == expected


def test_topk_agreement_compares_sets_not_orders():
    from depthlens.metrics.dtr import topk_agreement

    final = torch.log_softmax(torch.tensor([[5.0, 4.0, 3.0, 0.0], [5.0, 4.0, 3.0, 0.0]]), -1)
    layer = torch.tensor(
        [[3.0, 4.0, 5.0, 0.0], [5.0, 0.0, 3.0, 4.0]]
    )  # same top-3 set reordered; another set
    assert topk_agreement(final, layer, 3).tolist() == [True, False]
    assert topk_agreement(final, layer, 1).tolist() == [False, True]


def test_score_settles_by_topk_from_the_readout(tiny_llama):
    """score's ``topk:K`` settling depths equal the rule applied to top-K sets computed directly from each layer."""
    from depthlens.config import DTRConfig
    from depthlens.metrics.dtr import topk_settling_depth
    from depthlens.studies.score import score

    records = [{"id": "a", "prompt_ids": [1, 4, 9], "completion_ids": [7, 3, 11, 20, 4, 50, 60]}]
    for k in (1, 3):
        (result,) = score(tiny_llama, records, dtr=DTRConfig(settle=f"topk:{k}"), tcb=None, tokens=True)
        (chunk,) = iter_readout(tiny_llama, [TokenSequence([1, 4, 9], records[0]["completion_ids"])])
        final = chunk.final.logprobs.topk(k).indices.sort().values
        agree = [(lay.logprobs.topk(k).indices.sort().values == final).all(-1) for lay in chunk.layers()] + [
            torch.ones(len(chunk), dtype=torch.bool)
        ]
        assert result["settling_depth"] == topk_settling_depth(torch.stack(agree, 1)).tolist()


def test_the_store_stamps_the_lens_and_refuses_to_resume_under_another(tiny_llama, tmp_path):
    import json

    from depthlens.config import ScoreRun, StoreSpec
    from depthlens.errors import StoreError
    from depthlens.stores.jsonl import iter_jsonl
    from depthlens.studies.score import run_score

    rows = [{"id": f"r{i}", "prompt_ids": [4, 5 + i], "completion_ids": [7, 8, 9 + i]} for i in range(3)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stamp = _identity_lens(tiny_llama, tmp_path / "lens")
    tuned = run_readout(
        lens=f"tuned:{tmp_path / 'lens'}"
    )  # resolved where the run is built: its fit's digest taken
    assert tuned.lens_digest == stamp["digest"]
    assert ReadoutConfig(lens=f"tuned:{tmp_path / 'lens'}").lens_digest is None  # a config reads no file
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "logit.jsonl")))
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "tuned.jsonl"), readout=tuned))
    manifest = json.loads((tmp_path / "tuned.jsonl.manifest.json").read_text())
    assert (
        manifest["readout"]["lens"] == str(tuned.lens)
        and manifest["readout"]["lens_digest"] == stamp["digest"]
    )
    # identity translators: the very scores of the logit lens
    assert list(iter_jsonl(tmp_path / "tuned.jsonl")) == list(iter_jsonl(tmp_path / "logit.jsonl"))
    with pytest.raises(StoreError, match="lens"):
        run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "logit.jsonl", resume=True), readout=tuned))
    # the same folder refitted (another digest) is another lens
    d, n = hidden_size(tiny_llama), tiny_llama.n_layers - 1
    save_lens(tmp_path / "lens", 2 * torch.eye(d).repeat(n, 1, 1), torch.zeros(n, d), dict(stamp))
    with pytest.raises(InputError, match=r"not .* that this store was read with"):
        resolve_lens(ReadoutConfig.from_dict(tuned.to_dict()).lens)  # a store's record of the old fit
    refit = run_readout(lens=str(tuned.lens))
    with pytest.raises(StoreError, match="lens_digest"):
        run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "tuned.jsonl", resume=True), readout=refit))


def test_lens_compare_sets_lenses_and_rules_side_by_side(tiny_llama, tmp_path, monkeypatch, capsys):
    import json

    from depthlens.config import DTRConfig, ScoreRun, StoreSpec
    from depthlens.studies.lens_compare import compare_arms, load_arm
    from depthlens.studies.score import run_score
    from tests.test_cli import run

    gen = torch.Generator().manual_seed(0)
    rows = [
        {
            "id": f"q{i // 4}#{i % 4}",
            "prompt_ids": [1, 4],
            "completion_ids": torch.randint(3, 100, (12,), generator=gen).tolist(),
        }
        for i in range(24)
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _identity_lens(tiny_llama, tmp_path / "lens")
    tuned = run_readout(
        lens=f"tuned:{tmp_path / 'lens'}"
    )  # resolved where the run is built: its fit's digest taken
    dtr = DTRConfig(g=0.0155)  # about the median of the tiny model's min_l D_{t,l}: DTR varies by response
    arms = {
        "logit": (ReadoutConfig(), dtr),
        "tuned": (tuned, dtr),
        "topk": (ReadoutConfig(), DTRConfig(settle="topk:1")),
    }
    for name, (readout, rule) in arms.items():
        run_score(
            tiny_llama, ScoreRun(src, StoreSpec(tmp_path / f"{name}.jsonl"), readout, rule, None, tokens=True)
        )
    loaded = [load_arm(tmp_path / f"{name}.jsonl") for name in arms]
    graded = {r["id"]: (r["id"].split("#")[0], i % 3 == 0) for i, r in enumerate(rows)}
    table = compare_arms(loaded, graded)
    assert [r["arm"] for r in table] == ["logit · jsd", "tuned (lens) · jsd", "logit · topk:1"]
    assert (
        table[1]["spearman_vs_first"] == pytest.approx(1.0) and table[1]["mean_dtr"] == table[0]["mean_dtr"]
    )
    assert table[0]["depth_of"] == "tokens" and table[0]["responses"] == 24
    assert {
        "accuracy_spearman",
        "accuracy_binned_r",
        "accuracy_binned_r_ci",
        "accuracy_point_biserial_p",
    } <= set(table[0])
    code, out, err = run(
        monkeypatch,
        capsys,
        "lens",
        "compare",
        *(tmp_path / f"{n}.jsonl" for n in arms),
        "--out",
        tmp_path / "cmp",
    )
    assert code in (0, None), err
    saved = json.loads((tmp_path / "cmp" / "lens_compare.json").read_text())
    assert len(saved["arms"]) == 3 and list(saved["heldout_kl"]) == [str(tuned.lens)]
    assert (tmp_path / "cmp" / "lens_compare.png").stat().st_size > 0 and "topk:1" in out


def test_score_refuses_a_mismatched_lens_before_writing_anything(tiny_llama, tmp_path):
    import json

    from depthlens.config import ScoreRun, StoreSpec
    from depthlens.models.load import wrap
    from depthlens.studies.score import run_score

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt_ids": [4, 5], "completion_ids": [7, 8]}) + "\n")
    _identity_lens(tiny_llama, tmp_path / "lens")
    other = wrap(tiny_model("llama", seed=1), name="other-llama")
    readout = ReadoutConfig(lens=f"tuned:{tmp_path / 'lens'}")
    with pytest.raises(InputError, match="fitted to"):
        run_score(other, ScoreRun(src, StoreSpec(tmp_path / "out.jsonl"), readout=readout))
    assert not (tmp_path / "out.jsonl").exists()
