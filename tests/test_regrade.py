"""Answer rules end to end: native prompts and grading, the store's answer summary, and `depthlens regrade`."""

from __future__ import annotations

import json

import pytest

from depthlens.config import AnswerConfig, GenerateRun, SamplingConfig, StoreSpec, TaskSpec, VotingConfig
from depthlens.errors import StoreError
from depthlens.evals.answers import RULES
from depthlens.evals.grading import grade
from depthlens.evals.loading import load_task
from depthlens.evals.tasks import Question, infer_answer_type
from depthlens.stores.files import manifest_path
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.parquet import MANIFEST
from depthlens.stores.samples import SAMPLES, SHARDS, iter_samples
from depthlens.studies.generate import generate
from depthlens.studies.regrade import regrade_store
from depthlens.studies.thinkn import summarise, summary_files
from tests.test_cli import run

QUESTIONS = [Question("q0", "1 2", "3"), Question("q1", "4 5", "9")]
SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=6, readout_tokens=None)
# What main's rules (depthlens-answers-1) stored for these texts: any last number, cut-off text included.
OLD = [
    ("1. Add them\n2. The sum is 3", "eos", "3", "number", "correct"),  # an unstated answer
    (r"so \boxed{3} is it", "length", "3", "boxed", "correct"),
    ("we are at 9 and then", "length", "9", "number", "correct"),  # cut off mid-sentence, graded right
    ("The answer is 9.", "eos", "9", "number", "correct"),
]


def _old_store(lm, out):
    """A store as main wrote it before the answer rules: JSONL, no answer settings in the manifest, the old
    answer fields."""
    generate(
        lm,
        GenerateRun(StoreSpec(out, format="jsonl"), pool=2, seed=1, sampling=SAMPLING, batch_size=2),
        QUESTIONS,
    )
    meta = manifest_path(out / SAMPLES)
    manifest = json.loads(meta.read_text())
    del manifest["answers"]
    meta.write_text(json.dumps(manifest))
    records = list(iter_jsonl(out / SAMPLES))
    for record, (text, finish, answer, source, status) in zip(records, OLD, strict=True):
        record.update(text=text, finish=finish, answer=answer, answer_source=source, vote_key=answer)
        record.update(grade=status, correct=status == "correct")
    (out / SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_regrade_reads_an_old_store_under_the_current_rules(tiny_chat, tmp_path):
    store = tmp_path / "old"
    before = _old_store(tiny_chat, store)
    summarise(store, VotingConfig(n=2, trials=1))
    [summary_path] = summary_files(store)
    assert json.loads(summary_path.read_text())["answers"]["rules"] == "depthlens-answers-1"

    report = regrade_store(store)
    after = list(iter_jsonl(store / SAMPLES))
    assert [(r["answer"], r["answer_source"], r["grade"]) for r in after] == [
        (None, "none", "no_answer"),
        ("3", "boxed", "correct"),
        (None, "none", "no_answer"),
        ("9", "phrase", "correct"),
    ]
    assert (report.responses, report.changed_answer, report.changed_grade) == (4, 2, 2)
    assert report.before.sources["last-number"] == 3 and report.after.sources["phrase"] == 1
    assert (report.before.truncated, report.after.truncated) == (2, 2)
    assert report.grades_before == {"correct": 4} and report.grades_after == {"correct": 2, "no_answer": 2}
    # nothing lost: the old fields are in each record's history, the rest of the record is untouched
    assert after[0]["answer_history"][0]["answer"] == "3"
    assert after[0]["answer_history"][0]["rules"] == "depthlens-answers-1"
    assert after[0]["divergence"] == before[0]["divergence"]
    manifest = json.loads(manifest_path(store / SAMPLES).read_text())
    assert manifest["answers"] == {**AnswerConfig().to_dict(), "rules": RULES}
    assert manifest["regraded"][0]["from_rules"] == "depthlens-answers-1"
    assert sorted(p.name for p in store.iterdir() if "tmp" in p.name) == []
    # the stale summary was re-voted; thinkn --from reads the regraded store
    summary = json.loads(summary_path.read_text())
    assert report.summary_rewritten and summary["answers"]["rules"] == RULES
    assert summary["answers"]["sources"]["none"] == 2
    # a second regrade changes nothing and keeps both histories
    again = regrade_store(store)
    assert (again.changed_answer, again.changed_grade) == (0, 0)
    assert len(next(iter_jsonl(store / SAMPLES))["answer_history"]) == 2


def test_regrade_cli_prints_before_and_after(monkeypatch, capsys, tiny_chat, tmp_path):
    store = tmp_path / "old"
    _old_store(tiny_chat, store)
    code, _, err = run(monkeypatch, capsys, "thinkn", "--from", store, "--n", "2", "--trials", "1")
    assert (
        "answers (depthlens-answers-1, paper prompts, fallback last-number): boxed 1, last-number 3;" in err
    )
    assert f"older rules (depthlens-answers-1); `depthlens regrade {store}` re-reads them" in err
    code, out, err = run(monkeypatch, capsys, "regrade", store, "--answer-fallback", "last-number")
    assert code in (0, None), err
    assert "depthlens-answers-1 → depthlens-answers-2" in out
    rows = {
        " ".join(line.split("│")[1].split()): [c.strip() for c in line.split("│")[2:4]]
        for line in out.splitlines()
        if line.count("│") == 4
    }
    assert rows["answer from last-number"] == ["3", "1"]  # only the response that ended by itself keeps it
    assert rows["answer from phrase"] == ["0", "1"] and rows["answer from none"] == ["0", "1"]
    assert rows["graded correct"] == ["4", "3"] and rows["accuracy per response %"] == ["100.0", "75.0"]
    assert rows["truncated (cut at the token cap)"] == ["2", "2"]
    assert "1 response(s) changed answer, 1 changed grade" in err
    code, _, err = run(monkeypatch, capsys, "thinkn", "--from", store, "--n", "2", "--trials", "1")
    assert code in (0, None), err
    assert (
        "answers (depthlens-answers-2, paper prompts, fallback last-number): boxed 1, phrase 1, last-number 1, none 1;"
        in err
    )


def test_regrade_refuses_questions_reasoning_gym_no_longer_generates(tiny_chat, tmp_path):
    store = tmp_path / "rg"
    questions = load_task("reasoning_gym:spell_backward", 1, seed=2)
    task = TaskSpec("reasoning_gym:spell_backward", questions=1, task_seed=3, task_config=None)
    generate(tiny_chat, GenerateRun(StoreSpec(store), pool=1, sampling=SAMPLING, task=task), questions)
    with pytest.raises(StoreError, match=r"spell_backward-0 with answer .* regrade with the reasoning-gym"):
        regrade_store(store)


def test_native_prompt_and_grading_follow_reasoning_gym():
    q = load_task("reasoning_gym:spell_backward", 1, seed=0)[0]
    assert q.answer_type == "string"
    system, user = q.messages("native")
    assert "<answer>answer here</answer>" in system["content"] and user["content"] == q.question
    native = AnswerConfig(prompt_style="native")
    assert grade(q, f"Reversed: <answer>{q.answer}</answer>", "length", native).status == "correct"
    cut = grade(q, "1. Spell it\n2. Reverse: 3", "length", native)
    assert (cut.status, cut.source, cut.task_score) == ("no_answer", None, 0.0)
    # reasoning-gym's partial credit for a right prefix sums to 1.0000000000000002: not full credit
    extra = grade(q, f"<answer>{q.answer}x</answer>", "eos", native)
    assert extra.status == "wrong" and extra.task_score > 1.0


def test_answer_types_from_the_registry_or_inferred():
    assert load_task("reasoning_gym:word_sorting", 1)[0].answer_type == "list"
    assert load_task("reasoning_gym:gcd", 1)[0].answer_type == "number"
    assert load_task("reasoning_gym:isomorphic_strings", 1)[0].answer_type == "string"  # inferred: True/False
    assert infer_answer_type(["12", "-3.5"]) == "number"
    assert infer_answer_type(["['1', '2']"]) == "list"
    assert infer_answer_type([r"\frac{1}{2}", "3"]) == "expression"
    assert infer_answer_type(["B", "C"]) == "letter"
    assert infer_answer_type(["cyan", "12"]) == "string"


def test_native_prompts_need_a_reasoning_gym_task(monkeypatch, capsys, tmp_path):
    code, _, err = run(
        monkeypatch,
        capsys,
        "generate",
        "--out",
        tmp_path / "s",
        "--task",
        "aime2025",
        "--prompt-style",
        "native",
    )
    assert code == 2
    assert err.strip() == (
        "error: --prompt-style native asks in reasoning-gym's own format, so it needs a reasoning_gym task, "
        "not 'aime2025'; use --prompt-style paper"
    )
    code, _, err = run(monkeypatch, capsys, "generate", "--out", tmp_path / "s", "--answer-fallback", "last")
    assert code == 2 and err.strip() == (
        "error: --answer-fallback 'last': use one of none, last-number, final-result"
    )


def test_an_old_store_resumes_once_regraded(tiny_chat, tmp_path):
    store = tmp_path / "old"
    _old_store(tiny_chat, store)
    again = GenerateRun(StoreSpec(store, resume=True), pool=2, seed=1, sampling=SAMPLING, batch_size=2)
    with pytest.raises(
        StoreError, match=r"before the answer rules.*`depthlens regrade .*` first, then resume"
    ):
        generate(tiny_chat, again, QUESTIONS)
    regrade_store(store)
    report = generate(tiny_chat, again, QUESTIONS)  # the manifests now agree
    assert (report.skipped, report.written) == (4, 0)


def test_a_sharded_store_is_regraded_by_new_shards_its_manifest_commits(tiny_chat, tmp_path, monkeypatch):
    store = tmp_path / "s"
    generate(
        tiny_chat, GenerateRun(StoreSpec(store), pool=2, seed=1, sampling=SAMPLING, batch_size=2), QUESTIONS
    )
    shards = store / SHARDS
    before = {r["id"]: r for r in iter_samples(store)}
    old_files = sorted(p.name for p in shards.glob("part-*"))
    from depthlens.stores import recover as parquet_store  # where the commit's manifest is written

    def cut(*_):  # the process dies after the new shards, before the manifest commits them
        raise OSError("killed")

    with monkeypatch.context() as m:
        m.setattr(parquet_store, "write_json", cut)
        with pytest.raises(OSError):
            regrade_store(store, fallback="last-number")
    assert json.loads((shards / MANIFEST).read_text())["answers"]["fallback"] == "none"  # not committed
    report = regrade_store(store, fallback="last-number")  # the interrupted regrade's shards are cleared
    assert report.responses == 4
    after = {r["id"]: r for r in iter_samples(store)}
    assert after.keys() == before.keys()
    for rid, r in after.items():
        assert r["answer_history"][0]["grade"] == before[rid]["grade"]
        assert r["divergence"] == before[rid]["divergence"] and r["token_ids"] == before[rid]["token_ids"]
    files = sorted(p.name for p in shards.glob("part-*"))
    assert len(files) == len(old_files) and not set(files) & set(old_files)  # every shard replaced
    manifest = json.loads((shards / MANIFEST).read_text())
    assert manifest["answers"]["fallback"] == "last-number" and len(manifest["regraded"]) == 1
    again = GenerateRun(
        StoreSpec(store, resume=True),
        pool=2,
        seed=1,
        sampling=SAMPLING,
        batch_size=2,
        answers=AnswerConfig(fallback="last-number"),
    )
    assert generate(tiny_chat, again, QUESTIONS).skipped == 4  # still resumes
    assert len(json.loads((shards / MANIFEST).read_text())["regraded"]) == 1  # and keeps its regrade log


def test_regrade_into_a_copy_grades_the_same_texts_under_the_fallback(
    monkeypatch, capsys, tiny_chat, tmp_path
):
    """`regrade --out`: the store as it was, its copy read under final-result; thinkn reads each like any store."""
    store, copy = tmp_path / "s", tmp_path / "copy"
    generate(
        tiny_chat,
        GenerateRun(StoreSpec(store, format="jsonl"), pool=2, seed=1, sampling=SAMPLING, batch_size=2),
        QUESTIONS,
    )
    texts = ["1 + 2 = 3", "So, 1 + 2 is simply 3.", "4 + 5 =", "4 + 5 = 9\n\nThe answer is 8."]
    records = list(iter_jsonl(store / SAMPLES))
    for record, text in zip(records, texts, strict=True):
        record.update(text=text, finish="eos")
    (store / SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in records))
    regrade_store(store)  # the strict rules, as generate would have read these texts
    before = {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()}

    code, _, err = run(
        monkeypatch, capsys, "regrade", store, "--answer-fallback", "final-result", "--out", copy
    )
    assert code in (0, None), err
    assert {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()} == before  # untouched
    graded = [(r["answer"], r["answer_source"], r["grade"]) for r in iter_jsonl(copy / SAMPLES)]
    assert graded == [
        ("3", "equation", "correct"),
        ("3", "statement", "correct"),
        (None, "none", "no_answer"),  # trails off: not read
        ("8", "phrase", "wrong"),  # a stated answer wins over the equation before it
    ]
    assert json.loads(manifest_path(copy / SAMPLES).read_text())["answers"]["fallback"] == "final-result"
    for path, fallback in ((store, "none"), (copy, "final-result")):
        code, _, err = run(monkeypatch, capsys, "thinkn", "--from", path, "--n", "2", "--trials", "1")
        assert code in (0, None) and f"paper prompts, fallback {fallback})" in err, err
    code, _, err = run(monkeypatch, capsys, "regrade", store, "--out", copy)
    assert code not in (0, None) and "already exists" in err
    code, _, err = run(monkeypatch, capsys, "regrade", store, copy, "--out", tmp_path / "c2")
    assert code not in (0, None) and "one at a time" in err
