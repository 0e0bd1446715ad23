"""Tasks, grading, the resumable sample store, the Think@n summary and its CLI."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest

from depthlens.cli.flags import flag_line
from depthlens.config import DTRConfig, GenerateRun, SamplingConfig, StoreSpec, VotingConfig
from depthlens.errors import ConfigError, InputError, StoreError
from depthlens.evals.grading import grade
from depthlens.evals.loading import load_task
from depthlens.evals.tasks import Question
from depthlens.stores.commits import COMMITTED, Running
from depthlens.stores.parquet import MANIFEST
from depthlens.stores.samples import SAMPLES, SHARDS, iter_samples, samples_manifest
from depthlens.studies.generate import GenerationEvents, generate, sample_seed
from depthlens.studies.thinkn import load_pools, summarise
from tests.test_cli import run

DATA = Path(__file__).parent / "data"


def test_reasoning_gym_task_is_seeded_and_scored():
    a = load_task("reasoning_gym:basic_arithmetic", 3, seed=4)
    assert [q.question for q in a] == [
        q.question for q in load_task("reasoning_gym:basic_arithmetic", 3, seed=4)
    ]
    q = a[0]
    assert q.user_message.endswith(r"put your final answer within \boxed{}.")
    assert grade(q, rf"... so \boxed{{{q.answer}}}").status == "correct"
    assert grade(
        q, rf"\boxed{{{q.answer}.0}}"
    ).correct  # partial credit from the scorer, Math-Verify says equal
    assert grade(q, "I do not know").status == "no_answer"


def test_unknown_tasks_name_the_known_ones():
    with pytest.raises(InputError, match=r"reasoning_gym:<dataset>.*aime2025"):
        load_task("aime1999")
    with pytest.raises(InputError, match=r"did you mean reasoning_gym:basic_arithmetic"):
        load_task("reasoning_gym:basic_arith", 2)


def test_hub_tasks_read_local_rows_of_the_same_schema():
    aime = load_task("aime2025", data=DATA / "aime2025_sample.jsonl")
    assert [q.answer for q in aime] == ["42", "21", "99"]
    gpqa = load_task("gpqa_diamond", data=DATA / "gpqa_diamond_sample.jsonl", seed=1)
    q = gpqa[0]
    assert len(q.choices) == 4 and q.choices["ABCD".index(q.answer)] == "neutron"
    assert "(A) " in q.user_message and "The final answer is" in q.user_message
    assert grade(q, rf"The final answer is \boxed{{({q.answer})}}.").correct
    wrong = "ABCD"[("ABCD".index(q.answer) + 1) % 4]
    assert grade(q, f"The answer is ({wrong})").status == "wrong"
    with pytest.raises(InputError, match=r"row 0: missing column\(s\) \['Question'"):
        load_task("gpqa_diamond", data=DATA / "aime2025_sample.jsonl")
    with pytest.raises(InputError, match=r"data FILE\.jsonl"):  # offline (or without `datasets`)
        load_task("hmmt_feb2025")


def test_local_jsonl_task(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"question": "2+2?", "answer": "4"}\n{"question": "pick", "answer": "b", "choices": ["a", "b"]}\n'
    )
    qs = load_task(str(path))
    assert qs[0].answer == "4" and qs[1].answer == "B" and qs[1].choices == ("a", "b")
    path.write_text('{"question": "no answer"}\n')
    with pytest.raises(InputError, match="missing 'answer'"):
        load_task(str(path))


def test_unparsable_answer_is_wrong_and_marked():
    q = Question("q", "?", "5")
    assert grade(q, r"\boxed{\frac{1}{}}").status == "unparsed"
    # no number at all: not a number task's answer
    assert grade(q, r"\boxed{\frac{}{}}").status == "no_answer"


QUESTIONS = [Question("q0", "1 2", "3"), Question("q1", "4 5", "9"), Question("q2", "7 7", "14")]
SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=10, readout_tokens=None)


def _store(lm, out, resume=False, store=None, events=GenerationEvents(), **fields):
    """``generate`` of QUESTIONS into ``out``, four responses two at a time unless GenerateRun ``fields`` say
    otherwise."""
    fields = {"pool": 4, "seed": 3, "sampling": SAMPLING, "batch_size": 2, **fields}
    return generate(lm, GenerateRun(StoreSpec(out, resume, format=store), **fields), QUESTIONS, events=events)


def _records(out):
    return sorted(iter_samples(out), key=lambda r: r["id"])


def test_store_records_every_response(tiny_chat, tmp_path):
    report = _store(tiny_chat, tmp_path / "s")
    records = _records(tmp_path / "s")
    assert report.written == len(records) == 12 and report.failed == 0
    r = records[0]
    assert r["seed"] == sample_seed(3, "q0", 0) and r["token_count"] == len(r["token_ids"]) == len(
        r["log_prob"]
    )
    assert len(r["divergence"]) == r["token_count"] and len(r["divergence"][0]) == tiny_chat.n_layers
    assert r["grade"] in {"correct", "wrong", "no_answer", "unparsed"}
    assert sum(report.grades.values()) == 12
    questions = [json.loads(line) for line in (tmp_path / "s" / "questions.jsonl").read_text().splitlines()]
    assert [q["id"] for q in questions] == ["q0", "q1", "q2"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_killed_run_resumes_to_the_same_store_and_summary(tiny_chat, tmp_path, fmt):
    whole = tmp_path / "whole"
    _store(tiny_chat, whole, store=fmt)
    cut = tmp_path / "cut"
    batches = []

    def die_after_three(n):
        batches.append(n)
        if len(batches) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _store(tiny_chat, cut, events=GenerationEvents(on_batch=die_after_three), store=fmt)
    if fmt == "jsonl":
        with (cut / SAMPLES).open("a") as f:
            f.write('{"id": "q1#3", "question_id"')  # a line torn by the kill
    else:
        assert len(json.loads((cut / SHARDS / MANIFEST).read_text())["shards"]) == 3  # a shard per batch
        (cut / SHARDS / "part-000003.parquet.tmp").write_bytes(b"PAR1")  # a shard torn by the kill
    assert len(_records(whole)) == 12
    report = _store(tiny_chat, cut, resume=True)  # the store's own format, whatever the default
    assert report.skipped == 6 and report.written == 6
    drop = ("text",)  # everything else must match exactly
    assert [{k: v for k, v in r.items() if k not in drop} for r in _records(cut)] == [
        {k: v for k, v in r.items() if k not in drop} for r in _records(whole)
    ]
    voting = VotingConfig(n=3, trials=4, rank_prefix=4)
    assert summarise(cut, voting).summaries == summarise(whole, voting).summaries
    with pytest.raises(StoreError, match="seed: stored 3, this run 4"):
        _store(tiny_chat, cut, resume=True, seed=4)


def test_failed_generation_is_recorded_not_dropped(tiny_chat, tmp_path):
    too_long = Question(
        "long", "1 " * 200, "1"
    )  # its prompt alone exceeds the context: refused before sampling
    with pytest.raises(InputError, match=r"question 'long': its prompt is .* no response fits"):
        generate(
            tiny_chat,
            GenerateRun(StoreSpec(tmp_path / "s"), pool=2, sampling=SAMPLING),
            [QUESTIONS[0], too_long],
        )
    assert not (tmp_path / "s").exists()
    long = Question("long", "1 " * 88, "1")  # fits (251 of 256 tokens), its responses do not: refused too
    with pytest.raises(
        InputError,
        match=r"the prompt of question 'long' is 251 tokens, and 251 \+ 10 exceed.*use max_new_tokens=5 or less",
    ):
        generate(
            tiny_chat, GenerateRun(StoreSpec(tmp_path / "s"), pool=2, sampling=SAMPLING), [QUESTIONS[0], long]
        )
    assert not (tmp_path / "s").exists()
    out_of_memory = Question("oom", "2 + 2", "4")  # fails as it is sampled (here: as if out of memory)
    report = generate(
        tiny_chat,
        GenerateRun(StoreSpec(tmp_path / "s"), pool=2, sampling=SAMPLING),
        [QUESTIONS[0], out_of_memory],
        backend=_FailingOn(tiny_chat, out_of_memory),
    )
    assert report.failed == 2 and report.first_error == "RuntimeError: CUDA out of memory"
    failed = [r for r in _records(tmp_path / "s") if r["status"] == "failed"]
    assert [r["id"] for r in failed] == ["oom#0", "oom#1"] and "out of memory" in failed[0]["error"]
    pools, info = load_pools(tmp_path / "s", DTRConfig(), n=2)
    assert list(pools) == ["q0"] and info.excluded == ["oom"] and len(info.failed) == 2
    with pytest.raises(InputError) as too_many:
        summarise(tmp_path / "s", VotingConfig(n=3, trials=1))
    assert flag_line(too_many.value) == (  # as the command line says it; Python reads `use n=2 or less`
        f"{tmp_path / 's'}: no question has 3 usable responses (pool 2, 2 failed; the most any question has is "
        "2); use --n 2 or less, or generate a store with a larger --pool"
    )
    assert str(too_many.value).endswith("use n=2 or less, or generate a store with a larger pool")
    assert summarise(tmp_path / "s", VotingConfig(n=2, trials=1)).info.excluded == ["oom"]  # the remedy works


def test_a_store_without_responses_says_to_resume_it(tiny_chat, tmp_path):
    """A store killed before its first record (the manifest written, no line yet): --resume finishes it."""
    _store(tiny_chat, tmp_path / "s", store="jsonl")
    (tmp_path / "s" / SAMPLES).write_text("")
    # as the writer left it before its first commit: the manifest commits no record (a store that lost committed
    # records is refused as cut instead: tests/test_record_validation.py)
    manifest = samples_manifest(tmp_path / "s")
    entries = json.loads(manifest.read_text())
    entries[COMMITTED] = Running().entry()
    manifest.write_text(json.dumps(entries))
    with pytest.raises(InputError) as empty:
        summarise(tmp_path / "s", VotingConfig(n=2, trials=1))
    assert flag_line(empty.value) == (
        f"{tmp_path / 's'}: it holds no responses yet (pool 4); finish it first by rerunning the command that "
        "wrote it with --resume"
    )
    _store(tiny_chat, tmp_path / "s", resume=True, store="jsonl")
    assert summarise(tmp_path / "s", VotingConfig(n=2, trials=1)).info.responses == 12


class _FailingOn:
    """The hf sampler, raising as an exhausted device would for ``question``'s prompt."""

    def __init__(self, lm, question):
        from depthlens.config import EngineConfig
        from depthlens.sampling.choose import make_backend
        from depthlens.studies.generate import prompt_ids

        self.inner = make_backend(lm, EngineConfig(), SAMPLING)
        self.prompt = prompt_ids(lm, question)

    def start(self, prompt, seeds):
        if list(prompt) == self.prompt:
            raise RuntimeError("CUDA out of memory")
        return self.inner.start(prompt, seeds)


def test_bad_stores_say_what_is_wrong(tiny_chat, tmp_path):
    with pytest.raises(StoreError, match="not a depthlens sample store"):
        summarise(tmp_path)
    _store(tiny_chat, tmp_path / "s", pool=2, store="jsonl")  # a JSONL store's lines are easy to damage
    meta = tmp_path / "s" / f"{SAMPLES}.manifest.json"
    manifest = json.loads(meta.read_text())
    meta.write_text(json.dumps({**manifest, "store_version": 99}))
    with pytest.raises(StoreError, match="version-99 store"):
        summarise(tmp_path / "s")
    meta.write_text(json.dumps(manifest))
    lines = (tmp_path / "s" / SAMPLES).read_text().splitlines()
    broken = json.loads(lines[0])
    del broken["divergence"]
    (tmp_path / "s" / SAMPLES).write_text("\n".join([json.dumps(broken), *lines[1:]]) + "\n")
    with pytest.raises(StoreError, match=r"missing field\(s\) \['divergence'\]"):
        summarise(tmp_path / "s", VotingConfig(n=2))


def test_summary_files_and_ablation(tiny_chat, tmp_path):
    _store(tiny_chat, tmp_path / "s")
    report = summarise(tmp_path / "s", VotingConfig(n=2, trials=3, rank_prefix=4), with_ablation=True)
    payload = json.loads((tmp_path / "s" / "thinkn-n2-eta0.5-l4.json").read_text())
    assert [m["method"] for m in payload["methods"]] == [s.method for s in report.summaries]
    assert (
        (tmp_path / "s" / "thinkn-n2-eta0.5-l4.csv").read_text().startswith("model,task,method,accuracy_mean")
    )
    assert report.ablation and (tmp_path / "s" / "thinkn-n2-eta0.5-l4-ablation.csv").exists()
    cons = next(s for s in report.summaries if s.method == "cons@n")
    think = next(s for s in report.summaries if s.method == "think@n")
    assert think.cost_mean <= cons.cost_mean


def test_a_full_disk_leaves_no_half_written_summary_and_names_the_file(
    tiny_chat, tmp_path, monkeypatch, capsys
):
    """The summary's files are written whole or not at all; the error names the file and says what to do, and
    doing it (space freed, the command run again) writes them."""
    import errno
    import os
    import types

    import depthlens.studies.tables as tables

    _store(tiny_chat, tmp_path / "s")
    before = sorted(p.name for p in (tmp_path / "s").iterdir())

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tables, "os", types.SimpleNamespace(getpid=os.getpid, fsync=full))
    args = ("thinkn", "--from", tmp_path / "s", "--n", "2", "--trials", "2")
    code, _, err = run(monkeypatch, capsys, *args)
    csv = tmp_path / "s" / "thinkn-n2-eta0.5-l50.csv"
    assert code == 2 and (
        f"error: {csv}: the disk is full, so it was not written (nothing half-written is left); free some space, "
        "then run the command again"
    ) in " ".join(err.split()), err
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == before  # no 0-byte csv, no temporary file
    monkeypatch.setattr(tables, "os", os)  # space freed; the command run again
    code, _, err = run(monkeypatch, capsys, *args)
    assert code == 0, err
    assert (
        csv.read_text().startswith("model,task,method,")
        and json.loads(csv.with_suffix(".json").read_text())["methods"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n", "4", "--eta", "0"], "error: --eta 0.0: must be in (0, 1]"),
        (["--n", "4", "--prefix", "fifty"], "--prefix 'fifty': give a number of tokens or 'full'"),
        (["--n", "4", "--task", "nope"], "unknown task 'nope'"),
        (["--n", "4", "--tie-break", "coin"], "error: --tie-break coin: must be one of uniform, summed-dtr"),
    ],
)
def test_thinkn_cli_errors(monkeypatch, capsys, tmp_path, args, message):
    code, _, err = run(monkeypatch, capsys, "thinkn", "--out", tmp_path / "o", *args)
    assert code == 2 and message in err


def test_thinkn_shows_random_at_n_the_control_and_the_ties(view_stores, monkeypatch, capsys, tmp_path):
    """Issue 48: random@n after Think@n and Cons@n, Think@n − random@n under the paired table, the tie rule and
    the tie shares under the table, all of it in the summary; --tie-break is a setting of the summary."""
    import shutil

    import depthlens

    shutil.copytree(view_stores["answers"], tmp_path / "s")  # answered responses, votes that tie
    args = ("thinkn", "--from", tmp_path / "s", "--n", "4", "--trials", "3", "--prefix", "4")
    code, out, err = run(monkeypatch, capsys, *args)
    assert code in (0, None), err
    said = " ".join(err.split())
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert rows[:3] == ["think@n", "cons@n", "random@n"] and "think@n − random@n" in rows
    assert "exact %" in out and "trials % ± s.d." in out and "+2.0 / +3.3" in out
    assert "random@n trials: the expectation over all 6 subsets of 2 of each draw" in said
    # issue 56: the exact expectation over every draw, and the control judged against 0
    assert "exact: each method's expectation over the one draw of n each question's pool allows" in said
    assert ("excludes 0" in out or "includes 0" in out) and "(0: no selection effect" in said
    assert "think@n vs random@n over 3 questions" in said and "the 95 % interval" in said, said
    summary = json.loads((tmp_path / "s" / "thinkn-n4-eta0.5-l4.json").read_text())
    assert summary["voting"]["tie_break"] == "uniform"
    methods = {m["method"]: m for m in summary["methods"]}
    assert methods["random@n"]["subsets"] == 6 and methods["think@n"]["subsets"] == 0
    assert all(0 <= m["tie_draws"] <= 9 for m in methods.values()) and methods["mean@n"]["tie_draws"] == 0
    assert (
        methods["cons@n"]["tie_draws"] > 0
    )  # this pool's votes tie: the line says how often, and by which rule
    share = methods["cons@n"]["tie_share_exact"]  # the notes give the exact share, over every draw
    assert "votes tied at the top, share of the draws (uniform" in said and f"cons@n {share:.0%}" in said
    assert methods["think@n"]["draws_exact"] == 3 and methods["think@n"]["draws_all"] is True  # pool = n = 4
    assert (
        methods["think@n"]["accuracy_exact"] is not None
        and methods["think@n"]["cut_tie_share_exact"] is not None
    )
    assert summary["per_question"]["basis"] == "exact" and set(
        summary["per_question"]["accuracy_trials"]
    ) == set(methods)
    assert summary["control"]["method"] == "think@n" and summary["control"]["vs"] == "random@n"
    assert set(summary["per_question"]["accuracy"]) == set(methods)
    # the other rule is another summary's settings: refused without --overwrite, then recorded
    code, _, err = run(monkeypatch, capsys, *args, "--tie-break", "summed-dtr")
    assert code == 2 and "voting.tie_break: stored 'uniform', this run 'summed-dtr'" in " ".join(err.split())
    code, _, err = run(monkeypatch, capsys, *args, "--tie-break", "summed-dtr", "--overwrite")
    assert code in (0, None), err
    summary = json.loads((tmp_path / "s" / "thinkn-n4-eta0.5-l4.json").read_text())
    assert summary["voting"]["tie_break"] == "summed-dtr"
    assert "(summed-dtr: the highest summed prefix DTR" in " ".join(err.split())
    ties = {m["method"]: m["tie_draws"] for m in summary["methods"]}
    assert ties == {m: v["tie_draws"] for m, v in methods.items()}  # the same draws tie under either rule
    # the Python call takes the same keyword, and its rows are the summary's
    rows = depthlens.think_at_n(tmp_path / "s", n=4, trials=3, prefix=4, tie_break="summed-dtr").to_pylist()
    rows, control = rows[:-1], rows[-1]  # the summary's rows, then its control's
    assert (control["method"], control["vs"]) == (summary["control"]["method"], summary["control"]["vs"])
    assert [r["method"] for r in rows] == [m["method"] for m in summary["methods"]]
    assert [r["accuracy_mean"] for r in rows] == [m["accuracy_mean"] for m in summary["methods"]]
    assert [r["accuracy_exact"] for r in rows] == [m["accuracy_exact"] for m in summary["methods"]]
    with pytest.raises(ConfigError, match="tie_break"):
        depthlens.think_at_n(tmp_path / "s", n=4, trials=1, tie_break="coin")


def test_a_summary_from_before_tie_break_was_voted_under_summed_dtr(tiny_chat, monkeypatch, capsys, tmp_path):
    _store(tiny_chat, tmp_path / "s")
    args = ("thinkn", "--from", tmp_path / "s", "--n", "3", "--trials", "2", "--prefix", "4")
    assert run(monkeypatch, capsys, *args, "--tie-break", "summed-dtr")[0] in (0, None)
    path = tmp_path / "s" / "thinkn-n3-eta0.5-l4.json"
    old = json.loads(path.read_text())
    del old["voting"]["tie_break"]  # as written before the option
    path.write_text(json.dumps(old))
    code, _, err = run(monkeypatch, capsys, *args)
    assert code == 2 and "voting.tie_break: stored 'summed-dtr', this run 'uniform'" in " ".join(err.split())
    assert run(monkeypatch, capsys, *args, "--tie-break", "summed-dtr")[0] in (0, None)  # the same settings


def test_thinkn_needs_out_or_from(monkeypatch, capsys):
    code, _, err = run(monkeypatch, capsys, "thinkn")
    assert code == 2 and "give --out DIR" in err


@pytest.mark.integration
def test_real_model_thinkn_end_to_end(real_model, monkeypatch, capsys, tmp_path):
    """Generate with the default model, then re-vote from the store through the CLI."""
    qs = load_task("reasoning_gym:basic_arithmetic", 1, seed=0)
    sampling = dataclasses.replace(SAMPLING, max_new_tokens=24, readout_tokens=8)
    report = generate(
        real_model, GenerateRun(StoreSpec(tmp_path / "s"), pool=3, sampling=sampling, batch_size=3), qs
    )
    assert report.written == 3 and report.failed == 0
    record = _records(tmp_path / "s")[0]
    assert "<|im_end|>" not in record["text"] and len(record["divergence"]) == min(8, record["token_count"])
    code, out, err = run(
        monkeypatch, capsys, "thinkn", "--from", tmp_path / "s", "--n", "2", "--prefix", "8", "--trials", "2"
    )
    assert code in (0, None), err
    assert "think@n" in out and "cons@n" in out


def test_live_think_at_n_finishes_only_the_kept(tiny_chat):
    """The deployed two-phase flow: same kept set and votes as ranking the full pool, at the exact cost."""
    from depthlens.evals.answers import extract_answer, vote_key
    from depthlens.sampling.hf import HFGenerator
    from depthlens.studies.thinkn import response_from_trace, think_at_n_live
    from depthlens.voting.methods import think_at_n

    gen = HFGenerator(tiny_chat, SAMPLING)
    prompt, seeds = [1, 5, 6, 7], [31, 32, 33, 34, 35, 36]
    voting = VotingConfig(n=6, eta=0.5, rank_prefix=3)

    def key(trace):
        found = extract_answer(tiny_chat.tokenizer.decode(trace.token_ids, skip_special_tokens=True))
        return vote_key(found.text) if found else None

    answer, traces, cost = think_at_n_live(gen, prompt, seeds, voting, DTRConfig(), key)
    whole = gen.sample(prompt, seeds)
    pool = [
        dataclasses.replace(response_from_trace(t, tiny_chat.n_layers, DTRConfig()), key=key(t))
        for t in whole
    ]
    offline = think_at_n(pool, voting)
    assert answer == offline.answer
    assert cost == offline.cost == sum(len(t) for t in traces)
    for i, t in enumerate(traces):
        expected = whole[i].token_ids if i in offline.kept else whole[i].token_ids[:3]
        assert t.token_ids == expected


def test_task_config_sets_reasoning_gym_difficulty():
    from depthlens.evals.loading import parse_task_config

    config = parse_task_config("min_terms=2,max_terms=2,max_digits=1, allow_negation=false")
    assert config == {"min_terms": 2, "max_terms": 2, "max_digits": 1, "allow_negation": False}
    qs = load_task(
        "reasoning_gym:chain_sum", 5, seed=0, config={"min_terms": 2, "max_terms": 2, "max_digits": 1}
    )
    assert all(
        len(q.question.split("problem:")[1].split()) == 4 for q in qs
    )  # "a ± b =": two one-digit terms
    with pytest.raises(InputError, match=r"has no setting 'no_such_setting'"):
        load_task("reasoning_gym:chain_sum", 2, config={"no_such_setting": 1})
    with pytest.raises(InputError, match="key=value"):
        parse_task_config("max_terms")


def test_store_from_an_older_version_without_newer_fields_resumes(tiny_chat, tmp_path):
    """A manifest written before a settings field existed resumes when this run leaves it at its default."""
    _store(tiny_chat, tmp_path / "s", pool=2, store="jsonl")  # stores that old are JSONL
    meta = tmp_path / "s" / f"{SAMPLES}.manifest.json"
    manifest = json.loads(meta.read_text())
    for key in ("compile", "early_exit", "also"):
        del manifest["readout"][key]
    meta.write_text(json.dumps(manifest))
    assert _store(tiny_chat, tmp_path / "s", pool=2, resume=True).skipped == 6
    from depthlens.config import ReadoutConfig

    # a non-default value is still a mismatch
    with pytest.raises(StoreError, match=r"readout.also: stored \[\], this run \['kl'\]"):
        _store(tiny_chat, tmp_path / "s", pool=2, resume=True, readout=ReadoutConfig(also=("kl",)))


def test_the_paired_table_fits_80_columns_and_judges_the_control_against_zero():
    """Issue 56: on an 80-column terminal every line of the paired table fits, each number whole (a cell wraps at its
    spaces); the control's interval is read against 0, not against the paper's Think@n − Cons@n gaps."""
    from rich.console import Console

    from depthlens.cli.paired_view import paired_table
    from depthlens.studies.comparisons import control_comparison, paired_comparisons
    from depthlens.studies.tables import gap_cell

    rng = np.random.default_rng(0)
    per_question = {
        m: rng.random(32) for m in ("cons@n", "think@n", "random@n", "self-certainty@n", "think-strata@n")
    }
    per_question["think@n"] = per_question["random@n"] - 0.3  # a control far below 0
    paired = paired_comparisons(per_question, seed=0)
    control = control_comparison(per_question, seed=0)
    assert control.row()["excludes_0"] is True and "excludes_gap2.0" not in control.row()
    assert gap_cell(control.row()) == "excludes 0" and "excludes_gap2.0" in paired[0].row()
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(paired_table(paired, control, console.width))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    cells = " ".join(line for line in lines if line.startswith("│"))
    for c in [*paired, control]:  # every difference's digits appear whole (its cell may span two lines)
        assert f"{100 * c.test.difference:+.1f} [" in cells, c.method
    wide = Console(width=160, record=True, file=io.StringIO())
    wide.print(paired_table(paired, control, wide.width))
    assert any(f"{100 * control.test.difference:+.1f} [" in line for line in wide.export_text().splitlines())
