"""Issue 51, the messages: each error names the right file and the right fault, and its advice, followed here,
mends the store (as tests/test_store_trust.py does for issue 41)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from depthlens.config import GenerateRun, SamplingConfig, StoreSpec
from depthlens.evals.tasks import Question
from depthlens.stores import layout
from depthlens.stores.samples import SAMPLES, SHARDS
from tests.test_cli import run

QUESTIONS = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]
SAMPLING = SamplingConfig(max_new_tokens=4, readout_tokens=None)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from depthlens.models.load import wrap
    from depthlens.studies.generate import generate
    from tests.conftest import CharTokenizer, tiny_model

    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    root = tmp_path_factory.mktemp("messages")
    for fmt in ("parquet", "jsonl"):
        run_ = GenerateRun(StoreSpec(root / fmt, format=fmt), pool=2, seed=5, sampling=SAMPLING, batch_size=1)
        generate(lm, run_, QUESTIONS)
    return root


def _copy(made, tmp_path, fmt):
    shutil.copytree(made / fmt, tmp_path / fmt)
    return tmp_path / fmt


def _said(monkeypatch, capsys, *args):
    code, out, err = run(monkeypatch, capsys, *args)
    return code, " ".join((out + err).split())


def test_check_of_a_shard_file_names_its_store_and_checking_that_says_ok(made, tmp_path, monkeypatch, capsys):
    out = _copy(made, tmp_path, "parquet")
    shard = sorted((out / SHARDS).glob("part-*.parquet"))[0]
    code, text = _said(monkeypatch, capsys, "check", shard)
    assert (
        code == 2
        and f"a shard of a Parquet store, not a store; check the store it belongs to: `depthlens check {out / SHARDS}`"
        in text
    )
    assert _said(monkeypatch, capsys, "check", out / SHARDS)[0] == 0  # the advice, followed


def test_export_of_a_run_directory_names_its_responses(made, tmp_path, monkeypatch, capsys):
    out = _copy(made, tmp_path, "parquet")
    code, text = _said(monkeypatch, capsys, "export", out, "--out", tmp_path / "x.jsonl")
    assert code == 2 and f"{out}: a sample store's directory; give its responses, {out / SHARDS}" in text
    assert "not a depthlens Parquet store" not in text
    assert not list(tmp_path.glob(".x.jsonl*"))  # no lock left beside the --out that was never written
    assert _said(monkeypatch, capsys, "export", out / SHARDS, "--out", tmp_path / "x.jsonl")[0] == 0


def test_a_shard_list_cut_from_the_manifest_names_the_manifest_not_the_good_shard(
    made, tmp_path, monkeypatch, capsys
):
    out = _copy(made, tmp_path, "parquet")
    meta = out / SHARDS / layout.MANIFEST
    original = meta.read_text()
    manifest = json.loads(original)
    dropped = manifest["shards"].pop()
    meta.write_text(json.dumps(manifest))
    code, text = _said(monkeypatch, capsys, "check", out)
    assert code == 1 and f"{meta}: does not list {out / SHARDS / dropped['file']}" in text
    assert "the manifest's shard list was edited" in text and "move it out" not in text
    assert "restore the manifest from a copy of the store" in text
    code, text = _said(monkeypatch, capsys, "thinkn", "--from", out, "--n", "2")
    assert code == 2 and "move it out" not in text and f"{meta}: does not list" in text
    meta.write_text(original)  # the advice, followed
    assert _said(monkeypatch, capsys, "check", out)[0] == 0


def test_a_negative_count_in_the_manifest_names_the_manifest(made, tmp_path, monkeypatch, capsys):
    out = _copy(made, tmp_path, "parquet")
    meta = out / SHARDS / layout.MANIFEST
    original = meta.read_text()
    manifest = json.loads(original)
    manifest["shards"][0]["rows"] = -2
    meta.write_text(json.dumps(manifest))
    code, text = _said(monkeypatch, capsys, "check", out)
    assert (
        code == 1
        and f"{meta}: the entry of {manifest['shards'][0]['file']} holds rows -2, not a count" in text
    )
    assert "-2 record" not in text
    meta.write_text(original)
    assert _said(monkeypatch, capsys, "check", out)[0] == 0


def test_a_page_checksum_failure_is_changed_for_check_and_check_quick(made, tmp_path, monkeypatch, capsys):
    out = _copy(made, tmp_path, "parquet")
    shards = sorted((out / SHARDS).glob("part-*.parquet"))
    shard = shards[1]
    data = bytearray(shard.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 8):
        data[i] ^= 0xFF
    shard.write_bytes(bytes(data))
    for quick in ((), ("--quick",)):
        code, text = _said(monkeypatch, capsys, "check", out, *quick)
        assert code == 1 and f"changed: {shard}" in text and f"cut: {shard}" not in text, (quick, text)
        assert f"{len(shards) - 1} shard(s)" in text  # the same count either way: the whole ones


def test_a_dtr_setting_out_of_range_in_the_manifest_is_named_as_its_field(
    made, tmp_path, monkeypatch, capsys
):
    out = _copy(made, tmp_path, "jsonl")
    meta = out / f"{SAMPLES}.manifest.json"
    original = meta.read_text()
    meta.write_text(original.replace('"g": 0.5', '"g": NaN'))
    code, text = _said(monkeypatch, capsys, "thinkn", "--from", out, "--n", "2")
    assert code == 2 and "dtr.g nan (must be a finite number ≥ 0)" in text and "--g" not in text, text
    meta.write_text(original)
    assert _said(monkeypatch, capsys, "check", out)[0] == 0


def test_a_writer_killed_with_9_is_not_reported_as_writing(made, tmp_path, monkeypatch, capsys):
    out = _copy(made, tmp_path, "jsonl")
    code = (
        "import sys, time; from pathlib import Path; from depthlens.stores.lock import store_lock\n"
        f"with store_lock(Path({str(out / SAMPLES)!r})):\n    print('held', flush=True); time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    _, live = _said(monkeypatch, capsys, "check", out)
    assert f"being written now by pid {holder.pid}" in live
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(10)
    holder.stdout.close()
    assert str(holder.pid) in (out / f".{SAMPLES}.lock").read_text()  # the dead writer's note is still there
    code, text = _said(monkeypatch, capsys, "check", out)
    assert code == 0 and "being written" not in text


def test_an_export_into_another_run_names_that_run_not_the_store_exported(
    made, tmp_path, monkeypatch, capsys
):
    """`--out` where another sample store keeps its responses: the refusal names that store (it named the store
    being exported); followed (the export written outside it), the export is written and the other run untouched."""
    parquet, jsonl = _copy(made, tmp_path, "parquet"), _copy(made, tmp_path, "jsonl")
    before = (jsonl / SAMPLES).read_bytes()
    code, text = _said(monkeypatch, capsys, "export", parquet / SHARDS, "--out", jsonl / SAMPLES)
    assert code == 2 and f"where the sample store {jsonl} keeps its responses" in text, text
    assert str(parquet) not in text and (jsonl / SAMPLES).read_bytes() == before
    code, text = _said(monkeypatch, capsys, "export", parquet / SHARDS, "--out", tmp_path / "x.jsonl")
    assert code == 0 and (tmp_path / "x.jsonl").is_file(), text
    code, text = _said(monkeypatch, capsys, "correlate", jsonl, parquet, "--out", parquet / SAMPLES)
    assert code == 2 and f"where the sample store {parquet} keeps its responses" in text, text
    assert "write the tables and figures outside it" in text and not (parquet / SAMPLES).exists()


def test_a_run_whose_shards_lost_their_manifest_is_named_damaged_not_missing(
    made, tmp_path, monkeypatch, capsys
):
    """`correlate` / `report` said "no sample store under RUN (looked for samples.jsonl …)" of a Parquet store whose
    manifest was deleted; they name the shards and the manifest, and restoring it (the advice) finds the store."""
    from depthlens.studies.report import find_stores

    out = _copy(made, tmp_path, "parquet")
    meta = out / SHARDS / layout.MANIFEST
    kept = meta.read_bytes()
    meta.unlink()
    code, text = _said(monkeypatch, capsys, "correlate", out, "--out", tmp_path / "c")
    assert code == 2 and f"{meta}: missing, and 4 shard(s) are without it" in text, text
    assert "restore the manifest from a copy of the store" in text and "no sample store" not in text
    meta.write_bytes(kept)
    assert find_stores(out) == [out]
