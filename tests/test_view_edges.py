"""``depthlens view``'s first-hour edges (issue 52, item 6): a store whose run was interrupted, or is still being
written, says so; a response shows its prompt as the model read it; a scored record has none. The pages
themselves: tests/test_view_browser.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import depthlens
from depthlens.models.load import load_tokenizer
from depthlens.stores.lock import lock_path
from depthlens.stores.samples import SHARDS, iter_samples, read_manifest
from depthlens.studies import generate as generation
from depthlens.view.detail import Labeller, response_detail
from depthlens.view.store import open_store

TASK = {"task_config": "min_terms=2,max_terms=2,max_digits=1", "max_new_tokens": 10, "readout_tokens": None}


def interrupted_store(view_stores: dict[str, Path], out: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A sample store whose run was stopped (KeyboardInterrupt) after the first of its 2 questions × pool 2, by
    the Python API on the view stores' tiny chat model (its tokenizer loads from the manifest's model path)."""
    model = depthlens.load(str(view_stores["samples"].parent / "tiny-chat"), device="cpu")
    real, calls = generation.generate_question, []

    def second_stops(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "generate_question", second_stops)
    with pytest.raises(KeyboardInterrupt):
        depthlens.generate(
            model, "reasoning_gym:chain_sum", pool=2, questions=2, out=out, progress=False, **TASK
        )
    monkeypatch.undo()
    return out


def test_an_interrupted_run_says_so(view_stores, tmp_path, monkeypatch):
    out = interrupted_store(view_stores, tmp_path / "cut", monkeypatch)
    store = open_store(out)
    assert len(store.records) == 2
    # the line every door says (stores.shortfall): check, thinkn --from, report, export, the explorer
    assert (
        f"{out}: incomplete, 2 of 4 responses (2 questions × pool 2); `--resume` finishes it, or it was cut by hand"
    ) in store.notices


@pytest.mark.parametrize("name", ["samples", "samples_jsonl", "answers", "online", "scores", "scores_jsonl"])
def test_a_finished_run_says_nothing_of_it(view_stores, name):
    notices = open_store(view_stores[name]).notices
    assert not [n for n in notices if "incomplete" in n or "writing it now" in n], notices


def test_an_interrupted_score_run_says_so(view_stores, tmp_path):
    cut = tmp_path / "scores.jsonl"
    lines = view_stores["scores_jsonl"].read_text().splitlines(keepends=True)
    cut.write_text("".join(lines[:-3]))  # the last 3 records never written
    manifest = view_stores["scores_jsonl"].with_name("scores.jsonl.manifest.json")
    shutil.copy(manifest, cut.with_name(manifest.name))
    notices = open_store(cut).notices
    interrupted = [n for n in notices if ": incomplete, " in n]
    assert interrupted == [
        f"{cut}: incomplete, {len(lines) - 3} of {len(lines)} records of its input; `--resume` finishes it, or it "
        "was cut by hand"
    ]


HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, b"pid %d (depthlens generate --resume)\\n" % os.getpid())
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="advisory locks are POSIX's")
def test_a_store_being_written_names_its_writer(view_stores, tmp_path, monkeypatch):
    out = interrupted_store(view_stores, tmp_path / "cut", monkeypatch)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock_path(out / SHARDS))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        notices = open_store(out).notices
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()
    assert (
        f"{out}: 2 of 4 responses (2 questions × pool 2) so far: a run is writing it now (pid {holder.pid} "
        "(depthlens generate --resume)); shown is what was committed when this page opened"
    ) in notices
    assert not [n for n in notices if "incomplete" in n]


def test_a_response_shows_its_prompt_as_the_model_read_it(view_stores):
    store = open_store(view_stores["samples"])
    model = read_manifest(view_stores["samples"])["model"]
    detail = response_detail(store, 0, Labeller(model))
    (record,) = [r for r in iter_samples(view_stores["samples"]) if r["id"] == detail["id"]]
    decoded = load_tokenizer(model).decode(record["prompt_ids"], skip_special_tokens=False)
    assert detail["prompt"] == {"text": decoded, "tokens": len(record["prompt_ids"]), "source": "prompt"}
    assert "assistant: " in decoded  # the chat template's markup, as the model read it


def test_without_a_tokenizer_the_question_stands_in(view_stores):
    store = open_store(view_stores["samples"])
    detail = response_detail(store, 0, Labeller(None))
    question = store.questions[str(store.records[0]["question_id"])].text
    assert question and detail["prompt"]["text"] == question and detail["prompt"]["source"] == "question"


def test_a_scored_record_has_no_prompt(view_stores):
    store = open_store(view_stores["scores"])
    assert response_detail(store, 0, Labeller(store.manifest.get("model")))["prompt"] is None
