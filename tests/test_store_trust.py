"""Issue 41, the stores: every reader verifies what it reads (page checksums, ranges), `check` runs the readers' own
checks and names a damaged manifest as the fault, `--resume` mends what `check` says it mends, duplicates are
refused, and `export` writes over no file of a run. Each remedy an error gives is followed here and checked."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest

from depthlens.config import GenerateRun, SamplingConfig, StoreSpec
from depthlens.errors import StoreError
from depthlens.evals.tasks import Question
from depthlens.stores import layout
from depthlens.stores.parquet import iter_store
from depthlens.stores.samples import SAMPLES, SHARDS, read_responses
from tests.test_cli import run

QUESTIONS = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]
SAMPLING = SamplingConfig(max_new_tokens=4, readout_tokens=None)


def _run(out, fmt, resume=False):
    return GenerateRun(StoreSpec(out, resume, format=fmt), pool=2, seed=5, sampling=SAMPLING, batch_size=1)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The tiny chat model and one whole store of each format, copied by each test."""
    from depthlens.models.load import wrap
    from depthlens.studies.generate import generate
    from tests.conftest import CharTokenizer, tiny_model

    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    root = tmp_path_factory.mktemp("trust")
    for fmt in ("parquet", "jsonl"):
        generate(lm, _run(root / fmt, fmt), QUESTIONS)
    return lm, root


def _copy(made, tmp_path, fmt):
    out = tmp_path / fmt
    shutil.copytree(made[1] / fmt, out)
    return out


def _resume(made, out, fmt):
    from depthlens.studies.generate import generate

    generate(made[0], _run(out, fmt, resume=True), QUESTIONS)


def _records(out):
    """The store's records through the one reader every study uses (it also checks them against the manifest)."""
    return sorted((r["id"], r["token_ids"], r["divergence"]) for _, r in read_responses(out))


def _check(monkeypatch, capsys, out):
    code, text, _ = run(monkeypatch, capsys, "check", out)
    return code, " ".join(text.split())


def _shards(out):
    return sorted((out / SHARDS).glob("part-*.parquet"))


def _inside_a_data_page(shard) -> range:
    """8 byte offsets in the middle of the divergence column's data, from the shard's own footer: a fixed share of
    the file's length may fall in the footer's metadata, whose size moves with every setting a manifest gains."""
    import pyarrow.parquet as pq

    group = pq.ParquetFile(shard).metadata.row_group(0)
    column = next(
        group.column(c)
        for c in range(group.num_columns)
        if group.column(c).path_in_schema.startswith("divergence.")
    )
    middle = column.data_page_offset + column.total_compressed_size // 2
    return range(middle, middle + 8)


def test_a_byte_changed_in_place_is_refused_by_its_page_checksum_and_resume_mends_it(
    made, tmp_path, monkeypatch, capsys
):
    out = _copy(made, tmp_path, "parquet")
    whole = _records(out)
    shard = _shards(out)[1]
    data = bytearray(shard.read_bytes())
    for i in _inside_a_data_page(shard):  # the divergence rows' page, same size (not the footer's metadata)
        data[i] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=f"{shard}: .*rerun the command that wrote the store with --resume"):
        _records(out)
    code, text = _check(monkeypatch, capsys, out)
    assert (
        code == 1
        and f"{shard}" in text
        and "remedy: rerun the command that wrote the store with --resume" in text
    )
    _resume(made, out, "parquet")  # the remedy, followed
    assert _records(out) == whole
    assert _check(monkeypatch, capsys, out)[0] == 0
    assert (out / SHARDS / f".{shard.name}.damaged").is_file()  # set aside, not deleted


def _rewrite_shard(shard, change):
    """A shard rewritten with ``change`` applied to its table, checksums and manifest entry made to match: what a
    bug or a hostile tool leaves, which only the range checks can see."""
    import pyarrow.parquet as pq

    table = pq.read_table(shard)
    data = layout.encode(change(table), dict(table.schema.metadata))
    shard.write_bytes(data)
    manifest_file = shard.parent / layout.MANIFEST
    manifest = json.loads(manifest_file.read_text())
    for entry in manifest["shards"]:
        if entry["file"] == shard.name:
            entry.update(bytes=len(data), sha256=layout.entry(shard.name, table, data)["sha256"])
    manifest_file.write_text(json.dumps(manifest))


def _huge_jsd(table):
    rows = table.column("divergence").to_pylist()
    rows[0][0][0] = 1e11
    i = table.column_names.index("divergence")
    return table.set_column(i, "divergence", pa.array(rows, type=table.schema.field("divergence").type))


def test_a_jsd_out_of_range_is_refused_by_name_by_every_reader_and_check(made, tmp_path, monkeypatch, capsys):
    out = _copy(made, tmp_path, "parquet")
    shard = _shards(out)[0]
    _rewrite_shard(shard, _huge_jsd)
    rid = json.loads((out / SHARDS / layout.MANIFEST).read_text())["shards"][0]["ids"][0]
    said = f"{shard}: row 1, record {rid!r}: divergence holds 99999997952.0"  # 1e11 as float32
    for read in (lambda: list(read_responses(out)), lambda: list(iter_store(out / SHARDS))):
        with pytest.raises(StoreError) as info:
            read()
        assert said in str(info.value) and "not a jsd divergence in [0, 1 bit]" in str(info.value)
    code, text = _check(monkeypatch, capsys, out)
    assert code == 1 and said in text and "damaged" in text
    code, _, err = run(monkeypatch, capsys, "export", out / SHARDS, "--out", tmp_path / "x.jsonl")
    assert code == 2 and said in " ".join(err.split()) and not (tmp_path / "x.jsonl").exists()


def test_a_jsonl_value_out_of_range_is_refused_and_resume_sets_the_line_aside(
    made, tmp_path, monkeypatch, capsys
):
    out = _copy(made, tmp_path, "jsonl")
    whole = _records(out)
    lines = (out / SAMPLES).read_text().splitlines(keepends=True)
    record = json.loads(lines[1])
    record["divergence"][0][0] = 3e22
    lines[1] = json.dumps(record) + "\n"
    (out / SAMPLES).write_text("".join(lines))
    said = f"{out / SAMPLES}:2: record {record['id']!r}: divergence holds 3e+22"
    with pytest.raises(StoreError, match="not a jsd divergence"):
        _records(out)
    code, text = _check(monkeypatch, capsys, out)
    assert code == 1 and said in text and "remedy: rerun the command that wrote it with --resume" in text
    _resume(made, out, "jsonl")  # the remedy, followed
    assert _records(out) == whole
    assert _check(monkeypatch, capsys, out)[0] == 0
    assert "3e+22" in (out / (SAMPLES + ".damaged")).read_text()


def test_a_repeated_jsonl_line_is_refused_by_every_reader_and_resume_keeps_one(
    made, tmp_path, monkeypatch, capsys
):
    out = _copy(made, tmp_path, "jsonl")
    whole = _records(out)
    lines = (out / SAMPLES).read_text().splitlines(keepends=True)
    (out / SAMPLES).write_text("".join([*lines, lines[0]]))
    rid = json.loads(lines[0])["id"]
    said = f"{out / SAMPLES}:{len(lines) + 1}: id {rid!r} is also on {out / SAMPLES}:1 (a line repeated)"
    for read in (lambda: _records(out), lambda: list(iter_store(out / SAMPLES))):
        with pytest.raises(StoreError) as info:
            read()
        assert said in str(info.value)
    code, _, err = run(monkeypatch, capsys, "export", out / SAMPLES, "--out", tmp_path / "x.jsonl")
    assert code == 2 and said in " ".join(err.split())
    code, text = _check(monkeypatch, capsys, out)
    assert code == 1 and said in text and "keeps the first line" in text
    _resume(made, out, "jsonl")  # the remedy, followed
    assert _records(out) == whole and _check(monkeypatch, capsys, out)[0] == 0


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("dtr.g", 0.9, "dtr.g: the shards say 0.5, the manifest 0.9"),
        ("pool", 7, "pool: the shards say 2, the manifest 7"),
        ("readout.divergence", "kl", "readout.divergence: the shards say 'jsd', the manifest 'kl'"),
        ("n_layers", 9, "says n_layers 9, but the records' divergence rows have {n} layers"),
    ],
)
def test_an_edited_manifest_is_named_as_the_fault_and_putting_it_back_mends_it(
    made, tmp_path, monkeypatch, capsys, key, value, expected
):
    out = _copy(made, tmp_path, "parquet")
    meta = out / SHARDS / layout.MANIFEST
    original = meta.read_text()
    manifest = json.loads(original)
    expected = expected.format(n=manifest["n_layers"])
    head, _, tail = key.partition(".")
    if tail:
        manifest[head][tail] = value
    else:
        manifest[head] = value
    meta.write_text(json.dumps(manifest))
    with pytest.raises(StoreError) as info:
        _records(out)
    said = str(info.value)
    assert said.startswith(f"{meta}: ") and expected in said and "move it out" not in said
    code, text = _check(monkeypatch, capsys, out)
    assert code == 1 and f"manifest: {meta}:" in text and expected in text and "move it out" not in text
    assert "1 problem(s)" in text  # the manifest, not each shard
    meta.write_text(original)  # the remedy: the values the shards carry, back in the manifest
    assert _check(monkeypatch, capsys, out)[0] == 0 and len(_records(out)) == 4


@pytest.mark.parametrize("damage", ["cut", "id twice"])
def test_check_lists_an_unreadable_manifest_instead_of_failing(made, tmp_path, monkeypatch, capsys, damage):
    out = _copy(made, tmp_path, "parquet")
    meta = out / SHARDS / layout.MANIFEST
    original = meta.read_text()
    if damage == "cut":
        meta.write_text(original[: len(original) // 2])
        expected = "manifest is cut or is not JSON"
    else:
        manifest = json.loads(original)
        manifest["shards"][1]["ids"].append(manifest["shards"][0]["ids"][0])
        meta.write_text(json.dumps(manifest))
        expected = "lists id 'q0#0' under part-000000.parquet too"
    with pytest.raises(StoreError, match=expected):
        _records(out)
    code, text = _check(monkeypatch, capsys, out)
    assert code == 1 and expected in text and "remedy:" in text
    meta.write_text(original)
    assert _check(monkeypatch, capsys, out)[0] == 0


def test_check_lists_a_cut_jsonl_manifest_and_a_record_missing_a_field(made, tmp_path, monkeypatch, capsys):
    out = _copy(made, tmp_path, "jsonl")
    meta = out / (SAMPLES + ".manifest.json")
    original = meta.read_text()
    meta.write_text(original[:40])
    code, text = _check(monkeypatch, capsys, out)
    assert code == 1 and f"manifest: {meta}: the manifest is cut or is not JSON" in text
    meta.write_text(original)
    lines = (out / SAMPLES).read_text().splitlines(keepends=True)
    record = json.loads(lines[0])
    del record["log_prob"]
    (out / SAMPLES).write_text("".join([json.dumps(record) + "\n", *lines[1:]]))
    with pytest.raises(StoreError, match=r"missing field\(s\) \['log_prob'\]"):
        _records(out)
    code, text = _check(monkeypatch, capsys, out)
    assert code == 1 and f"{out / SAMPLES}:1: missing field(s) ['log_prob'] (record {record['id']!r};" in text
    assert "delete that line and rerun the command that wrote the store with --resume" in text
    (out / SAMPLES).write_text("".join(lines[1:]))  # the remedy, followed
    _resume(made, out, "jsonl")
    assert _check(monkeypatch, capsys, out)[0] == 0 and len(_records(out)) == 4


def test_export_writes_over_no_file_of_a_run(made, tmp_path, monkeypatch, capsys):
    out = _copy(made, tmp_path, "parquet")
    gold = (out / "questions.jsonl").read_bytes()
    for target in (out / "questions.jsonl", out / "new.jsonl", out / SHARDS / "x.jsonl"):
        code, _, err = run(monkeypatch, capsys, "export", out / SHARDS, "--out", target, "--overwrite")
        assert code == 2 and f"--out {target}" in " ".join(err.split())
    assert (out / "questions.jsonl").read_bytes() == gold
    jsonl = _copy(made, tmp_path, "jsonl")
    code, _, err = run(monkeypatch, capsys, "export", out / SHARDS, "--out", jsonl / SAMPLES, "--overwrite")
    assert code == 2 and (jsonl / SAMPLES).is_file()
    export = tmp_path / "all.jsonl"
    for _ in range(2):  # an export may replace its own earlier export
        code, _, _ = run(monkeypatch, capsys, "export", out / SHARDS, "--out", export, "--overwrite")
        assert code in (0, None) and len(export.read_text().splitlines()) == 4


def test_view_shows_a_repeated_line_once_with_the_readers_notice(made, tmp_path):
    from depthlens.view.store import open_store

    out = _copy(made, tmp_path, "jsonl")
    lines = (out / SAMPLES).read_text().splitlines(keepends=True)
    (out / SAMPLES).write_text("".join([*lines, lines[0]]))
    store = open_store(out)
    rid = json.loads(lines[0])["id"]
    assert len(store.records) == len(lines)  # shown once
    assert any(f"id {rid!r} held twice" in n and f"depthlens check {out}" in n for n in store.notices)
    code = _check_code(out)
    assert code == 1  # the store the notice says every reader refuses: check lists it


def _check_code(out):
    from depthlens.stores.check import check

    return 1 if any(r.problems for r in check(out)) else 0


def test_resume_sets_aside_a_shard_holding_a_value_out_of_range(made, tmp_path, monkeypatch, capsys):
    out = _copy(made, tmp_path, "parquet")
    whole = _records(out)
    shard = _shards(out)[0]
    _rewrite_shard(shard, _huge_jsd)  # checksums and hash made to match: only the ranges see it
    assert _check(monkeypatch, capsys, out)[0] == 1
    _resume(made, out, "parquet")  # the remedy the refusal gives, followed
    assert _records(out) == whole and _check(monkeypatch, capsys, out)[0] == 0


def test_regrade_names_an_edited_manifest_and_refuses_a_repeated_line_changing_nothing(made, tmp_path):
    from depthlens.studies.regrade import regrade_store

    out = _copy(made, tmp_path, "parquet")
    meta = out / SHARDS / layout.MANIFEST
    manifest = json.loads(meta.read_text())
    manifest["dtr"]["g"] = 0.9
    meta.write_text(json.dumps(manifest))
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    with pytest.raises(StoreError) as info:
        regrade_store(out)
    assert str(info.value).startswith(f"{meta}: ") and "move it out" not in str(info.value)
    assert {
        p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != "_depthlens.lock"
    } == {p: b for p, b in before.items() if p.name != "_depthlens.lock"}
    jsonl = _copy(made, tmp_path, "jsonl")
    lines = (jsonl / SAMPLES).read_text().splitlines(keepends=True)
    (jsonl / SAMPLES).write_text("".join([*lines, lines[0]]))
    with pytest.raises(StoreError, match="a line repeated"):
        regrade_store(jsonl)
    assert (jsonl / SAMPLES).read_text() == "".join([*lines, lines[0]])


def test_view_names_an_edited_manifest_as_the_readers_do(made, tmp_path):
    from depthlens.view.store import open_store

    out = _copy(made, tmp_path, "parquet")
    meta = out / SHARDS / layout.MANIFEST
    manifest = json.loads(meta.read_text())
    manifest["dtr"]["g"] = 0.9
    meta.write_text(json.dumps(manifest))
    store = open_store(out)
    assert len(store.records) == 4  # the shards are whole: shown
    said = [n for n in store.notices if n.startswith(f"{meta}: ")]
    assert said and "dtr.g: the shards say 0.5, the manifest 0.9" in said[0] and "move it out" not in said[0]


def test_view_shows_a_value_out_of_range_as_a_notice_when_its_response_opens(made, tmp_path):
    from depthlens.view.store import open_store

    out = _copy(made, tmp_path, "parquet")
    _rewrite_shard(_shards(out)[0], _huge_jsd)
    store = open_store(out)
    rid = json.loads((out / SHARDS / layout.MANIFEST).read_text())["shards"][0]["ids"][0]
    store.read(store.by_id[rid])
    assert any(
        n.startswith(f"{_shards(out)[0]} row 1: record {rid!r}: divergence holds 99999997952.0")
        and f"depthlens check {out}" in n
        for n in store.notices
    ), store.notices


def test_resume_over_an_edited_manifest_names_the_manifest(made, tmp_path):
    out = _copy(made, tmp_path, "parquet")
    meta = out / SHARDS / layout.MANIFEST
    manifest = json.loads(meta.read_text())
    manifest["dtr"]["g"] = 0.9
    meta.write_text(json.dumps(manifest))
    with pytest.raises(StoreError) as info:
        _resume(made, out, "parquet")
    assert str(info.value).startswith(f"{meta}: ") and "dtr.g: the shards say 0.5, the manifest 0.9" in str(
        info.value
    )
