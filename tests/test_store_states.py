"""A sample store driven through random sequences of what happens to stores — writes, kill -9 mid-write (in a
subprocess, ``DEPTHLENS_FAULT_KILL_AFTER``), resumes, regrades (also killed), exports, a lost shard, a cut shard,
a shard of another run — with, after every step, every reader either returning exactly the committed records
(unique, each equal to an uninterrupted run's) or refusing naming the damaged file; and ``--resume`` always
bringing back everything computed. Bounded: a few examples of a few steps (about a minute on two cores)."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from depthlens.config import GenerateRun, SamplingConfig, StoreSpec
from depthlens.errors import StoreError
from depthlens.evals.tasks import Question
from depthlens.stores import layout
from depthlens.stores.samples import SHARDS, iter_samples

QUESTIONS = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(3)]
SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=4, readout_tokens=None)
POOL, BATCH = 4, 2


def _run(out, resume=False, batch_size=BATCH):
    return GenerateRun(
        StoreSpec(Path(out), resume), pool=POOL, seed=3, sampling=SAMPLING, batch_size=batch_size
    )


def _core(records):
    return {r["id"]: (r["token_ids"], r["divergence"], r["log_prob"]) for r in records}


def _killed_child(kind: str, model: str, out: str, questions: int, kill_after: int) -> None:
    """In a child process: resume the store (or regrade it) and SIGKILL itself mid-write of shard ``kill_after``."""
    os.environ["DEPTHLENS_FAULT_KILL_AFTER"] = str(kill_after)
    if kind == "regrade":
        from depthlens.studies.regrade import regrade_store

        regrade_store(Path(out))
    else:
        from depthlens.models.load import load
        from depthlens.studies.generate import generate

        generate(load(model, device="cpu"), _run(out, resume=True), QUESTIONS[:questions])
    os._exit(0)  # reached only when the kill point lies beyond the work


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny chat model saved for the children, loaded here; an uninterrupted run; a store of another run."""
    from depthlens.models.load import load
    from depthlens.studies.generate import generate
    from tests.conftest import save_chat_model

    root = tmp_path_factory.mktemp("states")
    model = save_chat_model(root / "chat")
    lm = load(str(model), device="cpu")
    generate(lm, _run(root / "whole"), QUESTIONS)
    generate(lm, _run(root / "other", batch_size=4), QUESTIONS)  # same seed, another run
    ctx = multiprocessing.get_context("forkserver")  # children fork from a process that imported torch once
    ctx.set_forkserver_preload(["depthlens.studies.generate", "depthlens.studies.regrade"])
    return {
        "root": root,
        "model": model,
        "lm": lm,
        "reference": _core(iter_samples(root / "whole")),
        "other": root / "other" / SHARDS,
        "ctx": ctx,
    }


class StoreStates(RuleBasedStateMachine):
    world: ClassVar[dict] = {}
    steps: ClassVar[Counter[str]] = (
        Counter()
    )  # what the sequences did, for the test to check its own coverage

    @initialize(questions=st.integers(1, 3))
    def start(self, questions):
        self.root = self.world["root"]
        self.out = self.root / f"s{len(list(self.root.glob('s*')))}"
        self.questions = 0  # questions asked so far
        self.committed: set[str] = set()
        self.damaged: set[str] = (
            set()
        )  # shards lost or cut: readers must refuse naming one; --resume recomputes
        self.foreign: set[str] = set()  # files of another run: readers and resume refuse naming one
        self.write(questions)  # every sequence starts from a written store, so every fault applies at once

    # ---- what happens to a store ------------------------------------------------------------------------------

    def _expected_after(self, questions: int, shards: int | None) -> set[str]:
        """The ids committed once a resume of ``questions`` questions has committed ``shards`` shards (None: all)."""
        done, written = set(self.committed), 0
        for q in QUESTIONS[:questions]:
            for first in range(0, POOL, BATCH):
                batch = {f"{q.id}#{i}" for i in range(first, first + BATCH)}
                if batch <= done:
                    continue
                if shards is not None and written == shards:
                    return done
                done |= batch
                written += 1
        return done

    @precondition(lambda self: not self.foreign)
    @rule(questions=st.integers(1, 3))
    def write(self, questions):
        """generate (or --resume) with the first ``questions`` questions, to the end."""
        self.steps["write"] += 1
        from depthlens.studies.generate import generate

        questions = max(questions, self.questions)  # the question list may only grow
        resume = self.out.exists()
        expected = self._expected_after(questions, None)
        generate(self.world["lm"], _run(self.out, resume=resume), QUESTIONS[:questions])
        self.questions, self.committed, self.damaged = questions, expected, set()

    @precondition(lambda self: not self.foreign and self.out.exists())
    @rule(kill_after=st.integers(0, 3), questions=st.integers(1, 3))
    def killed_write(self, kill_after, questions):
        self.steps["killed_write"] += 1
        questions = max(questions, self.questions)
        expected = self._expected_after(questions, kill_after)
        code = self._child("generate", questions, kill_after)
        event(f"write killed: {code == -signal.SIGKILL}")
        if code != -signal.SIGKILL:  # the kill point lay beyond the work: it finished
            assert code == 0
            expected = self._expected_after(questions, None)
        self.questions, self.committed, self.damaged = questions, expected, set()

    @precondition(lambda self: self.committed and not self.damaged and not self.foreign)
    @rule(killed=st.booleans(), kill_after=st.integers(0, 2))
    def regrade(self, killed, kill_after):
        self.steps["regrade"] += 1
        from depthlens.studies.regrade import regrade_store

        if killed:
            self._child("regrade", self.questions, kill_after)  # before its commit: the store stays as it was
        else:
            regrade_store(self.out)

    @precondition(lambda self: self.committed and not self.foreign)
    @rule(which=st.integers(0, 10), cut=st.booleans())
    def damage(self, which, cut):
        """A committed shard lost, or cut short."""
        self.steps["damage"] += 1
        shards = json.loads((self.out / SHARDS / layout.MANIFEST).read_text())["shards"]
        present = [
            s for s in shards if (self.out / SHARDS / s["file"]).is_file() and s["file"] not in self.damaged
        ]
        if not present:
            return
        shard = present[which % len(present)]
        path = self.out / SHARDS / shard["file"]
        if cut:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        else:
            path.unlink()
        event("shard cut" if cut else "shard lost")
        self.damaged.add(shard["file"])
        self.committed -= set(shard["ids"])  # until a resume computes them again

    @precondition(lambda self: self.out.exists() and not self.foreign)
    @rule(which=st.integers(0, 10), listed=st.booleans())
    def foreign_shard(self, which, listed):
        """A shard of another run copied in: over a listed name, or under a name of its own."""
        self.steps["foreign_shard"] += 1
        others = sorted(self.world["other"].glob("part-*.parquet"))
        shards = json.loads((self.out / SHARDS / layout.MANIFEST).read_text())["shards"]
        names = [s["file"] for s in shards if s["file"] not in self.damaged]
        name = names[which % len(names)] if listed and names else "part-000777.parquet"
        self.saved = (
            name,
            (self.out / SHARDS / name).read_bytes() if (self.out / SHARDS / name).is_file() else None,
        )
        shutil.copy(others[which % len(others)], self.out / SHARDS / name)
        self.foreign.add(name)

    @precondition(lambda self: bool(self.foreign))
    @rule()
    def follow_the_remedy(self):
        """'move it out of the store' — and put back what the copy replaced (a user's backup)."""
        self.steps["follow_the_remedy"] += 1
        name, saved = self.saved
        (self.out / SHARDS / name).unlink()
        if saved is not None:
            (self.out / SHARDS / name).write_bytes(saved)
        self.foreign = set()

    def _child(self, kind: str, questions: int, kill_after: int) -> int | None:
        proc = self.world["ctx"].Process(
            target=_killed_child, args=(kind, str(self.world["model"]), str(self.out), questions, kill_after)
        )
        proc.start()
        proc.join(300)
        return proc.exitcode

    def _exported(self) -> list[dict]:
        """``depthlens export`` of the store, as a user runs it."""
        from depthlens.cli.app import main

        target = self.root / "export.jsonl"
        sys.argv = ["depthlens", "export", str(self.out / SHARDS), "--out", str(target), "--overwrite"]
        with pytest.raises(SystemExit) as info:
            main()
        assert info.value.code in (0, None)
        return [json.loads(line) for line in target.read_text().splitlines()]

    # ---- what must hold after every step ---------------------------------------------------------------------

    @invariant()
    def readers_return_the_committed_records_or_refuse_by_name(self):
        if not hasattr(self, "out") or not self.out.exists():
            return
        bad = self.damaged | self.foreign
        if bad:
            with pytest.raises(StoreError) as info:
                list(iter_samples(self.out))
            assert any(name in str(info.value) for name in bad), str(info.value)
            return
        records = list(iter_samples(self.out))
        ids = [r["id"] for r in records]
        assert len(ids) == len(set(ids)) and set(ids) == self.committed  # complete and unique
        reference = self.world["reference"]
        assert _core(records) == {i: reference[i] for i in ids}  # equal to an uninterrupted run
        import pandas as pd

        assert sorted(pd.read_parquet(self.out / SHARDS)["id"]) == sorted(ids)  # plain readers agree
        assert _core(self._exported()) == _core(records)  # and so does an export


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_store_survives_any_sequence_of_faults(world, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    StoreStates.world = world
    runner = StoreStates.TestCase
    runner.settings = settings(
        max_examples=3,
        stateful_step_count=8,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    StoreStates.steps.clear()
    runner().runTest()
    print(dict(StoreStates.steps))
    # derandomized (the same sequences every run); a run that met no fault at all would prove nothing
    assert (
        StoreStates.steps["killed_write"] + StoreStates.steps["damage"] + StoreStates.steps["foreign_shard"]
    )
