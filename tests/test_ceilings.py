"""Every count a user gives has a ceiling (issue 59, item 6): a value that would exhaust the machine — a million
threads, a readout budget past the memory, a batch, trials or seeds whose arrays cannot fit — or that no run can
mean is refused before anything starts, naming the setting in each front's words: the command line's flag (exit
2), Python's keyword, the server's body field (400). The machine is pinned (``MACHINE``) so every message is
exact; the threads ceiling is checked without a thread started or a model loaded."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import depthlens
from depthlens.cli.app import main
from depthlens.config import CorrelationConfig, SamplingConfig, StoreSpec, VotingConfig
from depthlens.errors import DepthlensError
from depthlens.evals.tasks import Question
from depthlens.models import machine as machine_module
from depthlens.models.machine import Machine
from depthlens.studies import footprint, runs
from depthlens.voting.methods import METHODS
from tests.conftest import CharTokenizer, tiny_model
from tests.test_api import SMALL, TASK

HERE = "a test's machine"
MACHINE = Machine(cpus=2, cpus_from=HERE, memory=64 * 2**20, memory_from=HERE, tasks=1000, tasks_from=HERE)
"""A machine of 2 CPUs, 64 MiB and 1,000 tasks: the ceilings below are its."""
THREADS = (
    "must be at most 8 (4 × the 2 CPUs this process may use, from a test's machine): threads past the CPUs "
)
THREADS += "only wait on each other"
QUESTIONS = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]


@pytest.fixture
def machine(monkeypatch):
    monkeypatch.setattr(machine_module, "machine", lambda: MACHINE)
    return MACHINE


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny llama (loaded, and saved for the command line), a sample store of it and records to score."""
    from depthlens.models.load import wrap
    from tests.conftest import save_chat_model

    root = tmp_path_factory.mktemp("ceilings")
    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    store = root / "store"
    depthlens.generate(lm, TASK, pool=2, batch_size=2, out=store, progress=False, **SMALL)
    records = root / "in.jsonl"
    records.write_text(json.dumps({"id": "a", "prompt_ids": [4, 5], "completion_ids": [6, 7]}) + "\n")
    return {
        "lm": lm,
        "model": save_chat_model(root / "chat"),
        "store": store,
        "records": records,
        "root": root,
    }


def cli(monkeypatch, capsys, *args: object) -> str:
    """The one ``error:`` line of a command refused with exit 2 (no traceback)."""
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.setattr(sys, "argv", ["depthlens", *map(str, args)])
    with pytest.raises(SystemExit) as ended:
        main()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert ended.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0].removeprefix("error: ")


# ---------------------------------------------------------------------------------------------------------------
# Threads: refused by the run's builder, before torch's pool grows or any model loads.


@pytest.fixture
def nothing_started(monkeypatch):
    """Fails the test if a thread count is set or a model is loaded; checks no thread was started."""
    import depthlens.cli.app as app
    import depthlens.models.load as load
    import depthlens.models.threads as threads

    def refused(*args, **kwargs):
        raise AssertionError("reached past the threads check")

    monkeypatch.setattr(threads, "set_num_threads", refused)
    monkeypatch.setattr(load, "load", refused)
    monkeypatch.setattr(app, "load_for", refused)
    before = torch.get_num_threads(), threading.active_count()
    yield
    assert (torch.get_num_threads(), threading.active_count()) == before


def _cli_runs(w: dict, tmp: Path) -> dict[str, list[object]]:
    return {
        "score": ["score", "--in", w["records"], "--out", tmp / "s.jsonl", "--model", w["model"]],
        "generate": ["generate", "--out", tmp / "g", "--model", w["model"], "--backend", "hf"],
        "thinkn": ["thinkn", "--out", tmp / "t", "--model", w["model"], "--backend", "hf"],
        "online": ["thinkn", "--online", "--out", tmp / "o", "--model", w["model"], "--backend", "hf"],
    }


@pytest.mark.parametrize("command", ["score", "generate", "thinkn", "online"])
def test_the_command_line_refuses_threads_past_the_machine(
    command, world, machine, nothing_started, tmp_path, monkeypatch, capsys
):
    line = cli(monkeypatch, capsys, *_cli_runs(world, tmp_path)[command], "--threads", 9)
    assert line == f"--threads 9: {THREADS}"
    assert not any(tmp_path.iterdir())  # no --out left


def test_python_refuses_threads_past_the_machine(world, machine, nothing_started):
    records = [{"id": "a", "prompt_ids": [4, 5], "completion_ids": [6, 7]}]
    for verb, call in (
        ("score", lambda: depthlens.score("some-model", records, threads=9, progress=False)),
        ("generate", lambda: depthlens.generate("some-model", TASK, threads=9, progress=False, **SMALL)),
        (
            "online",
            lambda: depthlens.online("some-model", TASK, threads=9, prefix=5, progress=False, **SMALL),
        ),
    ):
        with pytest.raises(DepthlensError) as refused:
            call()
        assert str(refused.value) == f"depthlens.{verb}(threads=9): {THREADS}"


def test_threads_at_the_ceiling_are_taken(machine, nothing_started):
    built = runs.generate_run(store=StoreSpec(Path("x")), task=QUESTIONS, pool=2, engine={"threads": 8})
    assert built.run.engine.threads == 8
    assert runs.score_run(store=StoreSpec(Path("x")), engine={"threads": 8}).run.engine.threads == 8


def test_a_run_built_by_hand_cannot_start_them_either(machine):
    from depthlens.models.threads import use_threads

    before = torch.get_num_threads()
    with pytest.raises(DepthlensError, match=r"^threads=9: must be at most 8"):
        use_threads("score", "cpu", 9)
    assert torch.get_num_threads() == before


def test_a_million_threads_end_in_one_line_not_a_crash(tmp_path):
    """The issue's case in a real process on the real machine: exit 2 with the machine's count, where it once
    started a million OpenMP threads and died with SIGSEGV (exit 139)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", "from depthlens.cli.app import main; main()", "generate", "--backend", "hf",
         "--out", str(tmp_path / "g"), "--threads", "1000000"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "error: --threads 1000000: must be at most" in done.stderr and "Traceback" not in done.stderr
    assert f"the {machine_module.machine().cpus} CPU" in done.stderr
    assert not (tmp_path / "g").exists()


# ---------------------------------------------------------------------------------------------------------------
# Memory: a readout budget, a pool's batch, a scoring batch, the trials and seeds, against the memory.

BUDGET = (
    "needs 65 MiB at once (the readout's working-memory budget), and this process may use 64 MiB (from a "
)
BUDGET += "test's machine)"


def test_a_readout_budget_past_the_memory_is_refused(
    world, machine, nothing_started, tmp_path, monkeypatch, capsys
):
    score = _cli_runs(world, tmp_path)["score"]
    assert (
        cli(monkeypatch, capsys, *score, "--memory-mb", 65)
        == f"--memory-mb 65: {BUDGET}; use --memory-mb 64 or less"
    )
    with pytest.raises(DepthlensError) as refused:
        depthlens.generate("some-model", TASK, memory_mb=65, progress=False, **SMALL)
    assert str(refused.value) == f"depthlens.generate(memory_mb=65): {BUDGET}; use memory_mb=64 or less"
    assert runs.score_run(store=StoreSpec(Path("x")), readout={"memory_mb": 64}).run.readout.memory_mb == 64


def _pool_limit(lm, sampling: SamplingConfig) -> int:
    """The most responses of the tiny llama sampled together that fit ``MACHINE`` (by the footprint's count)."""
    per_token, fixed = footprint.response_bytes(lm, sampling, depthlens.config.ReadoutConfig(), 0, True)
    return MACHINE.memory // (per_token * sampling.max_new_tokens + fixed)


def test_a_pool_sampled_together_that_cannot_fit_is_refused(world, machine, tmp_path, monkeypatch, capsys):
    lm, sampling = world["lm"], SamplingConfig(max_new_tokens=100, readout_tokens=None)
    most = _pool_limit(lm, sampling)
    assert 1 < most < 100_000
    # At the ceiling (the prompt aside) the pool fits; one more response does not.
    footprint.check_pool(lm, sampling, depthlens.config.ReadoutConfig(), ("batch_size", most, most), 0)
    with pytest.raises(
        DepthlensError, match=rf"^batch_size={most + 1}: needs .* use batch_size={most} or less$"
    ):
        footprint.check_pool(
            lm, sampling, depthlens.config.ReadoutConfig(), ("batch_size", most + 1, most + 1), 0
        )
    big = most + 100
    with pytest.raises(DepthlensError) as refused:
        depthlens.generate(lm, QUESTIONS, pool=big, batch_size=big, max_new_tokens=100, readout_tokens=None,
                           progress=False)  # fmt: skip
    text = str(refused.value)
    assert (
        text.startswith(f"depthlens.generate(batch_size={big}): needs ")
        and f"{big} responses sampled together, each to 100 " in text
    )
    assert (
        "its KV cache (384 bytes a token)" in text
        and "this process may use 64 MiB (from a test's machine)" in text
    )
    line = cli(monkeypatch, capsys, "generate", "--model", world["model"], "--backend", "hf", "--out",
               tmp_path / "g", "--pool", big, "--batch-size", big, "--max-new-tokens", 100, "--questions", 1,
               "--readout-tokens", "all")  # fmt: skip
    assert line.startswith(f"--batch-size {big}: needs ") and line.endswith(" or less")
    assert not (tmp_path / "g").exists()


def test_a_response_that_alone_cannot_fit_names_max_new_tokens(world, machine):
    lm = world["lm"]
    sampling = SamplingConfig(max_new_tokens=1_000_000, readout_tokens=None)
    with pytest.raises(
        DepthlensError, match=r"^max_new_tokens=1000000: needs .*one response to that many tokens"
    ):
        footprint.check_pool(lm, sampling, depthlens.config.ReadoutConfig(), ("batch_size", 1, 1), 10)


def test_a_scoring_batch_that_cannot_fit_is_refused(world, machine):
    records = [{"id": "a", "prompt_ids": [4, 5], "completion_ids": [6, 7]}]
    with pytest.raises(
        DepthlensError, match=r"^depthlens.score\(batch_size=50000\): needs .* use batch_size=\d+ or less$"
    ):
        depthlens.score(world["lm"], records, batch_size=50_000, progress=False)
    assert depthlens.score(world["lm"], records, batch_size=1000, progress=False).num_rows == 1


def test_trials_whose_arrays_cannot_fit_are_refused(world, machine, monkeypatch, capsys):
    store = world["store"]
    with pytest.raises(
        DepthlensError, match=r"^depthlens.think_at_n\(trials=100000\): needs .* use trials=\d+ or less$"
    ) as refused:
        depthlens.think_at_n(store, n=2, trials=100_000, progress=False)
    most = int(re.search(r"use trials=(\d+) or less$", str(refused.value)).group(1))
    line = cli(monkeypatch, capsys, "thinkn", "--from", store, "--n", 2, "--trials", 100_000)
    assert line.startswith("--trials 100000: needs ") and line.endswith(f"use --trials {most} or less")
    footprint.check_trials(VotingConfig(n=2, trials=most), 2, list(METHODS))


def test_seeds_whose_bins_cannot_fit_are_refused(world, monkeypatch, capsys):
    tiny = Machine(2, HERE, 2**20, HERE, None, HERE)
    monkeypatch.setattr(machine_module, "machine", lambda: tiny)
    with pytest.raises(DepthlensError, match=r"^seeds=100000: needs .* use seeds=\d+ or less$"):
        footprint.check_correlation(CorrelationConfig(seeds=100_000), 2, 2)
    footprint.check_correlation(CorrelationConfig(seeds=1000), 2, 2)
    line = cli(
        monkeypatch, capsys, "correlate", world["store"], "--seeds", 100_000, "--out", world["root"] / "c"
    )
    assert line.startswith("--seeds 100000: needs ") and "use --seeds" in line


def test_a_lens_fit_that_cannot_hold_its_states_is_refused(world, machine):
    lm = world["lm"]
    with pytest.raises(DepthlensError, match=r"^max_tokens=10000000: needs .*4 layer states of 32 floats"):
        footprint.check_lens_fit(lm, 10_000_000, 64, 4)
    footprint.check_lens_fit(lm, 8192, 64, 4)


# ---------------------------------------------------------------------------------------------------------------
# Counts no run can mean: each config's own ceiling, at every front.

CLI_CEILINGS = [
    (["thinkn", "--from", "STORE", "--n", 100_001], "--n 100001: must be in 1..100,000 responses per question (no "
     "pool holds more)"),
    (["thinkn", "--from", "STORE", "--n", 2, "--trials", 100_001], "--trials 100001: must be in 1..100,000"),
    (["generate", "--out", "OUT", "--batch-size", 100_001], "--batch-size 100001: must be in 1..100,000"),
    (["generate", "--out", "OUT", "--pool", 100_001], "--pool 100001: must be at most 100,000 per question"),
    (["generate", "--out", "OUT", "--questions", 100_001], "--questions 100001: must be in 1..100,000"),
    (["generate", "--out", "OUT", "--max-new-tokens", 2**24 + 1], "--max-new-tokens 16777217: must be in "
     "1..16,777,216 (longer than any model's context)"),
    (["thinkn", "--online", "--out", "OUT", "--max-n", 100_001], "--max-n 100001: must be at most 100,000 per "
     "question"),
    (["thinkn", "--online", "--out", "OUT", "--batch-size", 100_001], "--batch-size 100001: must be in 1..100,000"),
    (["score", "--in", "RECORDS", "--out", "OUT", "--batch-size", 100_001], "--batch-size 100001: must be in "
     "1..100,000"),
    (["correlate", "STORE", "--out", "OUT", "--seeds", 100_001], "--seeds 100001: must be in 1..100,000"),
    (["correlate", "STORE", "--out", "OUT", "--bootstrap", 100_001], "--bootstrap 100001: must be in 1..100,000"),
    (["correlate", "STORE", "--out", "OUT", "--bins", 100_001], "--bins 100001: must be in 3..100,000 (no pool has "
     "more responses to bin)"),
    (["correlate", "STORE", "--out", "OUT", "--n", 100_001], "--n 100001: must be at most 100,000 (no pool holds "
     "more)"),
    (["serve", "--max-n", 100_001], "--max-n 100001: must be in 1..100,000"),
    (["serve", "--max-tokens", 2**24 + 1], "--max-tokens 16777217: must be in 1..16,777,216"),
    (["serve", "--max-running", 1025], "--max-running 1025: must be in 1..1,024"),
    (["serve", "--max-prompts", 100_001], "--max-prompts 100001: must be in 1..100,000"),
    (["serve", "--max-running", 600], "--max-running 600: must be at most 500: each request runs on a thread, and "
     "the process may start 1,000 (from a test's machine)"),
    (["serve", "--max-body-bytes", 2**27], "--max-body-bytes 134217728: needs 128 MiB at once (one request's body), "
     "and this process may use 64 MiB (from a test's machine); use --max-body-bytes 67108864 or less"),
    (["serve", "--max-queue", 100_000], "--max-queue 100000: needs 97.7 GiB at once (the bodies of --max-running 32 "
     "requests running and those waiting), and this process may use 64 MiB (from a test's machine); use "
     "--max-queue 32 or less"),
    (["generate", "--out", "OUT", "--ray", "--workers", 9], "--workers 9: a local Ray runs its actors of --cpus 1 "
     "each on this machine, which lends the process 2 CPUs (from a test's machine): at most 8 in all (4 × its "
     "CPUs); lower --workers, or join a cluster (--ray-address)"),
    (["tcb", "prompts", "--out", "OUT", "--questions", 100_001], "invalid value for '--questions': Input should be "
     "less than or equal to 100000; see `depthlens tcb prompts --help`"),
]  # fmt: skip


@pytest.mark.parametrize(
    "args, line", CLI_CEILINGS, ids=[" ".join(map(str, a[:1] + a[-2:])) for a, _ in CLI_CEILINGS]
)
def test_the_command_line_names_each_ceiling(args, line, world, machine, tmp_path, monkeypatch, capsys):
    if args[0] == "serve" and importlib.util.find_spec("fastapi") is None:
        pytest.skip("needs the serve extra")
    where = {"STORE": world["store"], "OUT": tmp_path / "out", "RECORDS": world["records"]}
    given = [where.get(a, a) if isinstance(a, str) else a for a in args]
    if args[0] in ("generate", "thinkn", "serve"):
        given += ["--model", world["model"], "--backend", "hf"]
    assert cli(monkeypatch, capsys, *given) == line
    assert not (tmp_path / "out").exists()


PYTHON_CEILINGS = [
    (
        "think_at_n",
        {"n": 100_001},
        "n=100001: must be in 1..100,000 responses per question (no pool holds more)",
    ),
    ("generate", {"batch_size": 100_001}, "batch_size=100001: must be in 1..100,000"),
    ("generate", {"pool": 100_001}, "pool=100001: must be at most 100,000 per question"),
    ("generate", {"questions": 100_001}, "questions=100001: must be in 1..100,000"),
    ("online", {"max_n": 100_001}, "max_n=100001: must be at most 100,000 per question"),
    ("online", {"batch_size": 100_001}, "batch_size=100001: must be in 1..100,000"),
    ("score", {"batch_size": 100_001}, "batch_size=100001: must be in 1..100,000"),
]


@pytest.mark.parametrize(
    "verb, given, message", PYTHON_CEILINGS, ids=[f"{v}-{k}" for v, k, _ in PYTHON_CEILINGS]
)
def test_python_names_each_ceiling(verb, given, message, world, nothing_started):
    records = [{"id": "a", "prompt_ids": [4, 5], "completion_ids": [6, 7]}]
    first = {"think_at_n": (world["store"],), "score": ("some-model", records)}.get(
        verb, ("some-model", TASK)
    )
    settings = {} if verb in ("think_at_n", "score") else {k: v for k, v in SMALL.items() if k not in given}
    with pytest.raises(DepthlensError) as refused:
        getattr(depthlens, verb)(*first, **settings, **given, progress=False)
    assert str(refused.value).startswith(f"depthlens.{verb}({message.replace(':', '):', 1)}")


def _job(body: dict, settings=None, context: int | None = 4096):
    from depthlens.config import ServeConfig
    from depthlens.serve.job import build_job
    from depthlens.serve.schema import CompletionRequest

    request = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3], **body})
    return build_job(request, None, context, settings or ServeConfig("m", max_n=100_000))


@pytest.mark.skipif(importlib.util.find_spec("pydantic") is None, reason="needs the serve extra")
@pytest.mark.parametrize(
    "body, field, message",
    [
        ({"n": 100_001}, "n", "n = 100001 must lie in [1, 100000] (the server's limit)"),
        ({"depthlens": {"think": {"n": 100_001}}}, "depthlens.think.n", "think.n = 100001 is over the server's"),
        ({"depthlens": {"online": {"batch_size": 100_001}}}, "depthlens", "depthlens.online.batch_size 100001: must "
         "be in 1..100,000"),
        ({"depthlens": {"online": {"max_n": 100_001}}}, "depthlens", "depthlens.online.max_n 100001: must be at "
         "most 100,000 per question"),
        ({"depthlens": {"layer_top_k": 101, "tokens": True}}, "depthlens.layer_top_k", "depthlens.layer_top_k 101:"),
    ],
)  # fmt: skip
def test_the_server_names_each_ceiling(body, field, message):
    from depthlens.serve.errors import ApiError

    with pytest.raises(ApiError) as refused:
        _job(body)
    assert refused.value.status == 400 and refused.value.param == field
    assert refused.value.message.startswith(message)


@pytest.mark.skipif(importlib.util.find_spec("pydantic") is None, reason="needs the serve extra")
def test_the_server_refuses_samples_its_memory_cannot_hold(world, machine):
    """The transformers engine runs a request's samples of a prompt together: more tokens than the memory holds
    (``ServeConfig.max_sample_tokens``, set at launch from the model) is a 400 naming what to lower."""
    from depthlens.config import ServeConfig
    from depthlens.serve.errors import ApiError

    settings = runs.sample_limit(ServeConfig("m"), world["lm"])
    held = settings.max_sample_tokens
    assert held == MACHINE.memory // footprint.sample_token_bytes(world["lm"])
    per = held // 103 + 1  # samples of 3 + 100 tokens that pass it
    for body, field in (
        ({"n": per, "max_tokens": 100}, "n"),
        ({"depthlens": {"think": {"n": per}}, "max_tokens": 100}, "depthlens.think.n"),
        ({"max_tokens": held}, "max_tokens"),
    ):
        limits = ServeConfig("m", max_n=100_000, max_tokens=2**24, max_sample_tokens=held)
        with pytest.raises(ApiError) as refused:
            _job(body, limits, context=None)
        assert refused.value.status == 400 and refused.value.param == field, refused.value.message
        assert f"this server's memory holds {held:,}" in refused.value.message
    assert _job({"n": per - 1, "max_tokens": 100}, limits).n == per - 1
