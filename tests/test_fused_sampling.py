"""The sampler's readout through the fused compiled kernel equals its eager readout (tests/tolerance.py), falls
back to eager where compiling fails, and ``--compile auto`` switches to it once it pays; a store begun on one
path resumes on the other; threads are chosen for the work."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from depthlens.config import EngineConfig, GenerateRun, ReadoutConfig, SamplingConfig, StoreSpec
from depthlens.errors import ConfigError
from depthlens.evals.tasks import Question
from depthlens.metrics import fused
from depthlens.models import threads
from depthlens.sampling.hf import HFGenerator
from depthlens.stores.samples import iter_samples
from depthlens.studies.generate import generate
from tests.tolerance import assert_float32_equal, shifted

PROMPT = [1, 5, 6, 7]
SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=10, readout_tokens=None)
KINDS = ("kl", "cosine")


def _sample(lm, compile_: str, seeds=(3, 4, 5)):
    readout = ReadoutConfig(compile=compile_, also=KINDS)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no C++ compiler on some machines: then the fallback answers
        return HFGenerator(lm, SAMPLING, readout).sample(PROMPT, list(seeds))


def _rows(traces, kind: str = "jsd") -> np.ndarray:
    return np.concatenate([np.asarray(t.divergence if kind == "jsd" else t.also[kind]) for t in traces])


def test_fused_sampler_readout_equals_the_eager_one(tiny_chat):
    """Every stored divergence kind (JSD, KL fused; cosine beside them) equals the eager path's within float32
    reordering, a shifted token row does not; the tokens and final-layer values are the same."""
    eager, compiled = _sample(tiny_chat, "off"), _sample(tiny_chat, "on")
    assert [t.token_ids for t in compiled] == [t.token_ids for t in eager]
    assert [t.log_prob for t in compiled] == [t.log_prob for t in eager]
    for kind in ("jsd", *KINDS):
        got, want = _rows(compiled, kind), _rows(eager, kind)
        assert_float32_equal(got, want, what=kind, mutants=[("a dropped token", shifted(got))])


def test_a_failed_compilation_falls_back_to_the_same_numbers(tiny_chat, monkeypatch):
    def broken(fn, **_):
        def fail(*a, **k):
            raise RuntimeError("no compiler here")

        return fail

    monkeypatch.setattr(fused.torch, "compile", broken)
    readout = ReadoutConfig(compile="on")
    with pytest.warns(RuntimeWarning, match="compiled readout unavailable .*no compiler here"):
        traces = HFGenerator(tiny_chat, SAMPLING, readout).sample(PROMPT, [3, 4])
    eager = HFGenerator(tiny_chat, SAMPLING, ReadoutConfig(compile="off")).sample(PROMPT, [3, 4])
    assert_float32_equal(_rows(traces), _rows(eager), what="fallback")


def test_compile_auto_compiles_once_the_eager_readout_ran_long_enough(tiny_chat, monkeypatch):
    """``auto`` on a CPU: eager until ``AUTO_COMPILE_AFTER_S`` CPU-seconds of readout have run, compiled after
    (the same numbers either side of the switch); ``on`` and ``off`` never change; CUDA compiles from the start."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(fused, "AUTO_COMPILE_AFTER_S", 1.0)
    rule = fused.CompileRule("auto", cpu)
    assert not rule.compiled
    rule.note(0.6)
    assert not rule.compiled
    rule.note(0.4)
    assert rule.compiled
    assert fused.CompileRule("on", cpu).compiled and fused.CompileRule("auto", torch.device("cuda")).compiled
    never = fused.CompileRule("off", cpu)
    never.note(1e9)
    assert not never.compiled
    monkeypatch.setattr(fused, "AUTO_COMPILE_AFTER_S", 1e-9)  # compiled from the second step on
    switched = _sample(tiny_chat, "auto")
    assert_float32_equal(_rows(switched), _rows(_sample(tiny_chat, "off")), what="auto")


def test_a_store_begun_eager_resumes_compiled_and_on_other_threads(tiny_chat, tmp_path):
    """``compile`` and ``threads`` say how the work runs, not what it stores: a store written eagerly resumes with
    the compiled kernel (not refused), and the responses it adds equal an eager run's."""
    questions = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]
    sampling = SamplingConfig(max_new_tokens=6, readout_tokens=None)

    def run(out, compile_, resume=False, n=2, engine=EngineConfig()):
        spec = StoreSpec(out, resume=resume, overwrite=not resume)
        readout = ReadoutConfig(compile=compile_)  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            generate(
                tiny_chat,
                GenerateRun(spec, pool=2, sampling=sampling, readout=readout, batch_size=2, engine=engine),
                questions[:n],
            )
        return {r["id"]: r for r in iter_samples(out)}

    run(tmp_path / "mixed", "off", n=1)
    mixed = run(tmp_path / "mixed", "on", resume=True, engine=EngineConfig(threads=1))
    eager = run(tmp_path / "eager", "off")
    assert sorted(mixed) == sorted(eager)
    for key, record in eager.items():
        assert mixed[key]["token_ids"] == record["token_ids"]
        assert_float32_equal(mixed[key]["divergence"], record["divergence"], rounded=True, what=key)


def test_threads_are_chosen_for_the_work(monkeypatch):
    default = torch.get_num_threads()
    monkeypatch.setattr(threads, "_TORCH_DEFAULT", [default])
    assert threads.threads_for("sample", "cpu")[0] == 1
    assert threads.threads_for("sample", "cuda")[0] == 1
    assert threads.threads_for("score", "cpu")[0] == default
    assert threads.threads_for("sample", "cpu", 3) == (3, "as asked")
    assert "threads: 1 (" in threads.threads_line("sample", "cpu") and "--threads N" in threads.threads_line(
        "sample", "cpu"
    )
    try:
        assert threads.use_threads("sample", "cpu", 2) == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(default)
    monkeypatch.delenv(threads.WAIT_POLICY, raising=False)
    threads.passive_wait()
    assert threads.os.environ[threads.WAIT_POLICY] == "PASSIVE"
    monkeypatch.setenv(threads.WAIT_POLICY, "ACTIVE")
    threads.passive_wait()  # the user's own setting stays
    assert threads.os.environ[threads.WAIT_POLICY] == "ACTIVE"
    with pytest.raises(ConfigError, match=r"^threads=0: must be ≥ 1"):
        EngineConfig(threads=0)


def test_a_run_leaves_torch_on_the_threads_it_found():
    """A run's thread choice ends with it (``threads_kept``, around every command and Python verb): torch gets back
    the count it had, so a notebook's own work — or the next run in the same process — is not left on one thread
    (a killed run resumed in-process then read out on other threads than its uninterrupted twin)."""
    before = torch.get_num_threads()
    odd = 3 if before != 3 else 2  # a count the sampler would not choose
    torch._C.set_num_threads(odd)  # torch's own: vLLM in this process makes the other a no-op
    try:
        with threads.threads_kept():
            threads.use_threads("sample", "cpu")
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == odd
    finally:
        torch._C.set_num_threads(before)
