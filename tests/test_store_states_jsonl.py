"""A JSONL sample store driven through random sequences of what happens to one file — writes and resumes, the file
emptied, cut at a line boundary or mid-line, a record edited against itself (its remedy followed: the line deleted,
the run resumed), a lock left by a killed writer — with, after every step, every reader (the studies' reader,
``export``, ``thinkn --from``'s reader, the explorer) agreeing with ``depthlens check``: all refuse naming
``samples.jsonl`` (the line where a line is at fault), or all read exactly the committed records, each equal to an
uninterrupted run's; ``check`` never reports a writer that is not running. The Parquet machine, with kills
mid-write and foreign shards, is tests/test_store_states.py; the soak's variables work here too."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from depthlens.config import GenerateRun, StoreSpec
from depthlens.errors import StoreError
from depthlens.stores.lock import lock_path
from depthlens.stores.samples import SAMPLES, read_responses
from tests.store_states import BATCH, POOL, QUESTIONS, SAMPLING, Readers, world

__all__ = ["world"]  # the module's fixture, from tests/store_states.py


def _tokens(records) -> dict[str, list[int]]:
    return {r["id"]: list(r["token_ids"]) for r in records}


class JsonlStates(Readers, RuleBasedStateMachine):
    world: ClassVar[dict] = {}
    steps: ClassVar[Counter[str]] = Counter()

    @initialize(questions=st.integers(1, 3))
    def start(self, questions):
        self.root = self.world["root"]
        self.out = self.root / f"j{len(list(self.root.glob('j*')))}"
        self.questions, self.committed = 0, set()
        self.cut = False  # records removed or a line cut: readers refuse naming samples.jsonl
        self.edited: int | None = None  # the line edited against itself
        self.write(questions)

    def _lines(self) -> list[str]:
        return (self.out / SAMPLES).read_text().splitlines(keepends=True)

    @precondition(lambda self: self.edited is None)
    @rule(questions=st.integers(1, 3))
    def write(self, questions):
        """generate --resume (JSONL) with the first ``questions`` questions, to the end: it mends what was cut."""
        self.steps["write"] += 1
        from depthlens.studies.generate import generate

        self.questions = max(questions, self.questions)
        spec = StoreSpec(self.out, self.out.exists(), format="jsonl")
        run = GenerateRun(spec, pool=POOL, seed=3, sampling=SAMPLING, batch_size=BATCH)
        generate(self.world["lm"], run, QUESTIONS[: self.questions])
        self.committed = {f"{q.id}#{i}" for q in QUESTIONS[: self.questions] for i in range(POOL)}
        self.cut = False

    @precondition(lambda self: self.committed and self.edited is None)
    @rule(how=st.sampled_from(["emptied", "at a line", "mid-line"]), lines=st.integers(1, 5))
    def cut_the_file(self, how, lines):
        self.steps[f"cut {how}"] += 1
        kept = [] if how == "emptied" else self._lines()[: -lines if how == "at a line" else None]
        text = "".join(kept)
        if how == "mid-line":
            text = text[: len(text) - len(kept[-1]) // 2]
            kept = kept[:-1]
        (self.out / SAMPLES).write_text(text)
        self.committed = {json.loads(line)["id"] for line in kept}
        self.cut = True

    @precondition(lambda self: self.committed and not self.cut and self.edited is None)
    @rule(which=st.integers(0, 20))
    def edit_record(self, which):
        """A record's token_count one more than its tokens (the manifest's digest left as it was)."""
        self.steps["edit_record"] += 1
        lines = self._lines()
        self.edited = which % len(lines)
        record = json.loads(lines[self.edited])
        record["token_count"] += 1
        lines[self.edited] = json.dumps(record) + "\n"
        (self.out / SAMPLES).write_text("".join(lines))

    @precondition(lambda self: self.edited is not None)
    @rule()
    def follow_the_record_remedy(self):
        """'delete that line and rerun the command that wrote the store with --resume'."""
        self.steps["follow_the_record_remedy"] += 1
        lines = self._lines()
        del lines[self.edited]
        (self.out / SAMPLES).write_text("".join(lines))
        self.edited = None
        self.write(self.questions)

    @rule(pid=st.integers(10_000_000, 20_000_000))
    def stale_lock(self, pid):
        """A lock file left by a writer killed with -9: its text names a process that holds nothing."""
        self.steps["stale_lock"] += 1
        lock_path(self.out / SAMPLES).write_text(f"pid {pid} (depthlens generate --out {self.out})\n")

    @invariant()
    def every_reader_agrees_with_check(self):
        if not hasattr(self, "out"):
            return
        from depthlens.stores.check import check

        reports = check(self.out)
        problems = [p for report in reports for p in report.problems]
        notes = [n for report in reports for n in report.notes]
        assert not any("being written now" in n for n in notes), notes
        at = f"{self.out / SAMPLES}:{self.edited + 1}" if self.edited is not None else str(self.out / SAMPLES)
        try:
            records = [r for _, r in read_responses(self.out)]
        except StoreError as exc:
            assert at in str(exc), (at, str(exc))
            assert problems and at in str(problems[0].path), (at, problems)
            self._refused_export()
            self._other_readers_refuse({at})
            return
        assert not self.cut and self.edited is None, "read despite the damage"
        assert not problems, problems
        ids = [r["id"] for r in records]
        assert len(ids) == len(set(ids)) and set(ids) == self.committed
        reference = self.world["reference"]
        assert _tokens(records) == {i: reference[i][0] for i in ids}  # an uninterrupted run's tokens
        self._other_readers_read(records, notes)
        assert _tokens(self._exported()) == _tokens(records)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_jsonl_store_survives_any_sequence_of_cuts_and_edits(world, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    JsonlStates.world = world
    runner = JsonlStates.TestCase
    runner.settings = settings(
        max_examples=int(os.environ.get("DEPTHLENS_SOAK_EXAMPLES", "8")),  # cheap: no model is killed here
        stateful_step_count=int(os.environ.get("DEPTHLENS_SOAK_STEPS", "10")),
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    JsonlStates.steps.clear()
    runner().runTest()
    print(dict(JsonlStates.steps))
    cuts = sum(n for step, n in JsonlStates.steps.items() if step.startswith("cut"))
    assert cuts and JsonlStates.steps["edit_record"]  # derandomized: the same sequences, each damage met
