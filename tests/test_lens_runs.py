"""``--lens tuned:LENS`` beyond ``score``: generation (the CLI's ``generate`` / ``thinkn`` and the Python API), the
server, and the stores they stamp (issue 43, items 2 and 6). Identity translators must read exactly what the logit
lens reads; a random translator must change what is read (so the lens really reaches the per-layer readout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import depthlens
from depthlens.config import ReadoutConfig, ServeConfig
from depthlens.errors import InputError
from depthlens.readout.tuned import hidden_size, model_fingerprint, save_lens
from depthlens.stores.samples import read_manifest, read_responses
from tests.conftest import save_chat_model
from tests.test_cli import run

TASK = "reasoning_gym:chain_sum"
SMALL = {"questions": 2, "max_new_tokens": 6, "task_config": "min_terms=2,max_terms=2,max_digits=1"}


def tuned_lens(lm, path: Path, noise: float = 0.0, seed: int = 0) -> dict:
    """A lens folder for ``lm`` at ``path``: identity translators (``noise`` 0), or identity plus Gaussian noise of
    that scale in A_l and b_l (a translator that reads something else). Returns its stamp."""
    d, n = hidden_size(lm), lm.n_layers - 1
    gen = torch.Generator().manual_seed(seed)
    weight = torch.eye(d).repeat(n, 1, 1) + noise * torch.randn(n, d, d, generator=gen)
    bias = noise * torch.randn(n, d, generator=gen)
    stamp = {"model": lm.name, "model_hash": model_fingerprint(lm), "n_layers": lm.n_layers, "d": d}
    stamp["heldout_kl"] = {"logit": [0.5] * n, "tuned": [0.5] * n}
    return save_lens(path, weight, bias, stamp)


def jacobian_lens(lm, path: Path, noise: float = 0.0, seed: int = 0) -> dict:
    """A J-lens artifact for ``lm`` at ``path`` (float32): identity matrices (``noise`` 0 — the logit lens), or
    identity plus Gaussian noise. Returns its stamp, with the file's digest."""
    from depthlens.readout.jacobian import save_artifact
    from depthlens.readout.lens_files import file_digest

    d, n = hidden_size(lm), lm.n_layers - 1
    weight = torch.eye(d).repeat(n, 1, 1) + noise * torch.randn(
        n, d, d, generator=torch.Generator().manual_seed(seed)
    )
    stamp = {"model": lm.name, "model_hash": model_fingerprint(lm), "n_layers": lm.n_layers, "d": d}
    stamp["heldout_kl"] = {"logit": [0.5] * n, "jacobian": [0.5] * n}
    save_artifact(path, weight, 1, {"depthlens": stamp}, torch.float32)
    return {**stamp, "digest": file_digest(path)}


def package_lens(lm, path: Path, noise: float = 0.0, seed: int = 0) -> dict:
    """A ``tuned-lens`` package folder for ``lm`` (its format, by hand): zero translators (``noise`` 0: h + 0 —
    the logit lens), or Gaussian ones. Returns what depthlens reads of it, with the digest."""
    from depthlens.readout.lens_files import file_digest

    d, n = hidden_size(lm), lm.n_layers
    gen = torch.Generator().manual_seed(seed)
    path.mkdir(parents=True)
    state = {}
    for i in range(n):
        state[f"{i}.weight"] = noise * torch.randn(d, d, generator=gen)
        state[f"{i}.bias"] = noise * torch.randn(d, generator=gen)
    torch.save(state, path / "params.pt")
    config = {"base_model_name_or_path": lm.name, "d_model": d, "num_hidden_layers": n, "bias": True}
    (path / "config.json").write_text(json.dumps({**config, "lens_type": "linear_tuned_lens"}))
    return {"digest": file_digest(path / "params.pt")}


LENSES = {  # kind → (how to make one, the file name, the prefix it is given by, the kind a store states)
    "tuned": (tuned_lens, "lens", "tuned", "tuned"),
    "tuned-package": (package_lens, "pkg", "tuned", "tuned-package"),
    "jacobian": (jacobian_lens, "j.pt", "jacobian", "jacobian"),
}


def make_lens(kind: str, lm, folder: Path, noise: float = 0.0, seed: int = 0) -> tuple[str, str, dict]:
    """A lens of ``kind`` in ``folder``: (the text a front gives, the text a store states, its stamp)."""
    maker, name, given, stated = LENSES[kind]
    folder.mkdir(parents=True, exist_ok=True)
    stamp = maker(lm, folder / name, noise, seed)
    return f"{given}:{folder / name}", f"{stated}:{folder / name}", stamp


def _pool(lm, out: Path, **settings) -> list[dict]:
    depthlens.generate(lm, TASK, pool=2, batch_size=2, readout_tokens=None, out=out, **SMALL, **settings)
    return [record for _, record in read_responses(out)]


@pytest.mark.parametrize("kind", list(LENSES))
def test_generate_reads_through_each_lens_identity_exactly_as_the_logit_lens(kind, tiny_chat, tmp_path):
    lens, stated, identity = make_lens(kind, tiny_chat, tmp_path / "identity")
    random, _, _ = make_lens(kind, tiny_chat, tmp_path / "random", noise=0.2)
    plain = _pool(tiny_chat, tmp_path / "logit")
    same = _pool(tiny_chat, tmp_path / "same", lens=lens)
    other = _pool(tiny_chat, tmp_path / "other", lens=random)
    assert same == plain  # every field: tokens, divergence rows, depth
    assert [r["token_ids"] for r in other] == [r["token_ids"] for r in plain]  # the lens changes no sample
    assert [r["divergence"] for r in other] != [r["divergence"] for r in plain]  # but what is read
    readout = read_manifest(tmp_path / "same")["readout"]
    assert readout["lens"] == stated and readout["lens_digest"] == identity["digest"]  # the form stated
    assert read_manifest(tmp_path / "logit")["readout"]["lens_digest"] is None


@pytest.mark.parametrize("kind", ["tuned", "jacobian"])
def test_the_api_stamps_the_lens_and_think_at_n_votes_on_the_pools_own(kind, tiny_chat, tmp_path):
    given, stored, _ = make_lens(kind, tiny_chat, tmp_path)
    records = [{"id": "a", "prompt_ids": [4, 5, 6], "completion_ids": [7, 8, 9, 10]}]
    assert depthlens.score(tiny_chat, records, lens=given).to_pylist() == (
        depthlens.score(tiny_chat, records).to_pylist()
    )
    with pytest.raises(InputError, match=r"no fitted lens there|no such file there"):
        depthlens.score(tiny_chat, records, lens=f"{kind}:{tmp_path / 'none'}")
    _pool(tiny_chat, tmp_path / "pool", lens=given)
    assert depthlens.think_at_n(tmp_path / "pool", lens=stored, n=2).num_rows > 0
    with pytest.raises(InputError, match=rf"lens='logit'\): .* was read out through lens='{stored}', and"):
        depthlens.think_at_n(tmp_path / "pool", lens="logit", n=2)
    policy = {"warmup": 2, "max_n": 3, "batch_size": 2, "prefix": 4}
    depthlens.online(tiny_chat, TASK, out=tmp_path / "online", lens=given, **policy, **SMALL)
    assert read_manifest(tmp_path / "online")["readout"]["lens"] == stored


def test_the_engine_gets_the_lens_checked_against_the_checkpoint(chat_dir, tmp_path):
    """The vLLM driver holds no transformers weights: the lens's fingerprint is checked against the checkpoint's
    files (the same hash as the loaded model's), and the worker gets the folder and the fit's digest."""
    from depthlens.models.info import info_of
    from depthlens.models.load import load, wrap
    from depthlens.sampling.vllm.settings import RequestReadout
    from depthlens.sampling.vllm.tuned import checkpoint_fingerprint, engine_lens, load_translators
    from tests.conftest import CharTokenizer, tiny_model

    lm = load(str(chat_dir), device="cpu")
    info = info_of(lm)  # the tokenizer, config and checkpoint directory: no weights
    assert checkpoint_fingerprint(info) == model_fingerprint(lm)
    stamp = tuned_lens(lm, tmp_path / "lens", noise=0.1)
    readout = ReadoutConfig(lens=f"tuned:{tmp_path / 'lens'}")
    sent = engine_lens(readout, info, info)
    assert sent == {"lens": f"tuned:{(tmp_path / 'lens').resolve()}", "lens_digest": stamp["digest"]}
    assert engine_lens(ReadoutConfig(), info, info) == {"lens": None, "lens_digest": None}
    settings = RequestReadout(4, **sent)
    assert RequestReadout.from_extra(settings.to_extra()) == settings
    from depthlens.sampling.vllm.depth import EngineDepth  # the server's requests on vLLM

    served = RequestReadout.from_extra(EngineDepth(info, readout).request_args("t", 4))
    assert served is not None and (served.lens, served.lens_digest) == (sent["lens"], sent["lens_digest"])
    weight, _ = load_translators(
        sent["lens"], sent["lens_digest"], lm.n_layers, hidden_size(lm), torch.device("cpu")
    )
    assert weight.shape == (lm.n_layers - 1, hidden_size(lm), hidden_size(lm))
    with pytest.raises(InputError, match="holds another fit than 0000"):
        load_translators(sent["lens"], "0000", lm.n_layers, hidden_size(lm), torch.device("cpu"))
    other = wrap(tiny_model("llama", seed=1), CharTokenizer(), name="other-llama")
    tuned_lens(other, tmp_path / "other")
    with pytest.raises(InputError, match=r"fitted to 'other-llama', not to .*\(model_hash"):
        engine_lens(ReadoutConfig(lens=f"tuned:{tmp_path / 'other'}"), info, info)
    with pytest.raises(InputError, match="no fitted lens there"):
        engine_lens(ReadoutConfig(lens=f"tuned:{tmp_path / 'none'}"), info, info)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return save_chat_model(tmp_path_factory.mktemp("tiny-chat"))


def _generate_args(chat_dir: Path, out: Path) -> list[str]:
    return [
        "generate",
        "--model",
        str(chat_dir),
        "--device",
        "cpu",
        "--task",
        TASK,
        "--questions",
        "1",
        "--max-new-tokens",
        "4",
        "--pool",
        "2",
        "--out",
        str(out),
    ]


def test_generate_and_thinkn_stamp_the_lens_and_refuse_another(chat_dir, tmp_path, monkeypatch, capsys):
    from depthlens.models.load import load

    lm = load(str(chat_dir), device="cpu")
    stamp = tuned_lens(lm, tmp_path / "lens")
    lens = f"tuned:{tmp_path / 'lens'}"
    args = _generate_args(chat_dir, tmp_path / "s")
    code, _, err = run(monkeypatch, capsys, *args, "--lens", lens)
    assert code in (0, None), err
    readout = read_manifest(tmp_path / "s")["readout"]
    assert readout["lens"] == lens and readout["lens_digest"] == stamp["digest"]
    # a resume under another lens, or after the folder was refitted, is refused by the resume check
    code, _, err = run(monkeypatch, capsys, *args, "--resume")
    assert code == 2 and f"readout.lens: stored '{lens}', this run 'logit'" in " ".join(err.split())
    tuned_lens(lm, tmp_path / "lens", noise=0.1)
    code, _, err = run(monkeypatch, capsys, *args, "--lens", lens, "--resume")
    assert code == 2 and "readout.lens_digest: stored" in " ".join(err.split())
    # Think@n votes on what the store holds: another lens with --from is refused, naming both
    code, _, err = run(monkeypatch, capsys, "thinkn", "--from", tmp_path / "s", "--n", "2", "--lens", "logit")
    assert code == 2 and " ".join(err.split()) == (
        f"error: --lens logit: {tmp_path / 's'} was read out through --lens {lens}, and Think@n votes on what "
        "it holds; leave out --lens, or generate a store with --lens logit"
    )
    spelled = f"tuned:{tmp_path}/./lens"  # the same folder, however it is spelled
    code, _, err = run(monkeypatch, capsys, "thinkn", "--from", tmp_path / "s", "--n", "2", "--lens", spelled)
    assert code in (0, None), err
    # a lens folder that holds none is refused before anything loads or is created
    code, _, err = run(
        monkeypatch, capsys, *_generate_args(chat_dir, tmp_path / "v"), "--lens", "tuned:nowhere"
    )
    assert code == 2 and "--lens tuned:nowhere: no fitted lens there" in err and not (tmp_path / "v").exists()


def test_thinkn_samples_a_new_pool_through_the_lens(chat_dir, tmp_path, monkeypatch, capsys):
    from depthlens.models.load import load

    stamp = tuned_lens(load(str(chat_dir), device="cpu"), tmp_path / "lens")
    args = _generate_args(chat_dir, tmp_path / "t")[1:]
    code, _, err = run(
        monkeypatch, capsys, "thinkn", *args, "--n", "2", "--lens", f"tuned:{tmp_path / 'lens'}"
    )
    assert code in (0, None), err
    assert read_manifest(tmp_path / "t")["readout"]["lens_digest"] == stamp["digest"]


@pytest.mark.parametrize("kind", ["tuned", "jacobian"])
def test_serve_reads_every_depth_through_the_lens_and_says_which(kind, tiny_chat, tmp_path):
    from fastapi.testclient import TestClient

    from depthlens.models.load import wrap
    from depthlens.serve.app import create_app
    from depthlens.serve.engines import HFEngine
    from depthlens.studies.resolve import readout as run_readout
    from tests.conftest import CharTokenizer, tiny_model

    lens, _, stamp = make_lens(kind, tiny_chat, tmp_path)
    body = {
        "model": "tiny",
        "prompt": "12+3=",
        "n": 2,
        "max_tokens": 6,
        "seed": 3,
        "depthlens": {"tokens": True},
    }
    served = {}
    for name, readout in (("logit", ReadoutConfig()), ("tuned", run_readout(lens=lens))):
        engine = HFEngine(tiny_chat, readout)
        with TestClient(create_app(engine, tiny_chat.tokenizer, ServeConfig("tiny"))) as client:
            health = client.get("/health").json()
            reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        served[name] = reply.json()
        assert health["lens"] == str(readout.lens) and served[name]["depthlens"]["lens"] == str(readout.lens)
    assert health["lens_digest"] == stamp["digest"]
    for plain, tuned in zip(served["logit"]["choices"], served["tuned"]["choices"], strict=True):
        assert plain["text"] == tuned["text"]
        assert {**tuned["depthlens"], "lens": "logit"} == plain["depthlens"]  # identity: the very numbers
    other = wrap(tiny_model("llama", seed=1), CharTokenizer(), name="other-llama")
    with pytest.raises(InputError, match=r"fitted to .*model_hash"):
        HFEngine(other, run_readout(lens=lens))


def test_serve_cli_takes_lens(monkeypatch, capsys, tmp_path):
    """``serve --lens`` is refused before anything loads where the folder holds no lens."""
    pytest.importorskip("fastapi")
    code, _, err = run(monkeypatch, capsys, "serve", "--lens", f"tuned:{tmp_path}", "--backend", "hf")
    assert code == 2 and "no fitted lens there" in err


def test_cli_lens_help_names_tuned(monkeypatch, capsys):
    for verb in ("generate", "thinkn", "serve"):
        code, out, _ = run(monkeypatch, capsys, verb, "--help")
        assert code in (0, None) and "tuned:PATH" in out
    assert json.dumps(ReadoutConfig().to_dict())  # the manifest's readout stays JSON


def test_a_run_resolves_its_lens_once(tiny_chat, tmp_path, monkeypatch):
    """The lens is resolved once per run — parsed, its stamp read, its digest taken when the run's ReadoutConfig
    is built — and carried from there: the stamp file is read once, and the store's manifest has the digest."""
    from depthlens.readout.tuned import TunedFolder

    stamp = tuned_lens(tiny_chat, tmp_path / "lens")
    reads = []
    real = TunedFolder.read
    monkeypatch.setattr(
        TunedFolder, "read", lambda self, path, given: reads.append(path) or real(self, path, given)
    )
    _pool(tiny_chat, tmp_path / "pool", lens=f"tuned:{tmp_path / 'lens'}")
    assert len(reads) == 1
    assert read_manifest(tmp_path / "pool")["readout"]["lens_digest"] == stamp["digest"]
