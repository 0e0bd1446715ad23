"""Issue 59 item 8: a full disk (or a failed rename) at each write point says what happened in one sentence naming
the file, removes what it half wrote, and says truthfully what is kept — ``generate`` and ``score`` (nothing
committed: the store they created is removed and the line says so; some committed: those are kept, ``--resume``
goes on), ``regrade`` in place (not committed: the store as it was; committed: so), ``regrade --out`` (the copy
removed whole, never a Python list), ``export`` (nothing written), ``lens fit``'s final write (the lens as it was,
the fit in its checkpoint), and an interrupted ``thinkn --online`` saying what it kept.

Each write point is failed by a patched writer raising ENOSPC where the real one would; two are tried on a real
full disk, a small tmpfs mounted for the test (root only; unmounted after)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from depthlens.stores import layout
from depthlens.stores.files import manifest_path, write_error
from depthlens.stores.samples import SAMPLES, SHARDS
from tests.test_cli import run
from tests.test_hostile_doors import build_sample_stores


def _full(path: object) -> OSError:
    """ENOSPC as the OS raises it (on an fsync: naming no file)."""
    if path is None:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _failing(real: Callable[..., Any], at: int, fail: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, except that its ``at``-th call (1-based) runs ``fail`` instead."""
    calls = [0]

    def patched(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == at:
            return fail(*args, **kwargs)
        return real(*args, **kwargs)

    return patched


def _said(monkeypatch: Any, capsys: Any, *args: object) -> tuple[int, str]:
    code, out, err = run(monkeypatch, capsys, *args)
    text = " ".join((out + err).split())
    assert "Traceback" not in text and "[(" not in text, text  # one sentence, never a Python repr
    return code or 0, text


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and "lock" not in p.name}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    return build_sample_stores(tmp_path_factory.mktemp("full"))


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """The tiny chat model on disk, and a question file of 2 questions, for the CLI's writers."""
    from tests.conftest import save_chat_model

    root = tmp_path_factory.mktemp("chat")
    questions = root / "q.jsonl"
    questions.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": f"{i} + 1", "answer": i + 1}) + "\n" for i in range(2))
    )
    return save_chat_model(root / "model"), questions


def _generate(chat: tuple[Path, Path], out: Path, *extra: str) -> list[object]:
    model, questions = chat
    return [
        "generate", "--model", model, "--task", questions, "--out", out, "--pool", "2", "--batch-size", "1",
        "--max-new-tokens", "3", "--device", "cpu", *extra,
    ]  # fmt: skip


def _shard_full(monkeypatch: Any, at: int) -> None:
    """The ``at``-th shard a writer stages fails as a full disk would (``recover.write_staged``'s own error)."""
    from depthlens.stores import recover, shard_writer

    def full(store: Path, name: str, *_: Any) -> Any:
        raise write_error(store / name, _full(layout.staged(store, name)))

    monkeypatch.setattr(shard_writer, "write_staged", _failing(recover.write_staged, at, full))


def test_generate_that_committed_nothing_says_it_kept_nothing(chat, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _shard_full(monkeypatch, 1)
    code, text = _said(monkeypatch, capsys, *_generate(chat, out))
    assert code == 2 and not out.exists(), text
    assert (
        f"error: {out / SHARDS / 'part-000000.parquet'}: the disk is full; nothing is kept: no record had been "
        f"committed, and {out}, which this run created, was removed — free some space, then run the command again"
    ) in text


def test_generate_that_committed_a_shard_keeps_it_and_resume_finishes(chat, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _shard_full(monkeypatch, 2)
    code, text = _said(monkeypatch, capsys, *_generate(chat, out))
    assert code == 2, text
    assert (
        f"the disk is full; the 1 record(s) committed before are kept in {out / SHARDS} — free some space, then "
        "rerun the command with --resume"
    ) in text
    assert not list((out / SHARDS).glob(".*.tmp"))  # nothing half-written
    monkeypatch.undo()
    assert _said(monkeypatch, capsys, *_generate(chat, out, "--resume"))[0] == 0
    code, text = _said(monkeypatch, capsys, "check", out)
    assert code == 0 and "4 committed record(s)" in text, text


def test_score_whose_first_manifest_fails_removes_the_store_it_created(chat, tmp_path, monkeypatch, capsys):
    from depthlens.stores import files, recover

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "a", "prompt_ids": [4, 5], "completion_ids": [7, 8]}) + "\n")
    out = tmp_path / "scores"

    def full(path: Path, data: object) -> None:
        raise files.write_error(path, _full(path))

    monkeypatch.setattr(recover, "write_json", full)
    code, text = _said(monkeypatch, capsys, "score", "--model", chat[0], "--in", source, "--out", out)
    assert code == 2 and not out.exists(), text
    assert (
        f"{out / layout.MANIFEST}: the disk is full; nothing is kept" in text
        and f"{out}, which this run" in text
    )


def test_regrade_in_place_not_committed_leaves_the_store_as_it_was(stores, tmp_path, monkeypatch, capsys):
    out = tmp_path / "parquet"
    shutil.copytree(stores / "parquet", out)
    before = _files(out)
    _shard_full(monkeypatch, 2)
    code, text = _said(monkeypatch, capsys, "regrade", out)
    assert code == 2, text
    assert (
        f"{out / SHARDS / 'part-000005.parquet'}: the disk is full; the rewrite was not committed and its new shards "
        f"were removed: {out / SHARDS} is as it was — free some space, then run the command again"
    ) in text
    assert _files(out) == before and not list((out / SHARDS).glob(".*"))


def test_regrade_in_place_failing_after_its_commit_says_it_is_committed(
    stores, tmp_path, monkeypatch, capsys
):
    """The renames after the commit fail: the regrade stands (readers read it), and the line says so — not "the
    store is as it was"."""
    from depthlens.stores.samples import read_responses

    out = tmp_path / "parquet"
    shutil.copytree(stores / "parquet", out)

    def full(path: Path) -> None:
        raise _full(path)

    monkeypatch.setattr(layout, "fsync_dir", full)
    code, text = _said(monkeypatch, capsys, "regrade", out)
    monkeypatch.undo()
    assert code == 2 and f"the rewrite of {out / SHARDS} is committed" in text and "as it was" not in text, (
        text
    )
    assert all("answer_history" in r for _, r in read_responses(out))
    code, text = _said(monkeypatch, capsys, "check", out)
    assert code == 0 and "committed, not yet under its name" in text, text


def test_regrade_in_place_of_a_jsonl_store_commits_both_files_or_neither(
    stores, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "jsonl"
    shutil.copytree(stores / "jsonl", out)
    before = _files(out)

    def full(fd: int) -> None:
        raise _full(None)

    monkeypatch.setattr(
        os, "fsync", _failing(os.fsync, 2, full)
    )  # the responses staged; their manifest fails
    code, text = _said(monkeypatch, capsys, "regrade", out)
    monkeypatch.undo()
    assert code == 2, text
    assert (
        f"{manifest_path(out / SAMPLES)}: the disk is full; the regrade was not committed and its temporary files "
        f"were removed: {out} is as it was — free some space, then run regrade again"
    ) in text
    assert _files(out) == before and not list(out.glob(".*regrade-tmp"))


def test_regrade_out_whose_copy_fills_the_disk_removes_the_copy(stores, tmp_path, monkeypatch, capsys):
    source, copy = tmp_path / "parquet", tmp_path / "copy"
    shutil.copytree(stores / "parquet", source)
    before = _files(source)
    real = shutil.copy2

    def full(src: str, dst: str, **_: Any) -> None:
        Path(dst).write_bytes(b"")  # a file begun, as a real full disk leaves it
        raise _full(dst)

    monkeypatch.setattr(shutil, "copy2", _failing(real, 3, full))
    code, text = _said(monkeypatch, capsys, "regrade", source, "--out", copy)
    assert code == 2 and not copy.exists(), text
    assert (
        f": the disk is full; the copy {copy} was removed and {source} is as it was — free some space" in text
    )
    assert text.split("error: ")[1].startswith(str(copy)) and _files(source) == before


def test_regrade_out_failing_in_the_copy_removes_it(stores, tmp_path, monkeypatch, capsys):
    source, copy = tmp_path / "parquet", tmp_path / "copy"
    shutil.copytree(stores / "parquet", source)
    _shard_full(monkeypatch, 1)
    code, text = _said(monkeypatch, capsys, "regrade", source, "--out", copy)
    assert code == 2 and not copy.exists(), text
    assert f"the disk is full; the copy {copy} was removed and {source} is as it was" in text


@pytest.mark.parametrize("at", [1, 2])
def test_an_export_that_fills_the_disk_writes_nothing(stores, tmp_path, monkeypatch, capsys, at):
    target = tmp_path / "export" / "x.jsonl"
    target.parent.mkdir()

    def full(fd: int) -> None:
        raise _full(None)

    monkeypatch.setattr(os, "fsync", _failing(os.fsync, at, full))  # 1: the records, 2: their manifest
    code, text = _said(monkeypatch, capsys, "export", stores / "parquet" / SHARDS, "--out", target)
    monkeypatch.undo()
    named = target if at == 1 else manifest_path(target)
    assert (
        code == 2
        and (
            f"{named}: the disk is full; nothing was written (an export is written whole or not at all) — free some "
            "space, then run the export again"
        )
        in text
    ), text
    assert list(target.parent.iterdir()) == []  # no file, temporary file or lock left behind
    code, text = _said(monkeypatch, capsys, "export", stores / "parquet" / SHARDS, "--out", target)
    assert code == 0 and target.is_file(), text


def test_lens_fit_whose_final_write_fails_keeps_the_lens_before_and_its_checkpoint(
    tiny_llama, tmp_path, monkeypatch
):
    import dataclasses

    import torch

    from depthlens.config import LensFitConfig
    from depthlens.errors import StoreError
    from depthlens.readout.stream import TokenSequence
    from depthlens.studies import lens_fit

    gen = torch.Generator().manual_seed(0)
    seqs = [TokenSequence([1], torch.randint(3, 100, (30,), generator=gen).tolist()) for _ in range(6)]
    cfg = LensFitConfig(max_tokens=150, steps=2, checkpoint_every=1, batch_tokens=16, layers_per_step=1)
    out = tmp_path / "lens"
    lens_fit.fit_lens(tiny_llama, seqs, out, cfg)
    before = _files(out)
    real = lens_fit.save_lens

    def save(*args: Any, **kwargs: Any) -> Any:
        with monkeypatch.context() as patch:
            patch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(_full(None)))
            return real(*args, **kwargs)

    monkeypatch.setattr(lens_fit, "save_lens", save)
    with pytest.raises(StoreError) as info:
        lens_fit.fit_lens(tiny_llama, seqs, out, dataclasses.replace(cfg, steps=3))
    from depthlens.cli.flags import flag_line

    said = flag_line(info.value)  # as `depthlens lens fit` says it (the only front that fits a lens)
    assert said.startswith(
        f"{out / 'translators.safetensors'}: the disk is full; the lens was not written"
    ), said
    assert f"the fit is kept in {out / 'checkpoint.pt'}" in said and "--resume" in said
    assert {k: v for k, v in _files(out).items() if "checkpoint" not in k} == before  # the lens before, whole
    assert not list(out.glob(".*.tmp"))
    monkeypatch.undo()
    stamp = lens_fit.fit_lens(tiny_llama, seqs, out, dataclasses.replace(cfg, steps=3), resume=True)
    assert stamp["steps"] == 3 and not (out / "checkpoint.pt").exists()


def test_an_interrupted_online_run_says_what_it_kept(chat, tmp_path, monkeypatch, capsys):
    from depthlens.stores.jsonl import ResultWriter

    out = tmp_path / "online"
    real, written = ResultWriter.write, []

    def write(self: ResultWriter, record: dict[str, Any]) -> None:
        real(self, record)
        if self.out.name == SAMPLES:
            written.append(record["id"])
            if len(written) == 2:
                raise KeyboardInterrupt

    monkeypatch.setattr(ResultWriter, "write", write)
    model, questions = chat
    code, _, err = run(
        monkeypatch, capsys, "thinkn", "--online", "--model", model, "--task", questions, "--out", out,
        "--warmup", "2", "--max-n", "4", "--batch-size", "1", "--max-new-tokens", "3", "--prefix", "2",
        "--device", "cpu",
    )  # fmt: skip
    text = " ".join(err.split())
    assert code == 130, text
    assert f"interrupted: 2 finished record(s) kept in {out / SAMPLES}" in text, text
    assert "continue with: depthlens thinkn --online" in text and text.rstrip().endswith("--resume")
    assert "before any record was written" not in text


# ---- a real full disk: a small tmpfs ---------------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at ``tmp_path / "disk"``, unmounted after the test (skipped where mounting is not allowed)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)
        if os.path.ismount(disk):
            subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` so that ``leave`` bytes (about) stay free."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    filler = disk / "filler"
    filler.write_bytes(b"\0" * max(0, free - leave))
    return filler


def test_a_real_full_disk_during_an_export_and_a_regraded_copy(stores, tmpfs, monkeypatch, capsys):
    source = stores / "parquet"
    size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    filler = _fill(tmpfs, 4096)  # one page free: far less than the store
    assert size > 4 * 4096
    target = tmpfs / "x.jsonl"
    code, text = _said(monkeypatch, capsys, "export", source / SHARDS, "--out", target)
    assert code == 2 and f"{target}: the disk is full; nothing was written" in text, text
    code, text = _said(monkeypatch, capsys, "regrade", source, "--out", tmpfs / "copy")
    assert (
        code == 2 and f"the disk is full; the copy {tmpfs / 'copy'} was removed and {source} is as it" in text
    )
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler"]  # nothing half-written is left
    filler.unlink()  # space freed: the advice, followed
    assert _said(monkeypatch, capsys, "export", source / SHARDS, "--out", target)[0] == 0
    assert _said(monkeypatch, capsys, "regrade", source, "--out", tmpfs / "copy")[0] == 0
