"""Helpers of the stateful store tests (tests/test_store_states.py): the runs they write, a child that is killed
mid-write, the module's world (a tiny chat model saved for the children, an uninterrupted run, a store of another
run), and ``Readers``, the doors each state is read through besides ``check`` — ``export``, ``thinkn --from``'s
reader and the explorer."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

import pytest

from depthlens.config import GenerateRun, SamplingConfig, StoreSpec
from depthlens.errors import StoreError
from depthlens.evals.tasks import Question
from depthlens.stores.samples import SAMPLES, SHARDS, iter_samples, stored_format

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


class Readers:
    """The doors a state is read through besides ``check`` (the machine sets ``out``, ``root`` and ``world``)."""

    out: Path
    root: Path
    flipped: set[str]

    def _responses(self) -> Path:
        """What ``export`` is given: the shards' directory, or ``samples.jsonl``."""
        return self.out / (SHARDS if stored_format(self.out) == "parquet" else SAMPLES)

    def _exported(self) -> list[dict]:
        """``depthlens export`` of the store, as a user runs it."""
        from depthlens.cli.app import main

        target = self.root / "export.jsonl"
        sys.argv = ["depthlens", "export", str(self._responses()), "--out", str(target), "--overwrite"]
        with pytest.raises(SystemExit) as info:
            main()
        assert info.value.code in (0, None)
        return [json.loads(line) for line in target.read_text().splitlines()]

    def _files(self) -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in sorted(self.out.rglob("*")) if p.is_file()}

    def _refused_export(self) -> None:
        """``depthlens export`` of a store every reader refuses: exit 2, naming why, every file as it was."""
        from depthlens.cli.app import main

        before, target = self._files(), self.root / "refused.jsonl"
        sys.argv = ["depthlens", "export", str(self._responses()), "--out", str(target), "--overwrite"]
        with pytest.raises(SystemExit) as info:
            main()
        assert info.value.code == 2 and not target.exists()
        assert self._files() == before  # a refused command changes nothing

    def _explorer(self) -> tuple[list[str], list[str]]:
        """``depthlens view``'s reader: the ids it shows and its notices, every response opened."""
        from depthlens.view.store import open_store

        store = open_store(self.out)
        for index in range(len(store.records)):
            try:
                store.read(index)
            except (OSError, LookupError):  # an unreadable shard: its notice says so
                continue
        return list(store.by_id), list(store.notices)

    def _other_readers_refuse(self, names: set[str]) -> None:
        """``thinkn --from``'s reader refuses naming a damaged file, and the explorer says so in a notice."""
        from depthlens.config import DTRConfig
        from depthlens.studies.thinkn import load_pools

        with pytest.raises(StoreError) as info:
            load_pools(self.out, DTRConfig())
        assert any(name in str(info.value) for name in names), str(info.value)
        _, notices = self._explorer()
        assert any(any(name in n for name in names) for n in notices), (names, notices)

    def _other_readers_read(self, records: list[dict], notes: list[str]) -> None:
        """Where check's readers read: ``thinkn --from``'s reader votes on every usable record, and the explorer
        shows every committed record, its notices only about files ``check`` notes too (``notes``: a shard a
        killed writer left half-written, a shard a regrade replaced)."""
        from depthlens.config import DTRConfig
        from depthlens.studies.thinkn import load_pools

        pools, _ = load_pools(self.out, DTRConfig())
        assert sum(len(p) for p in pools.values()) == sum(r["status"] == "ok" for r in records)
        shown, notices = self._explorer()
        assert sorted(shown) == sorted(r["id"] for r in records), notices
        if not getattr(self, "flipped", set()):  # bytes no page CRC covers: only check's hash names them
            noted = [n for n in notices if any(note.startswith(n.split(": ")[0] + ": ") for note in notes)]
            assert notices == noted, (notices, notes)
