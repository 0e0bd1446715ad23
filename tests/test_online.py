"""Online Think@n (SPEC §8): hand-computed decisions, live == replay, kill + resume, bad input."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from depthlens.config import DTRConfig, OnlineConfig, OnlineRun, SamplingConfig, StoreSpec
from depthlens.errors import ConfigError, InputError
from depthlens.evals.loading import load_task
from depthlens.evals.tasks import Question
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.samples import SAMPLES
from depthlens.studies.online import DECISIONS, OnlineEvents, ordered_pools, run_online
from depthlens.voting.methods import Response
from depthlens.voting.online import replay, replay_trials, stop_point, threshold
from tests.test_cli import run


def _r(key, correct, length, deep, conf=1.0):
    conf = np.full(length, conf) if np.isscalar(conf) else np.asarray(conf, dtype=np.float64)
    return Response(key, correct, length, np.asarray(deep, dtype=bool), np.zeros(length), conf)


# prefix DTR over ℓ = 4 (the pool in sampling order)
POOL = [
    _r("a", True, 10, [1, 1, 0, 0]),  # 0.5   warm-up
    _r("b", False, 12, [1, 0, 0, 0]),  # 0.25 warm-up
    _r("a", True, 14, [1, 1, 1, 0]),  # 0.75  warm-up
    _r(None, False, 16, [0, 0, 0, 0]),  # 0   warm-up, no answer
    _r("a", True, 20, [1, 0, 0, 0]),  # 0.25 < τ: stopped at 4 tokens, its "a" never counts
    _r("b", False, 10, [1, 1, 0, 0]),  # 0.5 ≥ τ: votes
    _r("a", True, 8, [1, 1, 1, 1]),  # 1.0
    _r("b", False, 3, [1, 0, 0]),  # ended at 3 tokens with DTR 1/3 < τ: no vote, costs 3
    _r("a", True, 12, [1, 1, 0, 0]),
    _r("a", True, 6, [1, 1, 1, 0]),
    _r("b", False, 50, [1, 1, 1, 1]),  # never started: consensus comes first
    _r("b", False, 50, [1, 1, 1, 1]),
]
POLICY = OnlineConfig(
    signal="dtr", warmup=4, max_n=12, consensus=0.7, keep=0.5, decision_prefix=4, batch_size=2
)


def test_hand_computed_online_run():
    out = replay(POOL, POLICY)
    assert threshold([0.5, 0.25, 0.75, 0.0], 0.5) == out.threshold == pytest.approx(0.375)
    by = {d.index: d for d in out.decisions}
    assert [by[i].reason for i in range(4)] == ["warm-up"] * 4 and by[0].threshold is None
    # after the warm-up: a 2, b 1 of 3 answered → 67 % < 70 %
    assert (by[3].leader, by[3].answered) == ("a", 3) and by[3].share == pytest.approx(2 / 3)
    assert (by[4].stopped_at, by[4].tokens, by[4].votes, by[4].key) == (4, 4, False, None)
    assert by[5].votes and by[5].reason == "cleared τ"
    # a 2 : b 2 — the tie goes to the higher summed prefix DTR (a 1.25 vs b 0.75)
    assert (by[5].leader, by[5].share) == ("a", 0.5)
    assert (by[7].stopped_at, by[7].tokens, by[7].reason) == (3, 3, "below τ")
    assert by[7].share == pytest.approx(3 / 5)
    # a 5 of 7 = 71 % ≥ 70 %: sampling stops after 10 of 12 started
    assert (out.stop, out.started, out.answer, out.correct) == ("consensus", 10, "a", True)
    assert by[9].share == pytest.approx(5 / 7) and 10 not in by
    assert out.tokens == 10 + 12 + 14 + 16 + 4 + 10 + 8 + 3 + 12 + 6
    # β = 1 never reached: every response is started, and the cap is the reason
    capped = replay(POOL, dataclasses.replace(POLICY, consensus=1.0))
    assert (capped.stop, capped.started, capped.answer) == ("max-n", 12, "a")
    # batches of 4 check later: 60 % after responses 4–7, then 8–11 all start and b catches up (5 : 4)
    wide = replay(POOL, dataclasses.replace(POLICY, batch_size=4))
    assert (wide.stop, wide.started, wide.decisions[-1].share) == ("max-n", 12, pytest.approx(5 / 9))


def test_confidence_signal_stops_at_the_first_low_group():
    cfg = OnlineConfig(signal="confidence", warmup=1, max_n=2, window=2)
    r = _r("a", True, 6, [], conf=[5.0, 5.0, 1.0, 1.0, 5.0, 5.0])
    # groups end at tokens 2..6: 5, 3, 1, 3, 5 → first below 2.5 ends at token 4 (theirs forces EOS there)
    assert stop_point(r, 2.5, cfg) == 4 and stop_point(r, 0.5, cfg) is None
    assert stop_point(_r("a", True, 1, [], conf=[0.1]), 2.5, cfg) is None  # shorter than a window: never
    # τ = the lowest group of the warm-up = 3; it gave no answer, so no consensus yet
    out = replay([_r(None, False, 6, [], conf=[3.0] * 6), r], cfg)
    assert out.decisions[1].stopped_at == 4 and out.tokens == 6 + 4
    assert (out.answer, out.correct, out.stop) == (None, False, "max-n")  # no vote at all: wrong


def test_replay_orders_and_errors():
    s = replay_trials({"q": POOL}, POLICY, trials=3, seed=0)
    assert s.trials == 3 and s.questions == 1 and s.accuracy_std >= 0
    assert replay_trials({"q": POOL}, POLICY, 1).cost_mean == replay(POOL, POLICY).tokens  # order 0 = stored
    with pytest.raises(InputError, match="max_n 12 needs response 9 of a question, but its pool has 8"):
        replay(POOL[:8], POLICY)
    assert replay(POOL[:10], POLICY) == replay(POOL, POLICY)  # consensus comes before the pool runs out


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"warmup": 8, "max_n": 8}, "--warmup 8: must be below --max-n 8"),
        ({"consensus": 0.5}, "--consensus 0.5: must lie in (0.5, 1]"),
        ({"consensus": 1.01}, "--consensus 1.01: must lie in (0.5, 1]"),
    ],
)
def test_bad_policies_name_the_flag(kw, message):
    from depthlens.cli.flags import flag_line

    with pytest.raises(ConfigError) as raised:
        OnlineConfig(**kw)
    assert flag_line(raised.value).startswith(message)  # the command line's phrasing of the setting


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--warmup", "8", "--max-n", "8"], "--warmup 8: must be below --max-n 8"),
        (["--consensus", "0.4"], "--consensus 0.4: must lie in (0.5, 1]"),
        (["--prefix", "64", "--max-new-tokens", "32"], "--prefix 64: must be at most --max-new-tokens 32"),
    ],
)
def test_online_cli_rejects_bad_input_before_generating(monkeypatch, capsys, tmp_path, args, message):
    code, _, err = run(monkeypatch, capsys, "thinkn", "--online", "--out", tmp_path / "o", *args)
    assert code == 2 and message in err and not (tmp_path / "o").exists()


SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=8, readout_tokens=None)
LIVE = OnlineConfig(
    signal="confidence", warmup=2, max_n=6, consensus=1.0, keep=0.5, decision_prefix=6, window=1, batch_size=2
)
TINY_DTR = DTRConfig(g=0.02, rho=0.5)  # the tiny model diverges by ~0.01–0.03 bits: DTRs differ here


def _decisions(out):
    return sorted(iter_jsonl(out / DECISIONS), key=lambda r: r["id"])


def _live_equals_replay(out, cfg, dtr=TINY_DTR):
    pools, holes = ordered_pools(out, dtr)
    assert not holes
    for line in _decisions(out):
        again = replay(
            pools[line["id"]] + [pools[line["id"]][0]] * cfg.max_n, cfg
        )  # padding is never reached
        assert [{k: v for k, v in d.items() if k != "seed"} for d in line["decisions"]] == [
            d.to_dict() for d in again.decisions
        ]
        assert (line["tokens"], line["stop"], line["answer"]) == (again.tokens, again.stop, again.answer)


@pytest.mark.parametrize("signal", ["dtr", "confidence"])
def test_live_run_equals_the_replay_of_its_own_store(tiny_chat, tmp_path, signal):
    cfg = dataclasses.replace(LIVE, signal=signal)
    qs = [Question("q0", "1 + 2 =", "3")]
    # seed 7: a draw where, for both signals, some responses are stopped and some go on (the sampler's draws
    # are a function of the seed: a test of both branches needs one that takes both)
    report = run_online(
        tiny_chat,
        OnlineRun(StoreSpec(tmp_path / "s"), online=cfg, seed=7, sampling=SAMPLING, dtr=TINY_DTR),
        qs,
    )
    records = list(iter_jsonl(tmp_path / "s" / SAMPLES))
    line = _decisions(tmp_path / "s")[0]
    assert report.tokens == line["tokens"] == sum(r["token_count"] for r in records)  # every token counted
    assert [r["sample"] for r in records] == list(range(line["started"]))
    stopped = [r for r in records if r["stopped_at"] is not None]
    assert all(r["finish"] == "stopped" and r["token_count"] == r["stopped_at"] for r in stopped)
    assert stopped and len(stopped) < line["started"] - cfg.warmup  # some stopped, some went on
    _live_equals_replay(tmp_path / "s", cfg)


def test_killed_online_run_resumes_to_the_same_store(tiny_chat, tmp_path):
    qs = [Question("q0", "1 + 2 =", "3"), Question("q1", "4 - 1 =", "3")]
    whole = tmp_path / "whole"
    run = OnlineRun(
        StoreSpec(whole), dataclasses.replace(LIVE, max_n=4), seed=2, sampling=SAMPLING, dtr=TINY_DTR
    )
    run_online(tiny_chat, run, qs)
    cut = tmp_path / "cut"
    batches = []

    def die_in_the_second_question(n):
        batches.append(n)
        if len(batches) == 3:  # q0: warm-up and one batch; q1: its warm-up written, then killed
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        events = OnlineEvents(on_batch=die_in_the_second_question)
        run_online(tiny_chat, dataclasses.replace(run, store=StoreSpec(cut)), qs, events=events)
    with (cut / SAMPLES).open("a") as f:
        f.write('{"id": "q1#2", "question_id"')  # a line torn by the kill
    report = run_online(tiny_chat, dataclasses.replace(run, store=StoreSpec(cut, resume=True)), qs)
    assert report.skipped == 1 and report.questions == 2
    drop = ("text",)
    key = lambda r: (r["question_id"], r["sample"])  # noqa: E731
    assert [
        {k: v for k, v in r.items() if k not in drop} for r in sorted(iter_jsonl(cut / SAMPLES), key=key)
    ] == [{k: v for k, v in r.items() if k not in drop} for r in sorted(iter_jsonl(whole / SAMPLES), key=key)]
    assert _decisions(cut) == _decisions(whole)


@pytest.mark.integration
def test_real_model_live_equals_replay_and_cli_replays_it(real_model, monkeypatch, capsys, tmp_path):
    qs = load_task("reasoning_gym:basic_arithmetic", 1, seed=0)
    cfg = OnlineConfig(signal="dtr", warmup=2, max_n=3, consensus=1.0, decision_prefix=4, batch_size=1)
    sampling = dataclasses.replace(SAMPLING, temperature=0.6, top_p=0.95, max_new_tokens=12, readout_tokens=4)
    run_online(real_model, OnlineRun(StoreSpec(tmp_path / "s"), online=cfg, seed=0, sampling=sampling), qs)
    _live_equals_replay(tmp_path / "s", cfg, DTRConfig())
    line = _decisions(tmp_path / "s")[0]
    code, out, err = run(
        monkeypatch,
        capsys,
        "thinkn",
        "--online",
        "--from",
        tmp_path / "s",
        "--warmup",
        "2",
        "--max-n",
        "3",
        "--consensus",
        "1",
        "--prefix",
        "4",
        "--batch-size",
        "1",
        "--trials",
        "1",
    )
    assert code in (0, None), err
    assert "online replay" in out
    replayed = json.loads((tmp_path / "s" / "online_replay.json").read_text())["summary"]
    assert replayed["cost_mean"] == line["tokens"] and replayed["accuracy_mean"] == float(line["correct"])


def test_online_store_reads_answers_by_the_given_rules(tiny_chat, tmp_path):
    # --prompt-style / --answer-fallback reach the online store as they reach `generate`: manifest and records
    from depthlens.config import AnswerConfig
    from depthlens.stores.files import manifest_path

    rules = AnswerConfig(fallback="last-number")
    qs = [Question("q0", "1 + 2 =", "3")]
    run_online(
        tiny_chat,
        OnlineRun(
            StoreSpec(tmp_path / "s"), online=LIVE, seed=1, sampling=SAMPLING, dtr=TINY_DTR, answers=rules
        ),
        qs,
    )
    manifest = json.loads(manifest_path(tmp_path / "s" / SAMPLES).read_text())
    assert manifest["answers"]["fallback"] == "last-number"
