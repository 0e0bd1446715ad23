"""Issue 51, the messages: each error names the right file and the right fault, and its advice, followed here,
mends the store (as tests/test_store_trust.py does for issue 41)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pyarrow.parquet as pq
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
    # inside the largest column chunk's pages (a fixed share of the file can land in the footer or the page index,
    # whose bytes no page checksum covers: the footer grows with the settings the store records)
    chunks = pq.ParquetFile(shard).metadata.row_group(0)
    chunk = max((chunks.column(c) for c in range(chunks.num_columns)), key=lambda c: c.total_compressed_size)
    middle = (chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size // 2
    for i in range(middle, middle + 8):
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


# ---- issue 59: messages keep the user's words -----------------------------------------------------------------


def test_an_unreadable_shard_whose_checksum_matches_is_not_said_to_have_changed(
    made, tmp_path, monkeypatch, capsys
):
    """A shard whose footer is cut and whose entry was updated to match (size and sha256): its bytes are the ones
    committed, so `check` does not say its content changed since — it says what it finds (`--quick`: what the size
    alone can tell)."""
    import hashlib

    out = _copy(made, tmp_path, "parquet")
    shard = sorted((out / SHARDS).glob("part-*.parquet"))[0]
    data = shard.read_bytes()[:-12]  # the footer's length and magic cut off
    shard.write_bytes(data)
    meta = out / SHARDS / layout.MANIFEST
    manifest = json.loads(meta.read_text())
    manifest["shards"][0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    meta.write_text(json.dumps(manifest))
    code, text = _said(monkeypatch, capsys, "check", out)
    assert code == 1 and "not a readable Parquet shard" in text, text
    assert "its bytes are the ones its manifest entry commits (size and sha256 match)" in text
    assert "changed since it was committed" not in text
    code, text = _said(monkeypatch, capsys, "check", "--quick", out)
    assert code == 1 and "of the committed size (`check` without --quick compares its sha256 too)" in text, (
        text
    )


@pytest.mark.parametrize("twice", ["a shard listed twice", "an id listed under two shards"])
def test_check_never_sends_the_user_to_check(made, tmp_path, monkeypatch, capsys, twice):
    """The readers' refusals end with "`depthlens check …` lists every problem"; `check` gives each remedy without
    pointing at itself."""
    out = _copy(made, tmp_path, "parquet")
    meta = out / SHARDS / layout.MANIFEST
    manifest = json.loads(meta.read_text())
    if twice == "a shard listed twice":
        manifest["shards"].append(dict(manifest["shards"][0]))
    else:
        manifest["shards"][1]["ids"].append(manifest["shards"][0]["ids"][0])
    meta.write_text(json.dumps(manifest))
    code, text = _said(monkeypatch, capsys, "check", out)
    assert code == 1 and "restore the manifest from a copy of the store" in text, text
    assert "lists the shard twice" in text if twice == "a shard listed twice" else "under part-000000" in text
    assert "`depthlens check" not in text, text
    # the same for a shard the readers send to check: cut, its remedy given without the pointer
    shutil.rmtree(out)
    out = _copy(made, tmp_path, "parquet")
    shard = sorted((out / SHARDS).glob("part-*.parquet"))[0]
    shard.write_bytes(shard.read_bytes()[:200])
    code, text = _said(monkeypatch, capsys, "report", out)
    assert code == 2 and f"(`depthlens check {out / SHARDS}` lists every problem)" in text, text
    code, text = _said(monkeypatch, capsys, "check", out)
    assert code == 1 and "--resume: it sets this file aside" in text and "`depthlens check" not in text, text


@pytest.mark.parametrize(
    ("path", "query", "said"),
    [
        ("/api/questions", {"order": "bogus"}, "order=bogus: use one of asc, desc"),
        ("/api/questions", {"sort": "bogus"}, "sort=bogus: use one of id, agreement, responses, accuracy"),
        ("/api/records", {"sort": "bogus"}, "sort=bogus: use one of store, "),
        ("/api/records", {"order": "bogus"}, "order=bogus: use one of asc, desc"),
    ],
)
def test_the_explorer_refuses_an_unknown_order_or_sort(made, path, query, said):
    TestClient = pytest.importorskip(
        "starlette.testclient", reason="the view extra is not installed"
    ).TestClient
    from depthlens.view.app import Explorer, make_app
    from depthlens.view.store import open_store

    api = TestClient(make_app(Explorer.of(open_store(made / "parquet"))))
    answer = api.get(path, params=query)
    assert answer.status_code == 400 and answer.json()["error"].startswith(said), answer.json()
    if path == "/api/records" and "sort" in query:  # the choices are the records' fields
        assert "dtr" in answer.json()["error"] and api.get(path, params={"sort": "dtr"}).status_code == 200


@pytest.mark.parametrize("value", ["topk:-1", "topk::abc:", "topk:[bold]x[/bold]", "topk:abc"])
def test_the_cli_echoes_a_value_as_typed(monkeypatch, capsys, tmp_path, value):
    """No emoji codes (`:-1:` is not 👎) and no markup (`[bold]` stays `[bold]`) in what echoes input."""
    code, _, err = run(monkeypatch, capsys, "generate", "--settle", value, "--out", tmp_path / "s")
    assert code == 2 and f"error: --settle {value}: must be jsd or topk:K with K ≥ 1" in err, err
    assert not (tmp_path / "s").exists()


def test_a_warning_echoes_a_path_as_typed(monkeypatch, capsys, tmp_path):
    """A warning line echoing a path holding markup and an emoji code keeps both as typed."""
    from depthlens.cli.app import warn

    warn(f"{tmp_path / '[bold]x:-1:.jsonl'} has no records")
    assert f"warning: {tmp_path / '[bold]x:-1:.jsonl'} has no records" in capsys.readouterr().err


def test_settle_topk_past_the_most_a_pool_keeps_is_named_as_settle(monkeypatch, capsys, tmp_path):
    code, _, err = run(monkeypatch, capsys, "generate", "--settle", "topk:101", "--out", tmp_path / "s")
    assert code == 2 and "error: --settle topk:101: K must be at most 100 for a sampled pool" in err, err
    assert "--layer-top-k" not in err
