"""A sample store driven through random sequences of what happens to stores — writes, kill -9 mid-write (in a
subprocess, ``DEPTHLENS_FAULT_KILL_AFTER``), resumes, regrades (also killed), exports, a lost shard, a cut shard,
bytes flipped in place, a shard of another run or a copy of one of its own, an edited manifest, a record edited
against itself, a shard deleted with its manifest entry, a lock left by a killed writer — with, after every
step, every reader either returning exactly the committed records (unique, each equal to an uninterrupted run's)
or refusing naming the damaged file (the manifest, where it is the fault); ``depthlens check`` listing whatever a
reader refuses (and saying ok only where every reader reads: every reader — the studies' reader, ``export``,
``thinkn --from``'s reader and the explorer's — agrees with ``check``), and never a writer that is not running; a
refused ``export`` leaving every file as it was;
and ``--resume`` always bringing back everything computed. Bounded in ``make test`` (3 sequences of up to 8 steps);
a soak: ``DEPTHLENS_SOAK_EXAMPLES=50 DEPTHLENS_SOAK_STEPS=20 pytest tests/test_store_states.py -s`` (prints the
steps and states explored)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections import Counter
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from depthlens.errors import StoreError
from depthlens.stores import layout
from depthlens.stores.samples import SHARDS, iter_samples, read_responses
from tests.store_states import BATCH, POOL, QUESTIONS, Readers, _core, _killed_child, _run, world

__all__ = ["world"]  # the module's fixture, from tests/store_states.py


class StoreStates(Readers, RuleBasedStateMachine):
    world: ClassVar[dict] = {}
    steps: ClassVar[Counter[str]] = (
        Counter()
    )  # what the sequences did, for the test to check its own coverage
    states: ClassVar[set] = set()  # (committed ids, damaged files, manifest edited) seen after a step

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
        self.flipped: set[str] = (
            set()
        )  # bytes changed in place: readers refuse by page CRC (or read them equal)
        self.edited: str | None = None  # the manifest as it was before an edit: readers refuse naming it
        self.inconsistent: set[str] = set()  # a record edited against itself: readers refuse naming the shard
        self.dropped = False  # a shard deleted with its manifest entry: readers refuse naming the manifest
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

    @precondition(lambda self: not (self.foreign or self.inconsistent) and self.edited is None)
    @rule(questions=st.integers(1, 3))
    def write(self, questions):
        """generate (or --resume) with the first ``questions`` questions, to the end."""
        self.steps["write"] += 1
        from depthlens.studies.generate import generate

        questions = max(questions, self.questions)  # the question list may only grow
        resume = self.out.exists()
        expected = self._expected_after(questions, None)
        generate(self.world["lm"], _run(self.out, resume=resume), QUESTIONS[:questions])
        self.questions, self.committed, self.damaged, self.flipped = questions, expected, set(), set()
        self.dropped = False  # the resume computes the dropped shard's records again and commits a new count

    @precondition(
        lambda self: (
            not (self.foreign or self.flipped or self.inconsistent or self.dropped)
            and self.edited is None
            and self.out.exists()
        )
    )
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

    @precondition(
        lambda self: (
            self.committed
            and not (self.damaged or self.foreign or self.flipped or self.inconsistent or self.dropped)
            and self.edited is None
        )
    )
    @rule(killed=st.booleans(), kill_after=st.integers(0, 2))
    def regrade(self, killed, kill_after):
        self.steps["regrade"] += 1
        from depthlens.studies.regrade import regrade_store

        if killed:
            self._child("regrade", self.questions, kill_after)  # before its commit: the store stays as it was
        else:
            regrade_store(self.out)

    @precondition(
        lambda self: self.committed and not (self.foreign or self.inconsistent) and self.edited is None
    )
    @rule(which=st.integers(0, 10), how=st.sampled_from(["lost", "cut", "flipped"]))
    def damage(self, which, how):
        """A committed shard lost, cut short, or with bytes changed in place (same size)."""
        self.steps["damage"] += 1
        shards = json.loads((self.out / SHARDS / layout.MANIFEST).read_text())["shards"]
        bad = self.damaged | self.flipped | self.inconsistent
        present = [s for s in shards if (self.out / SHARDS / s["file"]).is_file() and s["file"] not in bad]
        if not present:
            return
        shard = present[which % len(present)]
        path = self.out / SHARDS / shard["file"]
        event(f"shard {how}")
        self.steps[f"shard {how}"] += 1
        if how == "flipped":
            data = bytearray(path.read_bytes())
            for i in range(len(data) // 3, len(data) // 3 + 8):
                data[i] ^= 0xFF
            path.write_bytes(bytes(data))
            self.flipped.add(shard["file"])  # its ids stay committed: a resume computes them again
            return
        if how == "cut":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        else:
            path.unlink()
        self.damaged.add(shard["file"])
        self.committed -= set(shard["ids"])  # until a resume computes them again

    @precondition(
        lambda self: (
            self.committed
            and not (self.foreign or self.damaged or self.flipped or self.inconsistent or self.dropped)
            and self.edited is None
        )
    )
    @rule(key=st.sampled_from(["pool", "dtr.g", "readout.divergence"]))
    def edit_manifest(self, key):
        """The manifest edited outside depthlens: readers must name it, not the shards, as the fault."""
        self.steps["edit_manifest"] += 1
        meta = self.out / SHARDS / layout.MANIFEST
        self.edited = meta.read_text()
        manifest = json.loads(self.edited)
        head, _, tail = key.partition(".")
        if tail:
            manifest[head][tail] = {"g": 0.77, "divergence": "kl"}[tail]
        else:
            manifest[head] = 9
        meta.write_text(json.dumps(manifest))

    @precondition(lambda self: self.edited is not None)
    @rule()
    def mend_the_manifest(self):
        """The remedy: the manifest's values put back (here, from a copy)."""
        self.steps["mend_the_manifest"] += 1
        (self.out / SHARDS / layout.MANIFEST).write_text(self.edited)
        self.edited = None

    @precondition(
        lambda self: (
            self.out.exists()
            and not (self.foreign or self.inconsistent or self.dropped)
            and self.edited is None
        )
    )
    @rule(which=st.integers(0, 10), listed=st.booleans(), own=st.booleans())
    def foreign_shard(self, which, listed, own):
        """A shard of another run (or, ``own``, a copy of one of this store's: its records twice) copied in, over
        a listed name or under a name of its own."""
        self.steps["foreign_shard" if not own else "own_shard_copied"] += 1
        source = self.out / SHARDS if own else self.world["other"]
        others = sorted(source.glob("part-*.parquet")) or sorted(self.world["other"].glob("part-*.parquet"))
        shards = json.loads((self.out / SHARDS / layout.MANIFEST).read_text())["shards"]
        names = [s["file"] for s in shards if s["file"] not in self.damaged]
        name = names[which % len(names)] if listed and names else "part-000777.parquet"
        copied = others[which % len(others)]
        if copied.name == name:  # a shard over itself changes nothing: copy it under a name of its own
            name = "part-000777.parquet"
        self.saved = (
            name,
            (self.out / SHARDS / name).read_bytes() if (self.out / SHARDS / name).is_file() else None,
        )
        shutil.copy(copied, self.out / SHARDS / name)
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

    def _whole_shards(self) -> list[dict]:
        shards = json.loads((self.out / SHARDS / layout.MANIFEST).read_text())["shards"]
        bad = self.damaged | self.flipped | self.inconsistent | self.foreign
        return [s for s in shards if (self.out / SHARDS / s["file"]).is_file() and s["file"] not in bad]

    @precondition(lambda self: self.committed and not (self.foreign or self.dropped) and self.edited is None)
    @rule(which=st.integers(0, 10))
    def edit_record(self, which):
        """A record's values edited against each other (token_count one more than its tokens), checksums and
        hash made to match: only the one record validation sees it."""
        shards = self._whole_shards()
        if not shards:
            return
        self.steps["edit_record"] += 1
        shard = shards[which % len(shards)]
        path = self.out / SHARDS / shard["file"]
        table = pq.read_table(path)
        i = table.column_names.index("token_count")
        counts = table.column("token_count").to_pylist()
        counts[0] += 1
        table = table.set_column(i, "token_count", pa.array(counts, type=table.schema.field(i).type))
        data = layout.encode(table, dict(table.schema.metadata))
        path.write_bytes(data)
        meta = self.out / SHARDS / layout.MANIFEST
        manifest = json.loads(meta.read_text())
        for entry in manifest["shards"]:
            if entry["file"] == shard["file"]:
                entry.update(bytes=len(data), sha256=layout.entry(shard["file"], table, data)["sha256"])
        meta.write_text(json.dumps(manifest))
        self.inconsistent.add(shard["file"])

    @precondition(lambda self: bool(self.inconsistent))
    @rule()
    def follow_the_record_remedy(self):
        """'move that shard out of the store and rerun the command that wrote it with --resume'."""
        self.steps["follow_the_record_remedy"] += 1
        for name in self.inconsistent:
            shard = next(
                s
                for s in json.loads((self.out / SHARDS / layout.MANIFEST).read_text())["shards"]
                if s["file"] == name
            )
            (self.out / SHARDS / name).replace(self.root / f"moved-{self.out.name}-{name}")
            self.damaged.add(name)
            self.committed -= set(shard["ids"])
        self.inconsistent = set()
        self.write(self.questions)

    @precondition(
        lambda self: (
            self.committed and not (self.foreign or self.inconsistent or self.dropped) and self.edited is None
        )
    )
    @rule(which=st.integers(0, 10))
    def drop_with_entry(self, which):
        """A shard deleted together with its manifest entry (the store's count of records left as committed)."""
        shards = self._whole_shards()
        if not shards:
            return
        self.steps["drop_with_entry"] += 1
        shard = shards[which % len(shards)]
        meta = self.out / SHARDS / layout.MANIFEST
        manifest = json.loads(meta.read_text())
        manifest["shards"] = [s for s in manifest["shards"] if s["file"] != shard["file"]]
        meta.write_text(json.dumps(manifest))
        (self.out / SHARDS / shard["file"]).unlink()
        self.committed -= set(shard["ids"])
        self.dropped = True

    @precondition(lambda self: self.out.exists() and not self._lock_text())
    @rule(pid=st.integers(10_000_000, 20_000_000))
    def stale_lock(self, pid):
        """A lock file left by a writer killed with -9: its text names a process that holds nothing."""
        self.steps["stale_lock"] += 1
        lock = self.out / SHARDS / "_depthlens.lock"
        if lock.parent.is_dir():
            lock.write_text(f"pid {pid} (depthlens generate --out {self.out})\n")

    def _lock_text(self) -> str:
        lock = self.out / SHARDS / "_depthlens.lock"
        return lock.read_text().strip() if lock.is_file() else ""

    def _child(self, kind: str, questions: int, kill_after: int) -> int | None:
        proc = self.world["ctx"].Process(
            target=_killed_child, args=(kind, str(self.world["model"]), str(self.out), questions, kill_after)
        )
        proc.start()
        proc.join(300)
        return proc.exitcode

    # ---- what must hold after every step ---------------------------------------------------------------------

    @invariant()
    def readers_return_the_committed_records_or_refuse_by_name(self):
        if not hasattr(self, "out") or not self.out.exists():
            return
        from depthlens.stores.check import check

        reports = check(self.out)
        problems = [p for report in reports for p in report.problems]
        notes = [n for report in reports for n in report.notes]
        assert not any("being written now" in n for n in notes), notes  # no writer runs between steps
        self.states.add(
            (
                len(self.committed),
                frozenset(self.damaged | self.foreign | self.flipped),
                self.edited is not None,
            )
        )
        bad = self.damaged | self.foreign | self.inconsistent | ({layout.MANIFEST} if self.dropped else set())
        names = bad | self.flipped | ({layout.MANIFEST} if self.edited is not None else set())
        try:
            records = list(iter_samples(self.out))
            # every reader agrees with check: the studies' reader (one record validation) too
            records = [r for _, r in read_responses(self.out)]
        except StoreError as exc:
            assert any(name in str(exc) for name in names), str(exc)  # refused by name
            if self.edited is not None:
                assert layout.MANIFEST in str(exc) and "move it out" not in str(exc), str(exc)
            assert problems, f"a reader refuses ({exc}) and check lists nothing"
            assert any(any(name in str(p.path) for name in names) for p in problems), problems
            self._refused_export()
            self._other_readers_refuse(names)
            return
        assert not bad and self.edited is None, f"read despite {bad or 'an edited manifest'}"
        ids = [r["id"] for r in records]
        assert len(ids) == len(set(ids)) and set(ids) == self.committed  # complete and unique
        reference = self.world["reference"]
        assert _core(records) == {i: reference[i] for i in ids}  # equal to an uninterrupted run
        self._other_readers_read(records, notes)
        if self.flipped:  # changed bytes no page CRC covers: read equal, and check names them by hash
            assert problems
            return
        assert not problems, problems  # check says ok where every reader reads
        import pandas as pd

        assert sorted(pd.read_parquet(self.out / SHARDS)["id"]) == sorted(ids)  # plain readers agree
        assert _core(self._exported()) == _core(records)  # and so does an export


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_store_survives_any_sequence_of_faults(world, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    StoreStates.world = world
    runner = StoreStates.TestCase
    runner.settings = settings(
        max_examples=int(os.environ.get("DEPTHLENS_SOAK_EXAMPLES", "3")),  # the soak: docs/reliability.md
        stateful_step_count=int(os.environ.get("DEPTHLENS_SOAK_STEPS", "8")),
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    StoreStates.steps.clear()
    StoreStates.states.clear()
    runner().runTest()
    print(dict(StoreStates.steps), f"{len(StoreStates.states)} distinct states")
    # derandomized (the same sequences every run); a run that met no fault at all would prove nothing
    assert (
        StoreStates.steps["killed_write"] + StoreStates.steps["damage"] + StoreStates.steps["foreign_shard"]
    )
