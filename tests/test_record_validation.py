"""Issue 51: one record validation at every door. Each damage of a table (values against each other and against
the store, texts no file can carry, records removed with the manifest intact) is refused by every reader —
`check`, `export`, `thinkn --from`, `report`'s reader, `regrade`, the explorer and the Python verbs — naming the
same record and fault (a table of damages × readers)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from depthlens.config import DTRConfig, GenerateRun, SamplingConfig, StoreSpec
from depthlens.errors import StoreError
from depthlens.evals.tasks import Question
from depthlens.stores.samples import SAMPLES
from tests.test_cli import run

QUESTIONS = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]
SAMPLING = SamplingConfig(max_new_tokens=4, readout_tokens=None)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One whole JSONL sample store (with its vocabulary recorded), copied by each test."""
    from depthlens.models.load import wrap
    from depthlens.studies.generate import generate
    from tests.conftest import CharTokenizer, tiny_model

    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    root = tmp_path_factory.mktemp("records") / "jsonl"
    generate(
        lm,
        GenerateRun(StoreSpec(root, format="jsonl"), pool=2, seed=5, sampling=SAMPLING, batch_size=1),
        QUESTIONS,
    )
    return root


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """A damage made to the first line's record (written back as JSON, non-ASCII escaped)."""

    def damage(out: Path) -> None:
        lines = (out / SAMPLES).read_text().splitlines(keepends=True)
        record = json.loads(lines[0])
        change(record)
        lines[0] = json.dumps(record) + "\n"
        (out / SAMPLES).write_text("".join(lines))

    return damage


def _set(**values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda record: record.update(values)


def _inverted(record: dict[str, Any]) -> None:
    record["deep"] = [not flag for flag in record["deep"]]


def _renamed_status(record: dict[str, Any]) -> None:
    record["statuz"] = record.pop("status")


def _emptied(out: Path) -> None:
    (out / SAMPLES).write_text("")


def _last_line_dropped(out: Path) -> None:
    lines = (out / SAMPLES).read_text().splitlines(keepends=True)
    (out / SAMPLES).write_text("".join(lines[:-1]))


DAMAGES = {
    "token_count 99 for 4 tokens": (_edit(_set(token_count=99)), "token_count 99 for 4 token_ids"),
    "token_count as text": (_edit(_set(token_count="4")), "token_count '4', not a whole number"),
    "correct as text": (_edit(_set(correct="yes")), "correct 'yes', not true or false"),
    "a token id past the vocabulary": (
        _edit(_set(token_ids=[10**30, 1, 2, 3])),
        f"token_ids holds token id {10**30}, past the model's vocabulary of 101",
    ),
    "a negative seed": (_edit(_set(seed=-1)), "seed -1, not a whole number ≥ 0"),
    "deep flags inverted": (_edit(_inverted), "deep is true for settling depth"),
    "dtr against the flags": (_edit(_set(dtr=1.0)), "dtr 1.0 disagrees with its flags"),
    "a question the store lacks": (
        _edit(_set(id="q9#0", question_id="q9")),
        "question_id 'q9' is none of the store's 2 questions",
    ),
    "a sample past the pool": (_edit(_set(id="q0#5", sample=5)), "sample 5 is outside the store's pool of 2"),
    "an id against its sample": (
        _edit(_set(id="q0#7")),
        "id 'q0#7' disagrees with question_id 'q0' and sample 0",
    ),
    "a lone surrogate": (_edit(_set(text="\ud800")), "text holds a lone surrogate"),
    "status renamed": (_edit(_renamed_status), "missing field(s) ['status']"),
    "every response gone": (_emptied, "records were removed (the file was emptied or cut)"),
    "a line removed whole": (_last_line_dropped, "records were removed (the file was emptied or cut)"),
}


def _check(out: Path, monkeypatch, capsys) -> str:
    code, text, _ = run(monkeypatch, capsys, "check", out)
    assert code == 1, text
    return " ".join(text.split())


def _export(out: Path, monkeypatch, capsys) -> str:
    target = out.parent / "export.jsonl"
    code, _, err = run(monkeypatch, capsys, "export", out / SAMPLES, "--out", target)
    assert code == 2 and not target.exists(), err
    return " ".join(err.split())


def _refused(read: Callable[[Path], object]) -> Callable[[Path, Any, Any], str]:
    def reader(out: Path, monkeypatch, capsys) -> str:
        with pytest.raises(StoreError) as info:
            read(out)
        return str(info.value)

    return reader


def _thinkn(out: Path) -> object:
    from depthlens.studies.thinkn import load_pools

    return load_pools(out, DTRConfig())


def _report(out: Path) -> object:
    from depthlens.studies.stored import load_store

    return load_store(out)


def _regrade(out: Path) -> object:
    from depthlens.studies.regrade import regrade_store

    return regrade_store(out)


def _python(out: Path) -> object:
    from depthlens.api.pools import responses

    return responses(out)


def _explorer(out: Path, monkeypatch, capsys) -> str:
    from depthlens.view.store import open_store

    store = open_store(out)
    for index in range(len(store.records)):
        store.read(index)
    said = [n for n in store.notices if "every reader" in n or "missing field" in n]
    assert said, store.notices
    return " ".join(said)


READERS = {
    "check": _check,
    "export": _export,
    "thinkn --from": _refused(_thinkn),
    "report": _refused(_report),
    "regrade": _refused(_regrade),
    "python": _refused(_python),
    "explorer": _explorer,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_every_reader_refuses_each_damage_naming_it(made, tmp_path, monkeypatch, capsys, damage):
    out = tmp_path / "jsonl"
    shutil.copytree(made, out)
    code, text, _ = run(monkeypatch, capsys, "check", out)
    assert code == 0, text
    change, said = DAMAGES[damage]
    change(out)
    before = (out / SAMPLES).read_bytes()
    for name, reader in READERS.items():
        if name == "export" and damage == "a lone surrogate":
            continue  # written escaped instead (test_export_writes_a_stored_lone_surrogate_escaped)
        assert said in reader(out, monkeypatch, capsys), name
    assert (out / SAMPLES).read_bytes() == before  # no reader changed the store


def test_export_writes_a_stored_lone_surrogate_escaped(made, tmp_path, monkeypatch, capsys):
    """`check` names the record and the field; the other readers refuse, saying that export writes it escaped;
    export does (a JSON \\ud800 escape, the rest of the line as it was), and the file reads back the same text."""
    out = tmp_path / "jsonl"
    shutil.copytree(made, out)
    _edit(_set(text="é\ud800"))(out)
    said = _check(out, monkeypatch, capsys)
    assert "record 'q0#0': text holds a lone surrogate" in said and "depthlens export" in said
    assert "depthlens export" in _refused(_thinkn)(out, monkeypatch, capsys)
    target = tmp_path / "export.jsonl"
    code, _, err = run(monkeypatch, capsys, "export", out / SAMPLES, "--out", target)
    assert code == 0, err
    assert "record 'q0#0' (text) held a lone surrogate" in " ".join(err.split())
    raw = target.read_bytes()
    assert b'"\xc3\xa9\\ud800"' in raw  # é kept as UTF-8, only the surrogate escaped
    exported = [json.loads(line) for line in raw.decode("utf-8").splitlines()]
    stored = [json.loads(line) for line in (out / SAMPLES).read_text().splitlines()]
    assert exported == stored and exported[0]["text"] == "é\ud800"


def test_the_committed_count_follows_a_resume_that_computes_lost_records_again(
    made, tmp_path, monkeypatch, capsys
):
    """The remedy the refusal of an emptied store gives (--resume), followed: the store is whole and ok again."""
    from depthlens.models.load import wrap
    from depthlens.studies.generate import generate
    from tests.conftest import CharTokenizer, tiny_model

    out = tmp_path / "jsonl"
    shutil.copytree(made, out)
    whole = sorted((out / SAMPLES).read_text().splitlines())
    _last_line_dropped(out)
    assert "--resume" in _check(out, monkeypatch, capsys)
    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    run_ = GenerateRun(StoreSpec(out, True, format="jsonl"), pool=2, seed=5, sampling=SAMPLING, batch_size=1)
    generate(lm, run_, QUESTIONS)
    code, text, _ = run(monkeypatch, capsys, "check", out)
    assert code == 0, text
    assert sorted((out / SAMPLES).read_text().splitlines()) == whole


def _renamed_column(table):
    return table.rename_columns(["voue_key" if n == "vote_key" else n for n in table.column_names])


def _token_count_99(table):
    import pyarrow as pa

    i = table.column_names.index("token_count")
    return table.set_column(
        i, "token_count", pa.array([99] * table.num_rows, type=table.schema.field(i).type)
    )


def _one_layer_more(out: Path) -> None:
    from depthlens.stores import layout
    from depthlens.stores.samples import SHARDS

    meta = out / SHARDS / layout.MANIFEST
    manifest = json.loads(meta.read_text())
    manifest["n_layers"] += 1
    meta.write_text(json.dumps(manifest))


def _shard_and_entry_removed(out: Path) -> None:
    from depthlens.stores import layout
    from depthlens.stores.samples import SHARDS

    meta = out / SHARDS / layout.MANIFEST
    manifest = json.loads(meta.read_text())
    gone = manifest["shards"].pop()
    (out / SHARDS / gone["file"]).unlink()
    meta.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (_shard_and_entry_removed, "shards were removed together with their entries"),
        (_renamed_column, "missing field(s) ['vote_key']"),
        (_token_count_99, "token_count 99 for 4 token_ids"),
        (_one_layer_more, "says n_layers 4, but the records' divergence rows have 3 layers"),
    ],
)
def test_export_refuses_a_parquet_store_check_and_thinkn_refuse(tmp_path, monkeypatch, capsys, damage, said):
    """The damages export wrote with exit 0 before (a column renamed in a shard's footer, a manifest's layers)."""
    from depthlens.models.load import wrap
    from depthlens.stores.samples import SHARDS
    from depthlens.studies.generate import generate
    from tests.conftest import CharTokenizer, tiny_model
    from tests.test_store_trust import _rewrite_shard

    out = tmp_path / "parquet"
    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    generate(lm, GenerateRun(StoreSpec(out), pool=2, seed=5, sampling=SAMPLING, batch_size=1), QUESTIONS)
    if damage in (_one_layer_more, _shard_and_entry_removed):
        damage(out)
    else:
        _rewrite_shard(sorted((out / SHARDS).glob("part-*.parquet"))[0], damage)
    target = tmp_path / "export.jsonl"
    code, _, err = run(monkeypatch, capsys, "export", out / SHARDS, "--out", target)
    assert code == 2 and said in " ".join(err.split()) and not target.exists()
    assert said in _check(out, monkeypatch, capsys)
    assert said in _refused(_thinkn)(out, monkeypatch, capsys)
    assert said in _refused(_report)(out, monkeypatch, capsys)
    assert said in _explorer(out, monkeypatch, capsys)


def test_the_explorer_names_a_renamed_column_and_an_edited_manifest_at_open(tmp_path):
    """Before any response is opened: the page's notices name what every reader refuses (the light fields of every
    record and the first record whole are checked at open), with the readers' own remedy."""
    from depthlens.models.load import wrap
    from depthlens.stores.samples import SHARDS
    from depthlens.studies.generate import generate
    from depthlens.view.store import open_store
    from tests.conftest import CharTokenizer, tiny_model
    from tests.test_store_trust import _rewrite_shard

    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    for damage, said, remedy in [
        (_renamed_column, "missing field(s) ['vote_key']", "--resume"),
        (
            _one_layer_more,
            "says n_layers 4, but the records' divergence rows have 3",
            "set n_layers back to 3",
        ),
    ]:
        out = tmp_path / damage.__name__
        generate(lm, GenerateRun(StoreSpec(out), pool=2, seed=5, sampling=SAMPLING, batch_size=1), QUESTIONS)
        assert open_store(out).notices == []
        if damage is _one_layer_more:
            damage(out)
        else:
            _rewrite_shard(sorted((out / SHARDS).glob("part-*.parquet"))[0], damage)
        notices = open_store(out).notices
        assert len(notices) == 1 and said in notices[0] and remedy in notices[0], notices
        assert "every reader" in notices[0]
