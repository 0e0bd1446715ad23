"""Issue 59 at the doors of a ``score`` store, and a store's identity.

A ``score --tokens --layer-top-k K`` store is checked as a sample store is: each layer's top-k ids below the
vocabulary its manifest records (``vocab_rows``), distinct, K of them, their probabilities descending and summing to
at most 1 — refused by name at every door that reads it (``check``, ``check --quick``, ``export``, the explorer); a
store with fewer records than its input is said to be so at each, in one line. A store written before the manifest
recorded the vocabulary is read, and ``check`` says what it cannot check.

A copy (``regrade --out``, ``export``) is a store of its own: a new run id, and its source named in its manifest,
so a shard of one placed in the other is refused as another run's. A store whose manifest points outside it is
refused before anything is copied, and the copy never made.

One small store per format, built once; each case works on a copy."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from depthlens.config import ReadoutConfig, ScoreRun, StoreSpec
from depthlens.stores import layout
from depthlens.stores.files import manifest_path
from depthlens.stores.samples import SHARDS
from tests.test_cli import run
from tests.test_hostile_doors import _entry_outside, _one_id_k_times, _top_probs

TestClient = pytest.importorskip("starlette.testclient", reason="the view extra is not installed").TestClient
TOP_K = 3
RECORDS = 4
VOCAB = 101  # the tiny models' vocabulary


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """One ``score --tokens --layer-top-k 3`` store per format (Parquet: one shard of 4 records; JSONL)."""
    from depthlens.models.load import wrap
    from depthlens.studies.score import run_score
    from tests.conftest import CharTokenizer, tiny_model

    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    root = tmp_path_factory.mktemp("scores")
    source = root / "in.jsonl"
    rows = [
        {"id": f"r{i}", "prompt_ids": [4, 5 + i], "completion_ids": [7, 8 + i, 9]} for i in range(RECORDS)
    ]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("parquet", "scores.jsonl"):
        readout = ReadoutConfig(layer_top_k=TOP_K)
        run_score(lm, ScoreRun(source, StoreSpec(root / name), readout=readout, tokens=True, tcb=None))
    return root


def _meta(store: Path) -> Path:
    return layout.manifest_file(store) if store.is_dir() else manifest_path(store)


def _edit_first(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """``change`` made to the store's first record, checksums, sizes and commit made to match (what a tool that
    rewrites stores without understanding them leaves): only the values' meaning can tell."""

    def damage(store: Path) -> None:
        if store.is_dir():
            import pyarrow as pa

            from tests.test_store_trust import _rewrite_shard

            def changed(table: pa.Table) -> pa.Table:
                rows = table.to_pylist()
                change(rows[0])
                return pa.Table.from_pylist(rows, schema=table.schema)

            _rewrite_shard(sorted(store.glob("part-*.parquet"))[0], changed)
            return
        lines = store.read_text().splitlines(keepends=True)
        record = json.loads(lines[0])
        change(record)
        lines[0] = json.dumps(record) + "\n"
        store.write_text("".join(lines))
        _recommit(store)

    return damage


def _recommit(store: Path) -> None:
    """A JSONL store's manifest ``committed`` entry made to match what the file holds now."""
    from depthlens.stores.commits import Running

    manifest = json.loads(_meta(store).read_text())
    manifest["committed"] = Running.of(store).entry()
    _meta(store).write_text(json.dumps(manifest))


def _k_two(store: Path) -> None:
    """Each layer's top-k cut to 2 in a K = 3 store: the whole shard (a Parquet column has one K), one record of a
    JSONL store."""
    if not store.is_dir():
        _edit_first(_cut_k)(store)
        return
    import pyarrow as pa

    from tests.test_store_trust import _rewrite_shard

    def cut(table: pa.Table) -> pa.Table:
        for name, kind in (("layer_top_ids", pa.int32()), ("layer_top_probs", pa.float32())):
            values = [
                [[layer[:2] for layer in token] for token in row] for row in table.column(name).to_pylist()
            ]
            layers = len(values[0][0])
            typed = pa.array(values, type=pa.list_(pa.list_(pa.list_(kind, 2), layers)))
            table = table.set_column(table.column_names.index(name), name, typed)
        return table

    _rewrite_shard(sorted(store.glob("part-*.parquet"))[0], cut)


def _cut_k(record: dict[str, Any]) -> None:
    for name in ("layer_top_ids", "layer_top_probs"):
        record[name] = [[layer[:2] for layer in token] for token in record[name]]


def _ascending(record: dict[str, Any]) -> None:
    record["layer_top_probs"][0][0] = sorted(record["layer_top_probs"][0][0])


def _id_of_vocab_size(record: dict[str, Any]) -> None:
    record["layer_top_ids"][0][0][1] = VOCAB


def _last_record_removed(store: Path) -> None:
    """The last record removed, and the store's commit (a shard's entry, a JSONL manifest) made to match."""
    if not store.is_dir():
        lines = store.read_text().splitlines(keepends=True)
        store.write_text("".join(lines[:-1]))
        _recommit(store)
        return
    import pyarrow as pa

    from tests.test_store_trust import _rewrite_shard

    shard = sorted(store.glob("part-*.parquet"))[0]
    _rewrite_shard(shard, lambda table: table.slice(0, table.num_rows - 1))
    manifest = json.loads(_meta(store).read_text())
    entry = manifest["shards"][0]
    entry["rows"] -= 1
    entry["ids"] = entry["ids"][:-1]
    manifest["committed"]["records"] -= 1
    _meta(store).write_text(json.dumps(manifest))
    assert pa is not None


DAMAGES: dict[str, Callable[[Path], None]] = {
    "a top-k id equal to the vocabulary size": _edit_first(_id_of_vocab_size),
    "ascending top-k probabilities": _edit_first(_ascending),
    "top-k probabilities [0.9] * 3 (summing to 2.7)": _edit_first(_top_probs(0.9)),
    "a top-k holding one id 3 times": _edit_first(_one_id_k_times),
    "K = 2 in a K = 3 store": _k_two,
}


class ScoreDoors:
    """The doors of a score store: check, check --quick, export, the explorer."""

    def __init__(self, store: Path, tmp: Path, monkeypatch: Any, capsys: Any) -> None:
        self.store, self.tmp, self.monkeypatch, self.capsys = store, tmp, monkeypatch, capsys
        self.said: dict[str, tuple[int, str]] = {}

    def cli(self, door: str, *args: object) -> None:
        code, out, err = run(self.monkeypatch, self.capsys, *args)
        text = " ".join((out + err).split())
        assert "Traceback" not in text, (door, text)
        self.said[door] = (code or 0, text)

    def run_all(self) -> None:
        from depthlens.view.app import Explorer, make_app
        from depthlens.view.store import open_store

        self.cli("check", "check", self.store)
        self.cli("check --quick", "check", "--quick", self.store)
        self.exported = self.tmp / "export.jsonl"
        self.cli("export", "export", self.store, "--out", self.exported)
        explorer = Explorer.of(open_store(self.store))
        api = TestClient(make_app(explorer))
        for rid in list(explorer.store.by_id):
            assert api.get("/api/response", params={"id": rid}).status_code in (200, 400, 404)
        notices = " ".join(" ".join(n.split()) for n in api.get("/api/run").json()["notices"])
        self.said["explorer"] = (1 if notices else 0, notices)


def _copy(scored: Path, tmp_path: Path, fmt: str) -> Path:
    name = "parquet" if fmt == "parquet" else "scores.jsonl"
    target = tmp_path / name
    (shutil.copytree if fmt == "parquet" else shutil.copy)(scored / name, target)
    if fmt != "parquet":
        shutil.copy(manifest_path(scored / name), manifest_path(target))
    return target


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_score_store_is_checked_as_a_sample_store_is(scored, tmp_path, monkeypatch, capsys, fmt, damage):
    """Each damage a sample store's doors refuse, refused by every door of a score store, naming the file (and
    line or row) `check` names first; the refusal changes nothing."""
    from depthlens.stores.check import check

    store = _copy(scored, tmp_path, fmt)
    assert json.loads(_meta(store).read_text())["vocab_rows"] == VOCAB  # recorded by `score` since issue 59
    DAMAGES[damage](store)
    problems = [p for report in check(store) for p in report.problems]
    assert problems, f"check says ok on {damage!r}"
    where = str(problems[0].path)
    doors = ScoreDoors(store, tmp_path, monkeypatch, capsys)
    doors.run_all()
    for door, (code, text) in doors.said.items():
        assert code == {"check": 1, "check --quick": 1, "export": 2, "explorer": 1}[door], (door, text)
        assert where in text and "the record is damaged" in text, (door, where, text)
    assert not doors.exported.exists()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_score_store_short_of_its_input_is_said_at_every_door(scored, tmp_path, monkeypatch, capsys, fmt):
    store = _copy(scored, tmp_path, fmt)
    _last_record_removed(store)
    line = f"{store}: incomplete, 3 of 4 records of its input; `--resume` finishes it, or it was cut by hand"
    doors = ScoreDoors(store, tmp_path, monkeypatch, capsys)
    doors.run_all()
    for door, (code, text) in doors.said.items():
        assert code == {"check": 3, "check --quick": 3, "export": 0, "explorer": 1}[door], (door, text)
        assert text.count(line) == 1, (door, text)  # the explorer's one notice is this line
    assert len(doors.exported.read_text().splitlines()) == 3


def test_a_score_run_skipping_bad_records_is_whole_not_short(tmp_path, monkeypatch, capsys):
    """Records ``--skip-bad`` skipped are named in the manifest: the store holds every other one, and is whole."""
    from tests.conftest import tiny_model

    tiny_dir = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(tiny_dir)
    source = tmp_path / "in.jsonl"
    rows = [
        {"id": "a", "prompt_ids": [4], "completion_ids": [7, 8]},
        {"id": "b", "prompt_ids": [4], "completion_ids": [5000]},
    ]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scores"
    code, _, err = run(
        monkeypatch, capsys, "score", "--model", tiny_dir, "--in", source, "--out", out, "--skip-bad"
    )
    assert code in (0, None), err
    assert json.loads(_meta(out).read_text())["skipped"] == ["b"]
    code, text, _ = run(monkeypatch, capsys, "check", out)
    assert code in (0, None) and "incomplete" not in text, text


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_store_from_before_vocab_rows_is_read_and_check_says_what_it_cannot_check(
    scored, tmp_path, monkeypatch, capsys, fmt
):
    store = _copy(scored, tmp_path, fmt)
    manifest = json.loads(_meta(store).read_text())
    del manifest["vocab_rows"]
    _meta(store).write_text(json.dumps(manifest))
    _edit_first(_id_of_vocab_size)(store)  # past the vocabulary, which this manifest does not say
    code, text, _ = run(monkeypatch, capsys, "check", store)
    assert code in (0, None), text
    assert "records no vocabulary size (vocab_rows" in text and "not against the model's vocabulary" in text
    _edit_first(_one_id_k_times)(store)  # what it can check, it checks
    assert run(monkeypatch, capsys, "check", store)[0] == 1


# ---- a copy's identity ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_stores(tmp_path_factory):
    from tests.test_hostile_doors import build_sample_stores

    return build_sample_stores(tmp_path_factory.mktemp("copies"))


def test_a_regraded_copy_is_a_store_of_its_own(sample_stores, tmp_path, monkeypatch, capsys):
    """``regrade --out`` gives the copy a new run id and names its source; a shard of either placed in the other,
    under a listed name, is refused as another run's by every reader and by `check`."""
    from depthlens.stores.check import check
    from depthlens.stores.samples import read_responses

    source, copy = tmp_path / "source", tmp_path / "copy"
    shutil.copytree(sample_stores / "parquet", source)
    code, _, err = run(monkeypatch, capsys, "regrade", source, "--out", copy)
    assert code in (0, None), err
    before = json.loads((source / SHARDS / layout.MANIFEST).read_text())
    after = json.loads((copy / SHARDS / layout.MANIFEST).read_text())
    assert after["run_id"] != before["run_id"]
    assert after["derived_from"] == {
        "run_id": before["run_id"],
        "path": str(source.resolve()),
        "by": "regrade --out",
    }
    assert not [p for r in check(copy) for p in r.problems]
    first = {store: sorted((store / SHARDS).glob("part-*.parquet"))[0] for store in (source, copy)}
    held = {store: shard.read_bytes() for store, shard in first.items()}
    for into, other in ((source, copy), (copy, source)):
        first[into].write_bytes(held[other])  # the other store's shard, under a name this one lists
        (problem,) = [p for r in check(into) for p in r.problems]
        assert problem.kind == "foreign" and "a shard of another run" in problem.detail, problem
        with pytest.raises(Exception, match="a shard of another run"):
            list(read_responses(into))


def test_a_jsonl_copy_and_an_export_get_their_own_run_id(sample_stores, tmp_path, monkeypatch, capsys):
    source, copy = tmp_path / "source", tmp_path / "copy"
    shutil.copytree(sample_stores / "jsonl", source)
    stored = json.loads(manifest_path(source / "samples.jsonl").read_text())
    assert run(monkeypatch, capsys, "regrade", source, "--out", copy)[0] in (0, None)
    copied = json.loads(manifest_path(copy / "samples.jsonl").read_text())
    assert copied["run_id"] != stored["run_id"] and copied["derived_from"]["run_id"] == stored["run_id"]
    exported = tmp_path / "export.jsonl"
    assert run(monkeypatch, capsys, "export", source / "samples.jsonl", "--out", exported)[0] in (0, None)
    meta = json.loads(manifest_path(exported).read_text())
    assert meta["run_id"] != stored["run_id"]
    assert meta["derived_from"] == {
        "run_id": stored["run_id"],
        "path": str((source / "samples.jsonl").resolve()),
        "by": "export",
    }


@pytest.mark.parametrize("absolute", [False, True])
def test_regrade_out_of_a_store_reaching_outside_itself_copies_nothing(
    sample_stores, tmp_path, monkeypatch, capsys, absolute
):
    source, copy = tmp_path / "source", tmp_path / "copy"
    shutil.copytree(sample_stores / "parquet", source)
    _entry_outside(absolute)(source)
    code, out, err = run(monkeypatch, capsys, "regrade", source, "--out", copy)
    text = " ".join((out + err).split())
    assert code == 2 and not copy.exists(), text
    assert f"{source / SHARDS / layout.MANIFEST}: lists" in text and "a store holds its own files" in text, (
        text
    )
    assert str(copy) not in text  # the copy is never made, nor named as a store
