"""Scratch stores do not pile up (issue 59, item 9): a Python verb's temporary store holds its write lock while the
verb runs; a verb killed with -9 leaves it behind, and the next verb call removes it — never one whose verb still
runs, and never anything else in the temporary folder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import depthlens
from depthlens.api.scratch import PREFIX, remove_abandoned
from depthlens.stores.lock import LOCK, abandoned, holder
from tests.test_api import SMALL, TASK

ROOT = Path(__file__).resolve().parents[1]

# A verb that stops mid-run, its scratch store made and locked, and says so: then waits to be killed or ended.
HOLDS_A_SCRATCH_STORE = """
import sys, time
sys.path.insert(0, {root!r})
import depthlens
from depthlens.models.load import wrap
from depthlens.studies import generate as generation
from tests.conftest import CharTokenizer, tiny_model

def waits(*args, **kwargs):
    print("sampling", flush=True)
    time.sleep(600)

generation.generate_question = waits
lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
depthlens.generate(lm, {task!r}, pool=1, batch_size=1, progress=False, **{small!r})
"""


@pytest.fixture
def scratch_dir(tmp_path, monkeypatch):
    """Where tempfile makes the verbs' temporary stores during the test (this process's and its children's)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return tmp_path


def _verbs_mid_run(scratch_dir: Path, count: int) -> list[tuple[subprocess.Popen[str], Path]]:
    """Real processes each running ``depthlens.generate`` into a scratch store, stopped mid-run; their stores."""
    env = {**os.environ, "TMPDIR": str(scratch_dir), "PYTHONPATH": os.pathsep.join(sys.path)}
    script = HOLDS_A_SCRATCH_STORE.format(root=str(ROOT), task=TASK, small=SMALL)
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]  # started together: each imports torch
    for process in processes:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "sampling":
            process.kill()
            raise AssertionError(process.communicate(timeout=60)[1])
    stores = {holder(p).split()[1]: p for p in scratch_dir.glob(f"{PREFIX}*")}  # by the pid in its lock
    return [(process, stores[str(process.pid)]) for process in processes]


def test_a_store_left_by_a_killed_verb_goes_with_the_next_call(lm, scratch_dir):
    (killed, left), (running, live) = _verbs_mid_run(scratch_dir, 2)
    try:
        assert holder(left).startswith(f"pid {killed.pid} on {socket.gethostname()} (depthlens.generate)")
        killed.send_signal(signal.SIGKILL)
        killed.communicate(timeout=60)
        assert left.is_dir() and abandoned(left)  # no finally ran: the store stayed, its note too
        assert not abandoned(live)
        # Look-alikes: no lock; a lock beside a file that is not the store's; not a directory.
        (scratch_dir / f"{PREFIX}no-lock" / "store").mkdir(parents=True)
        other = scratch_dir / f"{PREFIX}with-more"
        other.mkdir()
        (other / LOCK).write_text(holder(left))  # a dead writer's note, but beside something else
        (other / "notes.txt").write_text("mine")
        (scratch_dir / f"{PREFIX}a-file").write_text("mine")
        foreign = {
            p: sorted(q.name for q in p.iterdir()) if p.is_dir() else None for p in scratch_dir.iterdir()
        }
        foreign = {p: v for p, v in foreign.items() if p not in (left, live)}

        table = depthlens.generate(lm, TASK, pool=1, batch_size=1, progress=False, **SMALL)

        assert table.num_rows == 2
        assert not left.exists()
        assert live.is_dir() and (live / LOCK).is_file()  # its verb still runs: left alone
        for path, names in foreign.items():
            assert path.exists() and (names is None or sorted(q.name for q in path.iterdir()) == names), path
    finally:
        running.terminate()  # SIGTERM: that verb removes its own store on the way out
        running.communicate(timeout=60)
        if killed.returncode is None:
            killed.kill()
            killed.communicate(timeout=60)
    assert not live.exists()


def test_only_a_writer_of_this_host_that_is_gone_makes_a_store_abandoned(tmp_path):
    store = tmp_path / f"{PREFIX}x"
    store.mkdir()
    assert not abandoned(store)  # no lock
    (store / LOCK).write_text("")
    assert not abandoned(store)  # released cleanly: an empty note
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(gone.stdout)
    (store / LOCK).write_text(f"pid {dead} on elsewhere.example (depthlens.generate)\n")
    assert not abandoned(store)  # another host's: its lock is not seen from here
    (store / LOCK).write_text(f"pid {os.getpid()} on {socket.gethostname()} (depthlens.generate)\n")
    assert not abandoned(store)  # that pid runs
    (store / LOCK).write_text(f"pid {dead} on {socket.gethostname()} (depthlens.generate)\n")
    assert abandoned(store)
    assert remove_abandoned(tmp_path) == [store] and not store.exists()


@pytest.fixture(scope="module")
def lm():
    from depthlens.models.load import wrap
    from tests.conftest import CharTokenizer, tiny_model

    return wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
