"""Scoring on Ray: one local Ray (2 CPUs, 127.0.0.1) shared by the module; tiny random models.

1 and 2 workers give the numbers of a single-process ``score``; a worker actor killed mid-run is restarted and
loses or repeats no record; a driver killed with -9 and resumed ends equal to an uninterrupted run; bad setups
(no extra, an unreachable cluster, a model a worker cannot load) stop within seconds with one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from depthlens.config import GenerateRun, ModelSpec, RayConfig, ScoreRun, StoreSpec
from depthlens.errors import ClusterError
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.parquet import iter_store
from depthlens.studies.score import ScoreEvents, run_score
from tests.conftest import tiny_model
from tests.test_faults import chat_dir  # noqa: F401  (a fixture: the tiny llama with a chat tokenizer)
from tests.test_parquet_store import ROWS, _write, assert_same_results
from tests.tolerance import assert_float32_equal, assert_same_records, shifted, wrong_layer

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray
SRC = Path(__file__).parent.parent / "src"


@pytest.fixture(scope="module")
def local_ray():
    from depthlens.scale.ray import connect

    started = not ray.is_initialized()
    gcs = connect(None, num_cpus=2)
    yield gcs
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny llama saved where actors load it, the input, and a single-process reference (1 torch thread)."""
    import torch

    from depthlens.models.load import wrap

    d = tmp_path_factory.mktemp("ray")
    tiny_model("llama").save_pretrained(d / "tiny")
    src = _write(d / "in.jsonl", ROWS * 1 + [{**r, "id": r["id"] + "b"} for r in ROWS])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_score(wrap(tiny_model("llama")), ScoreRun(src, StoreSpec(d / "ref.jsonl"), tokens=True))
    finally:
        torch.set_num_threads(threads)
    return d, src, {r["id"]: r for r in iter_jsonl(d / "ref.jsonl")}


def _score_ray(d, src, out, workers, resume=False, events=ScoreEvents(), skip_bad=False):
    from depthlens.scale.score import score_on_ray

    run = ScoreRun(src, StoreSpec(out, resume), tokens=True, skip_bad=skip_bad)
    return score_on_ray(ModelSpec(str(d / "tiny"), device="cpu"), run, RayConfig(workers, block=3), events)


def test_local_ray_binds_loopback_only(local_ray):
    assert local_ray.startswith("127.0.0.1:")
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_give_the_single_process_numbers(local_ray, setup, tmp_path, workers):
    d, src, reference = setup
    n_layers = _score_ray(d, src, tmp_path / "store", workers=workers).n_layers
    assert n_layers == 3
    rows = list(iter_store(tmp_path / "store"))
    assert sorted(r["id"] for r in rows) == sorted(reference)  # each record once
    assert_same_results(reference, {r["id"]: r for r in rows})
    assert len(list((tmp_path / "store").glob("part-*.parquet"))) >= 2
    report = _score_ray(d, src, tmp_path / "store", workers=workers, resume=True)  # all done: no work
    assert report.skipped == [] and len(list(iter_store(tmp_path / "store"))) == len(reference)


def test_a_resumed_run_rescores_changed_inputs_and_says_which(local_ray, setup, tmp_path):
    """As a single-process ``score --resume``: records whose input changed since are scored again, and reported."""
    d, src, reference = setup
    mine = tmp_path / "in.jsonl"  # the module's input stays as it is
    mine.write_text(src.read_text())
    _score_ray(d, mine, tmp_path / "store", workers=1)
    rows = [json.loads(line) for line in mine.read_text().splitlines()]
    rows[0]["completion_ids"] = [*rows[0]["completion_ids"], 9]
    mine.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rescored: list[str] = []
    _score_ray(
        d, mine, tmp_path / "store", workers=1, resume=True, events=ScoreEvents(on_rescore=rescored.extend)
    )
    assert rescored == [rows[0]["id"]]
    stored = {r["id"]: r for r in iter_store(tmp_path / "store")}
    assert sorted(stored) == sorted(reference)
    assert stored[rows[0]["id"]]["token_count"] > reference[rows[0]["id"]]["token_count"]


@pytest.mark.parametrize("source", ["parquet", "skip-bad"])
def test_each_input_route_gives_the_single_process_numbers(local_ray, setup, tmp_path, source):
    """A Parquet input (read by Ray Data's Parquet reader) and an input with bad lines skipped (sent from the
    driver, which knows the lines) score like the JSONL input read by Ray Data (the test above)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d, src, reference = setup
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    if source == "parquet":
        src = tmp_path / "in.parquet"
        pq.write_table(pa.Table.from_pylist(rows), src)
        expected = reference
    else:
        src = tmp_path / "in.jsonl"
        no_id = {k: v for k, v in rows[0].items() if k != "id"}  # refused, so skipped with --skip-bad
        src.write_text("".join(json.dumps(r) + "\n" for r in [*rows, no_id]))
        expected = reference
    _score_ray(d, src, tmp_path / "store", workers=2, skip_bad=source == "skip-bad")
    rows = list(iter_store(tmp_path / "store"))
    assert sorted(r["id"] for r in rows) == sorted(expected)
    assert_same_results(expected, {r["id"]: r for r in rows})


def test_a_killed_worker_actor_is_restarted_and_loses_nothing(local_ray, setup, tmp_path, monkeypatch):
    d, src, reference = setup
    marker, starts = tmp_path / "killed", tmp_path / "starts"
    monkeypatch.setenv("DEPTHLENS_FAULT_RAY_KILL_ONCE", str(marker))
    monkeypatch.setenv("DEPTHLENS_FAULT_RAY_STARTS", str(starts))
    start = time.monotonic()
    _score_ray(d, src, tmp_path / "store", workers=2)
    assert marker.exists()  # ray.kill did hit an actor mid-block
    assert len(starts.read_text().split()) == 3  # two actors, the killed one restarted once
    # It ends (a hang would not); counting starts, not seconds, holds on a machine loaded 10× as well.
    assert time.monotonic() - start < 900
    rows = list(iter_store(tmp_path / "store"))
    assert sorted(r["id"] for r in rows) == sorted(reference)
    assert_same_results(reference, {r["id"]: r for r in rows})


def test_a_worker_that_cannot_load_the_model_stops_the_run(local_ray, setup, tmp_path, monkeypatch):
    _, src, _ = setup
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": 32}')
    starts = tmp_path / "starts"
    monkeypatch.setenv("DEPTHLENS_FAULT_RAY_STARTS", str(starts))
    start = time.monotonic()
    from depthlens.scale.score import score_on_ray

    failed = r"a Ray worker failed: .*could not load model .*broken.*rerun with resume"
    with pytest.raises(ClusterError, match=failed):
        score_on_ray(
            ModelSpec(str(broken), device="cpu"), ScoreRun(src, StoreSpec(tmp_path / "store")), RayConfig()
        )
    assert len(starts.read_text().split()) == 1  # one failed start, no retry loop
    assert time.monotonic() - start < 600  # and it ends


def test_unreachable_address_fails_within_seconds(local_ray):
    from depthlens.scale.ray import connect

    start = time.monotonic()
    with pytest.raises(ClusterError, match=r"ray_address 127\.0\.0\.1:9: no Ray cluster answers there"):
        connect("127.0.0.1:9", timeout_s=3)
    assert time.monotonic() - start < 5


def test_ray_without_the_extra_names_it(monkeypatch):
    from depthlens.scale.ray import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ClusterError, match=r"^ray needs the Ray extra: pip install 'depthlens\[ray\]'$"):
        import_ray()


def test_driver_killed_then_resumed_equals_an_uninterrupted_run(local_ray, setup, tmp_path):
    """The CLI on its own local Ray, SIGKILLed mid-run (half a shard written), then resumed on this one."""
    d, src, reference = setup
    out = tmp_path / "store"
    args = [
        "score",
        "--model",
        str(d / "tiny"),
        "--in",
        str(src),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--tokens",
        "--ray",
        "--workers",
        "1",
        "--block-rows",
        "3",
        "-q",
    ]
    env = {**os.environ, "DEPTHLENS_FAULT_KILL_AFTER": "1", "PYTHONPATH": str(SRC)}
    env.pop("RAY_ADDRESS", None)
    code = "from depthlens.cli.app import main; import sys; sys.argv = ['depthlens', *sys.argv[1:]]; main()"
    # A session of its own, so that the Ray processes the killed driver leaves behind go with it.
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -9, err.decode()[-2000:]
    committed = json.loads((out / "_manifest.json").read_text())["shards"]
    assert len(committed) == 1 and list(out.glob("*.tmp"))  # one shard committed, one torn in flight
    _score_ray(d, src, out, workers=1, resume=True)
    assert not list(out.glob("*.tmp"))
    rows = list(iter_store(out))
    assert sorted(r["id"] for r in rows) == sorted(reference)
    assert_same_results(reference, {r["id"]: r for r in rows})


# ---- generation on Ray: questions spread over actors, each block a shard; read as one store ----------------


def _generate_ray(chat, out, workers):
    from depthlens.config import SamplingConfig
    from depthlens.scale.generate import generate_on_ray

    run = GenerateRun(
        StoreSpec(out), pool=3, batch_size=2, sampling=SamplingConfig(max_new_tokens=6, readout_tokens=None)
    )
    return generate_on_ray(ModelSpec(str(chat), device="cpu"), run, QUESTIONS, RayConfig(workers))


QUESTIONS = []


@pytest.fixture(scope="module")
def questions():
    from depthlens.evals.tasks import Question

    QUESTIONS[:] = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(4)]
    return QUESTIONS


def test_generate_on_one_or_two_workers_gives_the_same_store(local_ray, chat_dir, questions, tmp_path):  # noqa: F811
    import torch

    from depthlens.config import SamplingConfig, VotingConfig
    from depthlens.models.load import load
    from depthlens.stores.samples import iter_samples
    from depthlens.studies.generate import generate
    from depthlens.studies.thinkn import load_pools, summarise

    one = _generate_ray(chat_dir, tmp_path / "one", 1)
    two = _generate_ray(chat_dir, tmp_path / "two", 2)
    assert one.written == two.written == 12 and one.failed == 0
    by_id = [{r["id"]: r for r in iter_samples(tmp_path / name)} for name in ("one", "two")]
    # a response's seed and batch are its own, wherever it ran: the same tokens and texts exactly, the floats of
    # two actor processes within float32 rounding (tests/tolerance.py)
    assert_same_records([by_id[0][k] for k in sorted(by_id[0])], [by_id[1][k] for k in sorted(by_id[1])])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generate(
            load(str(chat_dir), device="cpu"),
            GenerateRun(
                StoreSpec(tmp_path / "here"),
                pool=3,
                batch_size=2,
                sampling=SamplingConfig(max_new_tokens=6, readout_tokens=None),
            ),
            questions,
        )
    finally:
        torch.set_num_threads(threads)
    here = {r["id"]: r for r in iter_samples(tmp_path / "here")}
    assert here.keys() == by_id[0].keys()
    for rid, r in here.items():
        assert r["token_ids"] == by_id[0][rid]["token_ids"] and r["text"] == by_id[0][rid]["text"]
    voting = VotingConfig(n=2, trials=5, rank_prefix=3)
    one_s, two_s, here_s = (summarise(tmp_path / name, voting) for name in ("one", "two", "here"))
    assert one_s.summaries == two_s.summaries  # the sharded stores vote alike, whatever the spread
    assert one_s.info.responses == here_s.info.responses == 12
    answers = {s.method: s.accuracy_mean for s in here_s.summaries if s.method in ("cons@n", "mean@n")}
    assert answers == {s.method: s.accuracy_mean for s in two_s.summaries if s.method in answers}
    assert load_pools(tmp_path / "two", one_s.dtr)[1].questions == 4
    from depthlens.studies.report import find_stores
    from depthlens.studies.stored import load_store

    assert len(load_store(tmp_path / "two").responses) == len(load_store(tmp_path / "here").responses) == 12
    assert find_stores(tmp_path) == [tmp_path / "here", tmp_path / "one", tmp_path / "two"]


# ---- the real default model: scoring on two workers, and generation with the vLLM backend on an actor -----------


@pytest.mark.integration
def test_real_model_scores_on_two_workers_like_one_process(local_ray, real_model, tmp_path):
    import torch

    from depthlens.models import catalogue
    from depthlens.scale.score import score_on_ray

    texts = ["The capital of France is", "2 + 2 =", "Water boils at", "The first prime number is"]
    src = _write(
        tmp_path / "in.jsonl",
        [{"id": f"t{i}", "prompt": t, "completion": " a short answer here."} for i, t in enumerate(texts)],
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_score(real_model, ScoreRun(src, StoreSpec(tmp_path / "ref.jsonl"), tokens=True))
    finally:
        torch.set_num_threads(threads)
    run = ScoreRun(src, StoreSpec(tmp_path / "store"), tokens=True)
    score_on_ray(ModelSpec(catalogue.DEFAULT_MODEL, device="cpu"), run, RayConfig(2, block=2))
    reference = sorted(iter_jsonl(tmp_path / "ref.jsonl"), key=lambda r: r["id"])
    # two workers score other batches than the one process: the real model's floats agree as two float32 runs
    # of one computation (tests/tolerance.py), not to the store's rounding; all else exactly
    assert_same_records(sorted(iter_store(tmp_path / "store"), key=lambda r: r["id"]), reference)


@pytest.mark.integration
def test_generate_on_ray_with_the_vllm_backend_equals_it_in_process(local_ray, real_model, tmp_path):
    from depthlens.config import EngineConfig, SamplingConfig
    from depthlens.evals.loading import load_task
    from depthlens.models import catalogue
    from depthlens.sampling.choose import vllm_available
    from depthlens.scale.generate import generate_on_ray
    from depthlens.stores.samples import iter_samples
    from depthlens.studies.generate import generate

    if not vllm_available():
        pytest.skip("needs the vllm extra: pip install 'depthlens[vllm]'")
    engine = EngineConfig(
        backend="vllm", dtype="float32", enforce_eager=True, max_model_len=512, kv_cache_gib=0.5
    )
    sampling = SamplingConfig(max_new_tokens=8, readout_tokens=4)
    qs = load_task("reasoning_gym:basic_arithmetic", 2, seed=0)
    run = GenerateRun(StoreSpec(tmp_path / "ray"), pool=2, batch_size=2, sampling=sampling, engine=engine)
    generate_on_ray(ModelSpec(catalogue.DEFAULT_MODEL, device="cpu"), run, qs, RayConfig())
    generate(
        real_model,
        GenerateRun(StoreSpec(tmp_path / "here"), pool=2, batch_size=2, sampling=sampling, engine=engine),
        qs,
    )
    on_ray = {r["id"]: r for r in iter_samples(tmp_path / "ray")}
    here = {r["id"]: r for r in iter_samples(tmp_path / "here")}
    assert on_ray.keys() == here.keys() and len(here) == 4
    for rid, r in here.items():
        assert on_ray[rid]["status"] == r["status"] == "ok", (on_ray[rid].get("error"), r.get("error"))
        assert on_ray[rid]["token_ids"] == r["token_ids"] and on_ray[rid]["answer"] == r["answer"]
        # Stored to 5 decimals by two processes with other thread counts: equal within float32 reordering
        # plus one unit of the 5th decimal. Rows one token off, or read at the next layer, must not pass.
        ray_div, ray_logp = on_ray[rid]["divergence"], on_ray[rid]["log_prob"]
        assert_float32_equal(
            ray_div,
            r["divergence"],
            rounded=True,
            what=f"{rid} divergence",
            mutants=[("a wrong layer", wrong_layer(ray_div)), ("a dropped token", shifted(ray_div))],
        )
        assert_float32_equal(
            ray_logp,
            r["log_prob"],
            rounded=True,
            what=f"{rid} log p",
            mutants=[("a dropped token", shifted(ray_logp))],
        )
