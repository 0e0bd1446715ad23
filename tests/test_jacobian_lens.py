"""The Jacobian lens (issue 58 items 1–3): the fit equals autograd's Jacobian summed and averaged as the SPEC says,
the readout equals W_U · norm(J h) by hand, the artifact is the published format both ways (and TransformerLens
reads ours and we read its, where it is installed), a ``tuned-lens`` package folder reads in its residual form,
and every bad artifact is one line naming the setting with nothing written."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from depthlens.config import JACOBIAN_SKIP_FIRST, JacobianFitConfig, ReadoutConfig
from depthlens.errors import InputError
from depthlens.models.load import wrap
from depthlens.readout.jacobian import prompt_jacobian, save_artifact
from depthlens.readout.lens_files import hidden_size, model_fingerprint
from depthlens.readout.lenses import resolve_lens
from depthlens.readout.stream import TokenSequence, iter_readout
from depthlens.studies.jacobian_fit import Prompts, checkpoint_path, fit_jacobian
from depthlens.studies.resolve import readout as run_readout
from tests.conftest import CharTokenizer, save_chat_model, tiny_model
from tests.test_cli import run
from tests.tolerance import FLOAT32_ATOL, FLOAT32_RTOL, assert_float32_equal


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 100, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def autograd_jacobian(lm, ids: list[int]) -> torch.Tensor:
    """The SPEC's per-prompt term from ``torch.autograd.functional.jacobian``: the last block's output (the final
    norm's input) at every position as a function of block l's output at every position, the full [T, d, T, d]
    Jacobian summed over targets t' ≥ t in V and averaged over sources t in V. [L − 1, d, d]."""
    model, blocks, valid = lm.model, lm.parts.blocks, range(JACOBIAN_SKIP_FIRST, len(ids) - 1)
    with torch.no_grad():
        states = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states

    def downstream(layer: int):
        def final(h: torch.Tensor) -> torch.Tensor:
            taken = {}

            def replace(_m, _a, out):
                return (h[None], *out[1:]) if isinstance(out, tuple) else h[None]

            hooks = [
                blocks[layer - 1].register_forward_hook(replace),
                lm.parts.final_norm.register_forward_pre_hook(lambda _m, a: taken.setdefault("h", a[0])),
            ]
            try:
                model(input_ids=torch.tensor([ids]))
            finally:
                for hook in hooks:
                    hook.remove()
            return taken["h"][0]

        return final

    out = []
    for layer in range(1, lm.n_layers):
        full = torch.autograd.functional.jacobian(
            downstream(layer), states[layer][0].detach()
        )  # [T, d, T, d]
        out.append(sum(full[u, :, t, :] for t in valid for u in valid if u >= t) / len(valid))
    return torch.stack(out)


@pytest.fixture
def tiny4():
    return wrap(tiny_model("llama", num_hidden_layers=4), CharTokenizer(), name="tiny-llama-4")


def test_the_fit_equals_autograd_summed_and_averaged_as_the_spec_says(tiny4, tmp_path):
    prompts = [_ids(22, 0), _ids(20, 1)]
    expected = [autograd_jacobian(tiny4, p) for p in prompts]
    for p, want in zip(prompts, expected, strict=True):  # one prompt, cotangents batched 5 at a time
        got = prompt_jacobian(tiny4, p, dim_batch=5)
        assert_float32_equal(
            got, want, what="one prompt's J", mutants=[("a transposed J", got.transpose(1, 2))]
        )
    cfg = JacobianFitConfig(prompts=2, max_tokens=22, heldout=1, memory_mb=16, dtype="float32")
    stamp = fit_jacobian(tiny4, Prompts(prompts, [_ids(22, 2)], "test"), tmp_path / "j.pt", cfg)
    payload = torch.load(tmp_path / "j.pt", weights_only=True)
    fitted = torch.stack([payload["J"][b] for b in payload["source_layers"]])
    mean = (expected[0] + expected[1]) / 2  # prompts averaged
    assert_float32_equal(fitted, mean, what="the fitted J", mutants=[("a sum of prompts", 2 * mean)])
    assert stamp["prompts"] == {"fitted": 2, "asked": 2, "heldout": 1} and payload["n_prompts"] == 2
    assert set(stamp["heldout_kl"]) == {"logit", "jacobian"} and len(stamp["heldout_kl"]["jacobian"]) == 3
    assert not checkpoint_path(tmp_path / "j.pt").exists()  # a finished fit leaves only the artifact


def _random_artifact(lm, path: Path, noise: float = 0.3, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    d, n = hidden_size(lm), lm.n_layers - 1
    gen = torch.Generator().manual_seed(seed)
    weight = torch.eye(d) + noise * torch.randn(n, d, d, generator=gen)
    stamp = {"model": lm.name, "model_hash": model_fingerprint(lm), "n_layers": lm.n_layers, "d": d}
    stamp["heldout_kl"] = {"logit": [0.5] * n, "jacobian": [0.25] * n}
    save_artifact(path, weight, 3, {"corpus": "test", "depthlens": stamp}, dtype)
    return weight.to(dtype).float()


def test_the_readout_is_W_U_norm_J_h_by_hand(tiny_llama, tmp_path):
    weight = _random_artifact(tiny_llama, tmp_path / "j.pt")
    config = run_readout(lens=f"jacobian:{tmp_path / 'j.pt'}")
    assert config.lens.kind == "jacobian" and config.lens_digest is not None
    seq = TokenSequence([1, 5, 9], [7, 3, 11, 20, 4])
    (chunk,) = iter_readout(tiny_llama, [seq], config)
    with torch.no_grad():
        states = tiny_llama.model(
            input_ids=torch.tensor([[1, 5, 9, 7, 3, 11, 20]]), output_hidden_states=True
        )
    parts = tiny_llama.parts
    for layer in chunk.layers():
        h = states.hidden_states[layer.layer][0, 2:]  # the positions that predict the completion
        with torch.no_grad():  # the caller's model keeps its grad flags (wrap leaves them)
            by_hand = torch.log_softmax(
                parts.unembed(parts.final_norm(h @ weight[layer.layer - 1].T)), dim=-1
            )
            plain = torch.log_softmax(parts.unembed(parts.final_norm(h)), dim=-1)
        assert_float32_equal(
            layer.logprobs, by_hand, what=f"layer {layer.layer}", mutants=[("the logit lens", plain)]
        )
    # layer L is the model's own output: no J there
    assert torch.allclose(chunk.final.logprobs, torch.log_softmax(states.logits[0, 2:], -1), atol=1e-5)


def test_the_artifact_is_the_published_format_both_ways(tiny_llama, tmp_path):
    """A fixture written as the reference package and TransformerLens write it (float16 matrices under int block
    keys, source_layers 0..L−2, d_model, n_prompts, metadata) reads here with block b as layer b + 1; ours writes
    exactly those keys and dtypes."""
    d, n = hidden_size(tiny_llama), tiny_llama.n_layers - 1
    gen = torch.Generator().manual_seed(1)
    published = {
        "J": {b: torch.randn(d, d, generator=gen).half() for b in range(n)},
        "n_prompts": 100,
        "source_layers": list(range(n)),
        "d_model": d,
        "metadata": {"model_name": "someone-elses", "corpus": "wikitext"},
    }
    torch.save(published, tmp_path / "theirs.pt")
    spec = resolve_lens(f"jacobian:{tmp_path / 'theirs.pt'}")
    assert (spec.stamp["n_layers"], spec.stamp["d"], spec.stamp["n_prompts"]) == (n + 1, d, 100)
    assert spec.stamp["provenance"]["model_name"] == "someone-elses" and "model_hash" not in spec.stamp
    from depthlens.readout.lenses import matrices

    loaded = matrices(spec, "cpu").weight
    for b in range(n):
        assert torch.equal(loaded[b], published["J"][b].float())  # layer b + 1 reads block b's matrix
    weight = _random_artifact(tiny_llama, tmp_path / "ours.pt", dtype=torch.float16)
    ours = torch.load(tmp_path / "ours.pt", weights_only=True)
    assert list(ours) == ["J", "n_prompts", "source_layers", "d_model", "metadata"]
    assert (
        ours["source_layers"] == list(range(n))
        and ours["d_model"] == d
        and isinstance(ours["n_prompts"], int)
    )
    assert all(
        isinstance(b, int) and m.dtype == torch.float16 and m.shape == (d, d) for b, m in ours["J"].items()
    )
    assert torch.equal(torch.stack([ours["J"][b].float() for b in range(n)]), weight)


def test_transformer_lens_reads_ours_and_we_read_its(tmp_path):
    """Where TransformerLens is installed: its ``JacobianLens`` loads a lens saved here, and one it saves reads out
    here, with equal per-layer logits (its readout on a raw TransformerBridge of the same model against ours)."""
    analysis = pytest.importorskip("transformer_lens.tools.analysis")
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    from depthlens.models.load import load

    folder = save_chat_model(tmp_path / "tiny")
    lm = load(str(folder), device="cpu")
    weight = _random_artifact(lm, tmp_path / "ours.pt", noise=0.2)
    theirs = analysis.JacobianLens.load(str(tmp_path / "ours.pt"))
    assert theirs.source_layers == list(range(lm.n_layers - 1))
    assert torch.equal(torch.stack([theirs.jacobians[b] for b in theirs.source_layers]), weight)
    gen = torch.Generator().manual_seed(2)
    d = hidden_size(lm)
    saved = analysis.JacobianLens(
        {b: torch.eye(d) + 0.2 * torch.randn(d, d, generator=gen) for b in range(lm.n_layers - 1)},
        n_prompts=7,
        d_model=d,
    )
    saved.save(str(tmp_path / "theirs.pt"), dtype=torch.float32)
    bridge = bridge_module.TransformerBridge.boot_transformers(str(folder), device="cpu")
    text = "12+34=46"
    ids = bridge.to_tokens(text)
    result = saved.readout(bridge, ids, return_full_logits=True)
    (chunk,) = iter_readout(
        lm,
        [TokenSequence(ids[0, :1].tolist(), ids[0, 1:].tolist())],
        run_readout(lens=f"jacobian:{tmp_path / 'theirs.pt'}"),
    )
    for layer in chunk.layers():
        their_logits = result.lens_logits[layer.layer - 1][:-1]  # block l − 1; positions that predict a token
        assert_float32_equal(layer.logprobs, torch.log_softmax(their_logits, -1), what=f"layer {layer.layer}")


def _package_folder(lm, path: Path, noise: float, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A ``tuned-lens`` package folder for ``lm``: written by the package where it is installed, else by hand in
    its format (``params.pt`` of ``{i}.weight`` / ``{i}.bias``, ``config.json``). Returns the translators."""
    d, n = hidden_size(lm), lm.n_layers
    gen = torch.Generator().manual_seed(seed)
    translators = [
        (noise * torch.randn(d, d, generator=gen), noise * torch.randn(d, generator=gen)) for _ in range(n)
    ]
    try:
        from tuned_lens.nn.lenses import TunedLens as PackageLens

        lens = PackageLens.from_model(lm.model)
        with torch.no_grad():
            for module, (w, b) in zip(lens.layer_translators, translators, strict=True):
                module.weight.copy_(w)
                module.bias.copy_(b)
        lens.save(path)
    except ImportError:
        path.mkdir(parents=True)
        state = {
            f"{i}.{k}": t for i, (w, b) in enumerate(translators) for k, t in (("weight", w), ("bias", b))
        }
        torch.save(state, path / "params.pt")
        config = {"base_model_name_or_path": lm.name, "d_model": d, "num_hidden_layers": n, "bias": True}
        (path / "config.json").write_text(json.dumps({**config, "lens_type": "linear_tuned_lens"}))
    return translators


def test_a_tuned_lens_package_folder_reads_in_its_residual_form(tiny_llama, tmp_path):
    translators = _package_folder(tiny_llama, tmp_path / "pkg", noise=0.1)
    config = run_readout(lens=f"tuned:{tmp_path / 'pkg'}")  # the same prefix as depthlens's own folder
    assert config.lens.kind == "tuned-package" and str(config.lens).startswith("tuned-package:")
    assert config.lens.stamp["form"].startswith("residual")
    seq = TokenSequence([1, 5, 9], [7, 3, 11, 20, 4])
    (chunk,) = iter_readout(tiny_llama, [seq], config)
    with torch.no_grad():
        states = tiny_llama.model(
            input_ids=torch.tensor([[1, 5, 9, 7, 3, 11, 20]]), output_hidden_states=True
        )
    parts = tiny_llama.parts
    try:
        from tuned_lens.nn.lenses import TunedLens as PackageLens

        package = PackageLens.from_model_and_pretrained(tiny_llama.model, str(tmp_path / "pkg"))
    except ImportError:
        package = None
    for layer in chunk.layers():
        h = states.hidden_states[layer.layer][0, 2:]
        w, b = translators[layer.layer]  # translator l reads hidden_states[l]: h + W h + b
        with torch.no_grad():  # the caller's model keeps its grad flags (wrap leaves them)
            if package is not None:
                theirs = package(h, layer.layer)  # the package's own readout
            else:
                theirs = parts.unembed(parts.final_norm(h + h @ w.T + b))
            affine = torch.log_softmax(parts.unembed(parts.final_norm(h @ w.T + b)), -1)  # not residual
        assert_float32_equal(
            layer.logprobs,
            torch.log_softmax(theirs, -1),
            what=f"layer {layer.layer}",
            mutants=[("W h + b", affine)],
        )


BAD = {
    "another d_model": lambda d, n: {"J": {b: torch.eye(d + 1) for b in range(n)}, "d_model": d + 1},
    "a layer missing": lambda d, n: {"J": {b: torch.eye(d) for b in range(n - 1)}, "d_model": d},
    "a layer more": lambda d, n: {"J": {b: torch.eye(d) for b in range(n + 1)}, "d_model": d},
    "a gap": lambda d, n: {"J": {b: torch.eye(d) for b in (0, n)}, "d_model": d},
    "NaN": lambda d, n: {"J": {b: torch.full((d, d), float("nan")) for b in range(n)}, "d_model": d},
    "inf": lambda d, n: {"J": {b: torch.full((d, d), float("inf")) for b in range(n)}, "d_model": d},
    "non-square": lambda d, n: {"J": {b: torch.ones(d, d + 2) for b in range(n)}, "d_model": d},
}
SAID = {
    "another d_model": "d ",
    "a layer missing": "missing",
    "a layer more": "extra",
    "a gap": "missing",
    "NaN": "NaN or infinite",
    "inf": "NaN or infinite",
    "non-square": "not a square",
}


class Code:
    """An object a pickle can only rebuild by running code."""

    def __reduce__(self):
        return (print, ("this ran",))


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return save_chat_model(tmp_path_factory.mktemp("tiny-chat"))


def _bad_artifact(case: str, path: Path) -> Path:
    d, n = 32, 2  # the tiny llama: d = 32, L = 3
    if case == "pickled code":
        with path.open("wb") as f:
            pickle.dump({"J": Code(), "d_model": d}, f)
    else:
        payload = BAD[case](d, n)
        torch.save({**payload, "n_prompts": 1, "source_layers": sorted(payload["J"])}, path)
    return path


@pytest.mark.parametrize("case", [*BAD, "pickled code"])
def test_a_bad_artifact_is_one_line_naming_the_setting_and_nothing_is_written(case, tiny_chat, tmp_path):
    import depthlens

    bad = _bad_artifact(case, tmp_path / "bad.pt")
    records = [{"id": "a", "prompt_ids": [1, 4], "completion_ids": [5, 6]}]
    with pytest.raises(InputError) as raised:
        depthlens.score(tiny_chat, records, lens=f"jacobian:{bad}")
    message = str(raised.value)
    assert message.startswith(f"depthlens.score(lens='jacobian:{bad}'): ") and "\n" not in message
    assert (
        ("needs pickled code" in message and "weights_only" in message)
        if case == "pickled code"
        else (SAID[case] in message)
    ), message


@pytest.mark.parametrize("case", ["another d_model", "pickled code"])
def test_the_command_line_says_it_in_one_line_and_writes_nothing(
    case, chat_dir, tmp_path, monkeypatch, capsys
):
    bad = _bad_artifact(case, tmp_path / "bad.pt")
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": "1+2=", "completion": "3"}) + "\n")
    out = tmp_path / "out"
    code, _, err = run(
        monkeypatch,
        capsys,
        "score",
        "--model",
        chat_dir,
        "--in",
        src,
        "--out",
        out,
        "--lens",
        f"jacobian:{bad}",
    )
    last = " ".join(err.split("error: ", 1)[-1].split())
    assert code == 2 and err.count("error: ") == 1 and last.startswith(f"--lens jacobian:{bad}: "), err
    assert ("(d 33 ≠ 32)" if case == "another d_model" else "needs pickled code") in last
    assert not out.exists()


def test_a_lens_for_another_model_is_refused_by_what_differs(tiny_llama, tmp_path):
    deeper = wrap(tiny_model("llama", num_hidden_layers=5), name="deeper")
    _random_artifact(deeper, tmp_path / "deep.pt")
    seqs = [TokenSequence([1, 5], [7, 3])]
    with pytest.raises(
        InputError, match=r"J for layers 1\.\.4, LlamaForCausalLM has L − 1 = 2 \(layers 3\.\.4 extra\)"
    ):
        list(iter_readout(tiny_llama, seqs, run_readout(lens=f"jacobian:{tmp_path / 'deep.pt'}")))
    other = wrap(tiny_model("llama", seed=1), name="other-llama")
    _random_artifact(other, tmp_path / "other.pt")
    with pytest.raises(InputError, match=r"fitted to 'other-llama'.*model_hash"):
        list(iter_readout(tiny_llama, seqs, run_readout(lens=f"jacobian:{tmp_path / 'other.pt'}")))
    with pytest.raises(InputError, match=r"no such file there; give a J-lens \.pt artifact"):
        run_readout(lens=f"jacobian:{tmp_path / 'none.pt'}")


def test_resume_under_another_lens_is_refused(tiny_llama, tmp_path):
    from depthlens.config import ScoreRun, StoreSpec
    from depthlens.errors import StoreError
    from depthlens.studies.score import run_score

    rows = [{"id": f"r{i}", "prompt_ids": [4, 5 + i], "completion_ids": [7, 8, 9 + i]} for i in range(2)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _random_artifact(tiny_llama, tmp_path / "j.pt")
    lens = run_readout(lens=f"jacobian:{tmp_path / 'j.pt'}")
    run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "j.jsonl"), readout=lens))
    manifest = json.loads((tmp_path / "j.jsonl.manifest.json").read_text())["readout"]
    assert manifest["lens"] == f"jacobian:{tmp_path / 'j.pt'}" and manifest["lens_digest"] == lens.lens_digest
    from depthlens.studies.lens_compare import lens_kl, load_arm
    from depthlens.viz.lens import draw_lens_comparison

    arm = load_arm(tmp_path / "j.jsonl")  # lens compare labels the arm and reads the stamp's held-out KL
    assert arm.label == "jacobian (j.pt) · jsd"
    kl = lens_kl([arm])
    assert kl == {str(lens.lens): {"logit": [0.5, 0.5], "jacobian": [0.25, 0.25]}}
    assert draw_lens_comparison(kl, {arm.label: [1, 2]}, 3, tmp_path / "cmp.png").stat().st_size > 0
    with pytest.raises(StoreError, match=r"readout.lens: stored 'jacobian:.*', this run 'logit'"):
        run_score(tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "j.jsonl", resume=True)))
    _random_artifact(tiny_llama, tmp_path / "j.pt", seed=5)  # refitted in place: another digest
    with pytest.raises(StoreError, match=r"readout\.lens_digest"):
        run_score(
            tiny_llama,
            ScoreRun(
                src, StoreSpec(tmp_path / "j.jsonl", resume=True), readout=run_readout(lens=str(lens.lens))
            ),
        )


def test_the_fit_resumes_from_its_checkpoint_and_refuses_another_fits(tiny4, tmp_path):
    prompts = Prompts([_ids(20, i) for i in range(3)], [_ids(20, 9)], "test")
    cfg = JacobianFitConfig(prompts=3, max_tokens=20, heldout=1, dtype="float32")
    once = fit_jacobian(tiny4, prompts, tmp_path / "once.pt", cfg)

    def interrupt(done, total, seconds):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit_jacobian(tiny4, prompts, tmp_path / "part.pt", cfg, progress=interrupt)
    state = torch.load(checkpoint_path(tmp_path / "part.pt"), weights_only=True)
    assert state["n_done"] == 2 and set(state) >= {
        "jacobian_sum",
        "next_idx",
        "source_layers",
        "target_layer",
    }
    other = Prompts(prompts.train[::-1], prompts.heldout, "test")
    with pytest.raises(InputError, match=r"^resume=True: .* belongs to another fit \(prompts_digest"):
        fit_jacobian(tiny4, other, tmp_path / "part.pt", cfg, resume=True)
    more = fit_jacobian(tiny4, prompts, tmp_path / "part.pt", cfg, resume=True)
    for lens in ("logit", "jacobian"):  # resumed 2 → 3 equals a fit run 0 → 3 at once
        assert_float32_equal(more["heldout_kl"][lens], once["heldout_kl"][lens], what=f"held-out KL, {lens}")
    a = torch.load(tmp_path / "part.pt", weights_only=True)["J"]
    b = torch.load(tmp_path / "once.pt", weights_only=True)["J"]
    assert all(torch.allclose(a[k], b[k], rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL) for k in a)
    cut = fit_jacobian(
        tiny4, prompts, tmp_path / "cut.pt", JacobianFitConfig(**{**cfg.to_dict(), "max_seconds": 1e-9})
    )
    assert (
        cut["prompts"]["fitted"] == 1 and checkpoint_path(tmp_path / "cut.pt").exists()
    )  # kept for --resume


def test_lens_fit_kind_jacobian_on_the_command_line(chat_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "j.pt"
    args = ["lens", "fit", "--kind", "jacobian", "--model", chat_dir, "--out", out, "--prompt-tokens", "24"]
    code, _, err = run(monkeypatch, capsys, *args, "--steps", "5")
    assert code == 2 and "--steps 5: it sets a --kind tuned fit; leave it out for --kind jacobian" in err
    code, _, err = run(monkeypatch, capsys, *args, "--prompt-tokens", "10")
    assert code == 2 and "--prompt-tokens 10: must be ≥ 18" in " ".join(err.split())
    import depthlens.studies.jacobian_fit as fit_module
    from depthlens.cli.app import Terminated

    real, calls = fit_module.prompt_jacobian, []

    def stop_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise Terminated
        return real(*a, **k)

    monkeypatch.setattr(fit_module, "prompt_jacobian", stop_second)
    code, _, err = run(monkeypatch, capsys, *args, "--prompts", "3", "--heldout-prompts", "2")
    line = " ".join(err.split())
    assert (
        code == 143
        and f"terminated: the fit's checkpoint is kept in {out}.checkpoint.pt (1 prompts done)" in line
    )
    assert "continue with: depthlens" in line and line.rstrip().endswith("--resume")
    monkeypatch.setattr(fit_module, "prompt_jacobian", real)
    code, out_text, err = run(
        monkeypatch, capsys, *args, "--prompts", "3", "--heldout-prompts", "2", "--resume"
    )
    assert code in (0, None), err
    assert "jacobian lens" in out_text and f"wrote {out} (3 of 3 prompts" in " ".join(err.split())
    code, _, err = run(monkeypatch, capsys, *args)
    assert code == 2 and "exists; add --resume" in err
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": "1+2=", "completion": "3 and 4"}) + "\n")
    code, _, err = run(
        monkeypatch,
        capsys,
        "score",
        "--model",
        chat_dir,
        "--in",
        src,
        "--out",
        tmp_path / "s",
        "--lens",
        f"jacobian:{out}",
    )
    assert code in (0, None), err
    code, _, err = run(
        monkeypatch,
        capsys,
        *("heatmap", "--model", chat_dir, "--completion", "12 34", "--out", tmp_path / "h"),
        *("--lens", f"jacobian:{out}"),
    )
    assert code in (0, None), err
    assert "through the Jacobian lens (j.pt)" in (tmp_path / "h" / "heatmap.html").read_text()


def test_readout_config_is_a_value(tmp_path, monkeypatch):
    """No file is read when a ReadoutConfig is built or replaced; its dict keeps the lens's text and digest."""
    import dataclasses

    import depthlens.readout.lenses as lenses

    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    _random_artifact(lm, tmp_path / "j.pt")
    config = run_readout(lens=f"jacobian:{tmp_path / 'j.pt'}")
    reads = []
    monkeypatch.setattr(lenses, "format_of", lambda spec: reads.append(spec) or pytest.fail("read"))
    again = dataclasses.replace(config, layer_top_k=3)  # the hf server, per request
    assert again.lens is config.lens and not reads
    data = config.to_dict()
    assert data["lens"] == f"jacobian:{tmp_path / 'j.pt'}" and data["lens_digest"] == config.lens.digest
    back = ReadoutConfig.from_dict(data)
    assert back.lens == config.lens and back.to_dict() == data and not reads
