"""The Parquet store's commit (docs/reliability.md, "What a store guarantees"): names never reused, a lost or cut
shard recomputed and nothing else, shards of other runs refused, plain Parquet readers see exactly the committed
records, stores of the earlier layout read and resume, one writer at a time, readers see one committed state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from depthlens.config import GenerateRun, SamplingConfig, StoreSpec
from depthlens.errors import StoreError
from depthlens.evals.tasks import Question
from depthlens.stores import layout
from depthlens.stores.arrow import to_table
from depthlens.stores.parquet import iter_store, store_manifest
from depthlens.stores.samples import SHARDS, iter_samples
from depthlens.stores.shard_writer import ShardWriter, rewrite_store
from depthlens.studies.generate import generate

SRC = Path(__file__).parent.parent / "src"
QUESTIONS = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(3)]
SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=4, readout_tokens=None)
ROWS = [{"id": f"r{i}", "x": [float(i), 0.5], "n": i} for i in range(12)]


def _generate(lm, out, resume=False, store=None, batch_size=2):
    run = GenerateRun(
        StoreSpec(out, resume, format=store), pool=4, seed=3, sampling=SAMPLING, batch_size=batch_size
    )
    return generate(lm, run, QUESTIONS)


def _core(records):
    """What a response is, apart from the answer bookkeeping a regrade adds."""
    return {r["id"]: (r["token_ids"], r["divergence"], r["log_prob"]) for r in records}


def _names(store):
    return [s["file"] for s in json.loads((store / layout.MANIFEST).read_text())["shards"]]


def test_a_lost_and_a_cut_shard_are_recomputed_under_new_names(tiny_chat, tmp_path):
    out = tmp_path / "s"
    _generate(tiny_chat, out)
    reference = _core(iter_samples(out))
    shards = out / SHARDS
    before = _names(shards)
    assert len(before) == 6  # 3 questions × 2 batches
    lost, cut = shards / before[2], shards / before[4]
    lost.unlink()
    cut.write_bytes(cut.read_bytes()[:300])
    with pytest.raises(StoreError, match=rf"{before[2]}: a shard the manifest lists is missing; rerun"):
        list(iter_samples(out))
    report = _generate(tiny_chat, out, resume=True)
    assert (report.skipped, report.written) == (8, 4)  # exactly the two shards' records, nothing else
    after = _names(shards)
    assert after[:4] == [n for i, n in enumerate(before) if i not in (2, 4)]  # the others untouched
    assert len(set(after)) == len(after) and not set(after[4:]) & set(before)  # new names, never reused
    assert (shards / f".{before[4]}.damaged").is_file()  # the cut file set aside, not deleted
    assert _core(iter_samples(out)) == reference


def test_a_shard_of_another_run_or_an_unlisted_file_stops_resume_and_readers(tiny_chat, tmp_path):
    _generate(tiny_chat, tmp_path / "a")
    _generate(tiny_chat, tmp_path / "b", batch_size=4)  # the same seed, another batch size: another run
    a, b = tmp_path / "a" / SHARDS, tmp_path / "b" / SHARDS
    victim = _names(a)[1]
    (a / victim).write_bytes((b / _names(b)[0]).read_bytes())
    for attempt in (
        lambda: list(iter_samples(tmp_path / "a")),
        lambda: _generate(tiny_chat, tmp_path / "a", resume=True),
    ):
        with pytest.raises(
            StoreError, match=rf"{victim}: a shard of another run \(\w+\), not of this store's"
        ):
            attempt()
    (a / victim).unlink()
    (a / "part-000099.parquet").write_bytes((b / _names(b)[0]).read_bytes())
    with pytest.raises(
        StoreError, match=r"part-000099.parquet: a data file the manifest does not list \(of another"
    ):
        list(iter_samples(tmp_path / "a"))


def test_plain_parquet_readers_read_exactly_the_committed_records(tmp_path):
    """pandas and pyarrow read the directory, DuckDB and Polars their usual globs: the committed rows, never a
    shard in flight, one a regrade replaced, or the manifest."""
    import pandas as pd
    import pyarrow.dataset as ds

    out = tmp_path / "store"
    with ShardWriter(out, {"k": 1}, resume=False, shard_rows=4) as writer:
        for row in ROWS:
            writer.write(row)
    rewrite_store(out, store_manifest(out), lambda r: {**r, "n": r["n"] + 100})  # leaves .part-N.parquet.old
    (out / ".part-000099.parquet.tmp").write_bytes((out / _names(out)[0]).read_bytes())  # a shard in flight
    expected = sorted(r["n"] + 100 for r in ROWS)
    assert sorted(pd.read_parquet(out)["n"]) == expected
    assert sorted(ds.dataset(out).to_table().column("n").to_pylist()) == expected
    assert sorted(r["n"] for r in iter_store(out)) == expected
    duckdb = pytest.importorskip("duckdb")
    assert (
        sorted(x for (x,) in duckdb.sql(f"select n from read_parquet('{out}/*.parquet')").fetchall())
        == expected
    )
    assert sorted(x for (x,) in duckdb.sql(f"select n from read_parquet('{out}')").fetchall()) == expected
    polars = pytest.importorskip("polars")
    assert sorted(polars.read_parquet(f"{out}/*.parquet")["n"].to_list()) == expected


def _legacy_store(out: Path) -> None:
    """A store as depthlens wrote it before this layout: part-NNNNNN.parquet with the settings in their metadata
    and manifest.json beside them listing file and rows."""
    out.mkdir()
    settings = {"k": 1}
    meta = {layout.SETTINGS_KEY: json.dumps(settings).encode(), layout.FREE_KEY: b"[]"}
    shards = []
    for i in range(3):
        table = to_table(ROWS[4 * i : 4 * i + 4])
        pq.write_table(table.replace_schema_metadata(meta), out / f"part-{i:06d}.parquet", compression="zstd")
        shards.append({"file": f"part-{i:06d}.parquet", "rows": 4})
    (out / layout.LEGACY_MANIFEST).write_text(json.dumps({**settings, "shards": shards}))


def test_a_store_of_the_earlier_layout_reads_resumes_and_moves_to_this_one(tmp_path):
    out = tmp_path / "old"
    _legacy_store(out)
    assert [r["id"] for r in iter_store(out)] == [r["id"] for r in ROWS]
    (out / "part-000001.parquet").unlink()  # lost: its four records are computed again by the resume
    with ShardWriter(out, {"k": 1}, resume=True, shard_rows=4) as writer:
        assert writer.recomputed == ["part-000001.parquet"]
        for row in ROWS:
            if row["id"] not in writer.done:
                writer.write(row)
    assert not (out / layout.LEGACY_MANIFEST).exists() and (out / layout.MANIFEST).is_file()
    manifest = json.loads((out / layout.MANIFEST).read_text())
    assert [s["file"] for s in manifest["shards"]] == [
        "part-000000.parquet",
        "part-000002.parquet",
        "part-000003.parquet",
    ]
    assert all(len(s["sha256"]) == 64 and s["bytes"] > 0 for s in manifest["shards"])
    assert sorted(r["id"] for r in iter_store(out, verify=True)) == sorted(r["id"] for r in ROWS)
    import pandas as pd

    assert len(pd.read_parquet(out)) == len(ROWS)


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "store"
    with ShardWriter(out, {"k": 1}, resume=False) as writer:
        writer.write(ROWS[0])
    code = (
        "import sys, time; from pathlib import Path; from depthlens.stores.lock import store_lock\n"
        "with store_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(
            StoreError, match=rf"{out} is being written by another command \(pid {holder.pid} "
        ):
            ShardWriter(out, {"k": 1}, resume=True)
        with pytest.raises(StoreError, match=rf"pid {holder.pid} "):
            rewrite_store(out, store_manifest(out), lambda r: r)
        assert [r["id"] for r in iter_store(out)] == ["r0"]  # readers take no lock
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    with ShardWriter(out, {"k": 1}, resume=True) as writer:  # the lock went with its holder
        assert writer.done == {"r0"}


def test_readers_during_a_regrade_see_the_state_before_or_after_never_an_error(tmp_path, monkeypatch):
    from depthlens.stores import recover

    out = tmp_path / "store"
    with ShardWriter(out, {"k": 1}, resume=False, shard_rows=3) as writer:
        for row in ROWS:
            writer.write(row)
    seen = []
    real_write, real_fsync = recover.write_json, layout.fsync_dir

    def write_json(path, data):  # just before the commit: the state before
        seen.append(("before", sorted(r["n"] for r in iter_store(out))))
        real_write(path, data)

    def fsync_dir(path):  # after the commit, before the renames: the state after, read from hidden names
        if not any(tag == "after" for tag, _ in seen):
            seen.append(("after", sorted(r["n"] for r in iter_store(out))))
        real_fsync(path)

    monkeypatch.setattr(recover, "write_json", write_json)
    monkeypatch.setattr(layout, "fsync_dir", fsync_dir)
    rewrite_store(out, store_manifest(out), lambda r: {**r, "n": -r["n"]})
    assert seen == [("before", sorted(r["n"] for r in ROWS)), ("after", sorted(-r["n"] for r in ROWS))]


def test_a_reader_running_beside_a_writer_sees_only_whole_commits(tmp_path):
    import threading

    out = tmp_path / "store"
    writer = ShardWriter(out, {"k": 1}, resume=False, shard_rows=2)
    done = threading.Event()

    def write():
        for row in ROWS:
            writer.write(row)
            time.sleep(0.01)
        writer.close()
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    reads = []
    while not done.is_set():
        ids = [r["id"] for r in iter_store(out)]
        assert ids == [r["id"] for r in ROWS[: len(ids)]] and len(ids) % 2 == 0  # whole shards, in order
        reads.append(len(ids))
    thread.join()
    assert [r["id"] for r in iter_store(out)] == [r["id"] for r in ROWS] and reads


def test_a_reader_whose_manifest_is_overtaken_mid_listing_reads_the_newer_state(tmp_path, monkeypatch):
    """The race behind the test above failing at load 11-14 (issue 38's sweep): a reader reads the manifest, a writer
    commits the next shard (manifest renamed in first, then the shard's visible name), the reader lists the directory
    and finds a shard its manifest does not hold. ``shard_checks.snapshot`` reads the manifest again and lists under the
    newer one; a file no manifest lists (another run's) is still refused."""
    import shutil

    from depthlens.stores import parquet

    out = tmp_path / "store"
    writer = ShardWriter(out, {"k": 1}, resume=False, shard_rows=2)
    for row in ROWS[:4]:
        writer.write(row)
    writer.close()
    older = {**store_manifest(out)}
    older["shards"] = older["shards"][:1]  # the manifest as it was before the second commit
    reads = iter([older])
    real = parquet.store_manifest
    monkeypatch.setattr(parquet, "store_manifest", lambda p: next(reads, None) or real(p))
    assert [r["id"] for r in iter_store(out)] == [r["id"] for r in ROWS[:4]]
    other = tmp_path / "other"
    theirs = ShardWriter(other, {"k": 1}, resume=False, shard_rows=2)
    for row in ROWS[:2]:
        theirs.write(row)
    theirs.close()
    shutil.copy(other / store_manifest(other)["shards"][0]["file"], out / "part-000007.parquet")
    with pytest.raises(StoreError, match=r"part-000007.parquet: a data file the manifest does not list"):
        list(iter_store(out))


def test_summaries_record_their_store_state_and_overwrite_removes_them(tiny_chat, tmp_path):
    from depthlens.config import VotingConfig
    from depthlens.studies.report import thinkn_summary
    from depthlens.studies.stored import load_store
    from depthlens.studies.thinkn import summarise, summary_files

    out = tmp_path / "s"
    generate(
        tiny_chat, GenerateRun(StoreSpec(out), pool=4, seed=3, sampling=SAMPLING, batch_size=2), QUESTIONS[:2]
    )
    summarise(out, VotingConfig(n=2, trials=2, rank_prefix=2))
    assert thinkn_summary(load_store(out), None).get("stale") is None
    generate(
        tiny_chat,
        GenerateRun(StoreSpec(out, resume=True), pool=4, seed=3, sampling=SAMPLING, batch_size=2),
        QUESTIONS,
    )
    stale = thinkn_summary(load_store(out), None)["stale"]
    assert "not a summary of the store as it is now: it was computed from state" in stale
    generate(
        tiny_chat,
        GenerateRun(StoreSpec(out, overwrite=True), pool=4, seed=3, sampling=SAMPLING, batch_size=2),
        QUESTIONS,
    )
    assert summary_files(out) == [] and not list(out.glob("thinkn-*"))


def test_a_jsonl_line_damaged_in_the_middle_is_set_aside_and_recomputed(tiny_chat, tmp_path):
    out = tmp_path / "s"
    _generate(tiny_chat, out, store="jsonl")
    reference = _core(iter_samples(out))
    lines = (out / "samples.jsonl").read_text().splitlines(keepends=True)
    lines[3] = lines[3][:40] + "\n"
    (out / "samples.jsonl").write_text("".join(lines))
    with pytest.raises(StoreError, match=r"samples.jsonl:4: not a JSON record .* it sets that line aside"):
        list(iter_samples(out))
    report = _generate(tiny_chat, out, store="jsonl", resume=True)
    assert report.written == 1 and (out / "samples.jsonl.damaged").read_text() == lines[3]
    assert _core(iter_samples(out)) == reference
