"""Issue 51's hostile trial, kept: every damage the trial made to a store, tried at every door that reads one —
``check``, ``check --quick``, ``export`` (of either format), ``thinkn --from``, ``report``, ``correlate``,
``regrade``, the explorer's API and the Python verbs. The doors agree: each refuses naming the place ``check``
names (file and line or row), or each reads the same committed records; exit codes say which (check 1, the other
commands 2 on a refusal; 0 on a read); no door prints a traceback or answers 500; no refusal changes a file.

Issue 59's doors too: a layer's top-k whose values disagree (summing past 1, an id twice), a store whose records
are whole but fewer than its run set out to write (each door says so in the same line, once; ``check`` exits 3),
and a store reaching outside itself (a manifest entry through ``..`` or absolute, a shard replaced by a symlink to
a file outside), each refused by name before any read. ``tests/test_hostile_stores.py`` tries the same at the
doors of a ``score`` store, and a copy's identity.

One small store per format (each layer's top-3 kept), built once; each damage works on a copy. The CLI runs in
this process (``tests.test_cli.run``); a fresh process only where the damage needs one (a writer killed with -9)."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from depthlens.config import GenerateRun, ReadoutConfig, SamplingConfig, StoreSpec
from depthlens.errors import DepthlensError
from depthlens.evals.tasks import Question
from depthlens.stores import layout
from depthlens.stores.files import manifest_path
from depthlens.stores.samples import SAMPLES, SHARDS
from tests.test_cli import run
from tests.test_record_validation import _edit, _emptied, _inverted, _last_line_dropped, _renamed_status, _set

TestClient = pytest.importorskip("starlette.testclient", reason="the view extra is not installed").TestClient
QUESTIONS = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]
SAMPLING = SamplingConfig(max_new_tokens=4, readout_tokens=None)
TOP_K = 3  # each layer's top-3 kept: its values are checked against each other
RECORDS = 4  # 2 questions × pool 2
SRC = Path(__file__).parent.parent / "src"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One whole store per format (Parquet shards of one record each; JSONL), copied by each case."""
    return build_sample_stores(tmp_path_factory.mktemp("doors"))


def build_sample_stores(root: Path) -> Path:
    """A sample store per format under ``root`` (2 questions × pool 2, each layer's top-3 kept)."""
    from depthlens.models.load import wrap
    from depthlens.studies.generate import generate
    from tests.conftest import CharTokenizer, tiny_model

    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    for fmt in ("parquet", "jsonl"):
        run_ = GenerateRun(
            StoreSpec(root / fmt, format=fmt),
            pool=2,
            seed=5,
            sampling=SAMPLING,
            batch_size=1,
            readout=ReadoutConfig(layer_top_k=TOP_K),
        )
        generate(lm, run_, QUESTIONS)
    return root


# ---- the damages ----------------------------------------------------------------------------------------------


def _row(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """A damage to the first shard's first record, its checksums and manifest entry made to match (only the
    record validation can see it)."""

    def damage(out: Path) -> None:
        import pyarrow as pa

        from tests.test_store_trust import _rewrite_shard

        def changed(table: pa.Table) -> pa.Table:
            rows = table.to_pylist()
            change(rows[0])
            return pa.Table.from_pylist(rows, schema=table.schema)

        _rewrite_shard(sorted((out / SHARDS).glob("part-*.parquet"))[0], changed)

    return damage


def _not_utf8(out: Path) -> None:
    """The first shard's texts as bytes UTF-8 cannot decode (a lone surrogate's, ``\\xed\\xa0\\x80``), written by
    a tool that does not check them, checksums and manifest entry made to match."""
    import pyarrow as pa

    from tests.test_store_trust import _rewrite_shard

    def changed(table: pa.Table) -> pa.Table:
        texts = pa.array([b"a\xed\xa0\x80b"] * table.num_rows, pa.binary()).view(pa.string())
        return table.set_column(table.column_names.index("text"), "text", texts)

    _rewrite_shard(sorted((out / SHARDS).glob("part-*.parquet"))[0], changed)


def _footer_bit_flip(out: Path, which: int) -> None:
    """One bit flipped in the first shard's footer: ``vote_key`` (t = 0x74) becomes ``voue_key`` (u = 0x75) where
    the footer names the column ``which`` (0: its schema element; 1: its column chunk's path)."""
    shard = sorted((out / SHARDS).glob("part-*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    at = [i for i in range(len(data)) if data.startswith(b"vote_key", i)][which]
    data[at + 2] ^= 0x01
    shard.write_bytes(bytes(data))


def _settings_bit_flip(out: Path) -> None:
    """One bit flipped in the first shard's footer where it keeps the run's settings: inside the Arrow schema
    (base64, the copy pyarrow reads), a character of the settings' ``"sampling"`` turned into another base64 one."""
    import base64

    import pyarrow.parquet as pq

    shard = sorted((out / SHARDS).glob("part-*.parquet"))[0]
    schema = pq.ParquetFile(shard).metadata.metadata[b"ARROW:schema"]
    data = bytearray(shard.read_bytes())
    at = data.index(schema) + base64.b64decode(schema).index(b'"sampling"') * 4 // 3 + 2
    data[at] ^= 0x01 if bytes([data[at] ^ 0x01]).isalnum() else 0x02
    shard.write_bytes(bytes(data))


def _cut_mid_line(out: Path) -> None:
    text = (out / SAMPLES).read_text()
    (out / SAMPLES).write_text(text[: len(text) - len(text.splitlines()[-1]) // 2])


def _line_repeated(out: Path) -> None:
    lines = (out / SAMPLES).read_text().splitlines(keepends=True)
    (out / SAMPLES).write_text("".join([*lines, lines[0]]))


def _line_bytes(inserted: bytes) -> Callable[[Path], None]:
    """``inserted`` put into the first line's text, as raw bytes."""

    def damage(out: Path) -> None:
        data = (out / SAMPLES).read_bytes()
        at = data.index(b'"text": "') + len(b'"text": "')
        (out / SAMPLES).write_bytes(data[:at] + inserted + data[at:])

    return damage


def _manifest_of(out: Path) -> Path:
    return layout.manifest_file(out / SHARDS) if (out / SHARDS).is_dir() else manifest_path(out / SAMPLES)


def _one_layer_more(out: Path) -> None:
    manifest = json.loads(_manifest_of(out).read_text())
    manifest["n_layers"] += 1
    _manifest_of(out).write_text(json.dumps(manifest))


def _manifest_deleted(out: Path) -> None:
    _manifest_of(out).unlink()


def _shard_and_entry_removed(out: Path) -> None:
    meta = _manifest_of(out)
    manifest = json.loads(meta.read_text())
    (out / SHARDS / manifest["shards"].pop()["file"]).unlink()
    meta.write_text(json.dumps(manifest))


def _writer_killed(out: Path) -> None:
    """A writer holding the store's lock killed with -9 (a fresh process): its lock file stays, naming it."""
    from depthlens.stores.lock import lock_path
    from depthlens.stores.samples import samples_path, stored_format

    samples = samples_path(out, stored_format(out))
    code = (
        "import os, sys; from pathlib import Path; from depthlens.stores.lock import store_lock\n"
        "with store_lock(Path(sys.argv[1])): os.kill(os.getpid(), 9)"
    )
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    assert subprocess.run([sys.executable, "-c", code, str(samples)], env=env, timeout=60).returncode == -9
    assert "pid" in lock_path(samples).read_text()


def _short_shard(out: Path) -> None:
    """A shard deleted with its entry and the manifest's ``committed`` count edited to match: the store reads
    whole, one response short of its questions × pool."""
    meta = _manifest_of(out)
    manifest = json.loads(meta.read_text())
    gone = manifest["shards"].pop()
    (out / SHARDS / gone["file"]).unlink()
    manifest["committed"] = {"records": RECORDS - gone["rows"], "shards": len(manifest["shards"])}
    meta.write_text(json.dumps(manifest))


def _short_line(out: Path) -> None:
    """The last line removed and the manifest's ``committed`` entry made to match what is left."""
    from depthlens.stores.commits import Running

    _last_line_dropped(out)
    meta = _manifest_of(out)
    manifest = json.loads(meta.read_text())
    manifest["committed"] = Running.of(out / SAMPLES).entry()
    meta.write_text(json.dumps(manifest))


def _entry_outside(absolute: bool) -> Callable[[Path], None]:
    """The first shard moved out of the store and its manifest entry pointed at it: through ``..``, or absolute."""

    def damage(out: Path) -> None:
        meta = _manifest_of(out)
        manifest = json.loads(meta.read_text())
        entry = manifest["shards"][0]
        outside = out.parent / "outside"
        outside.mkdir(exist_ok=True)
        (out / SHARDS / entry["file"]).replace(outside / entry["file"])
        entry["file"] = str(outside / entry["file"]) if absolute else f"../../outside/{entry['file']}"
        meta.write_text(json.dumps(manifest))

    return damage


def _shard_symlinked_outside(out: Path) -> None:
    """The first shard moved out of the store, a symlink to it left in its place (its bytes the committed ones)."""
    shard = sorted((out / SHARDS).glob("part-*.parquet"))[0]
    outside = out.parent / "outside"
    outside.mkdir(exist_ok=True)
    shard.replace(outside / shard.name)
    shard.symlink_to(outside / shard.name)


def _top_probs(value: float) -> Callable[[dict[str, Any]], None]:
    """Every layer of the first token given K probabilities of ``value`` each (in [0, 1], non-increasing)."""

    def change(record: dict[str, Any]) -> None:
        probs = record["layer_top_probs"]
        probs[0] = [[value] * len(layer) for layer in probs[0]]

    return change


def _one_id_k_times(record: dict[str, Any]) -> None:
    """The first token's first layer holding its first id K times."""
    ids = record["layer_top_ids"]
    ids[0][0] = [ids[0][0][0]] * len(ids[0][0])


RECORD_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "a response to a question the store lacks": _set(id="q9#0", question_id="q9"),
    "a sample index ≥ the pool": _set(id="q0#5", sample=5),
    "an id whose #k disagrees with its sample": _set(id="q0#1"),
    "token_count 99 for 4 tokens": _set(token_count=99),
    "a negative seed": _set(seed=-1),
    "deep flags inverted": _inverted,
    "dtr contradicting its flags": _set(dtr=1.0),
    "a layer's top-3 probabilities [0.9] * 3 (summing to 2.7)": _top_probs(0.9),
    "a layer's top-3 holding one id 3 times": _one_id_k_times,
}
DAMAGES: dict[tuple[str, str], Callable[[Path], None] | None] = {
    **{("jsonl", name): _edit(change) for name, change in RECORD_EDITS.items()},
    **{("parquet", name): _row(change) for name, change in RECORD_EDITS.items()},
    ("jsonl", "status key renamed"): _edit(_renamed_status),
    ("jsonl", 'a count as a string ("4")'): _edit(_set(token_count="4")),
    ("jsonl", '"correct": "yes"'): _edit(_set(correct="yes")),
    ("jsonl", "a token id of 10^30"): _edit(_set(token_ids=[10**30, 1, 2, 3])),
    ("parquet", "a token id past the vocabulary"): _row(_set(token_ids=[10**6, 1, 2, 3])),
    ("jsonl", "a lone surrogate"): _edit(_set(text="\ud800")),
    ("parquet", "text bytes that are not UTF-8"): _not_utf8,
    ("jsonl", "text bytes that are not UTF-8"): _line_bytes(b"\xff\xfe"),
    # Python's JSON reader takes a surrogate's bytes (as CESU-8 writes one) for the lone surrogate itself
    ("jsonl", "a lone surrogate's bytes"): _line_bytes(b"\xed\xa0\x80"),
    ("jsonl", "responses cut to 0 bytes"): _emptied,
    ("jsonl", "responses cut at a line boundary"): _last_line_dropped,
    ("jsonl", "the last line cut mid-line"): _cut_mid_line,
    ("jsonl", "a line repeated"): _line_repeated,
    ("parquet", "a column renamed by a footer bit flip"): lambda out: _footer_bit_flip(out, 0),
    ("parquet", "a column chunk's path renamed by a footer bit flip"): lambda out: _footer_bit_flip(out, 1),
    ("parquet", "the run's settings in a footer changed by a bit flip"): _settings_bit_flip,
    ("parquet", "a shard deleted with its manifest entry"): _shard_and_entry_removed,
    ("parquet", "manifest n_layers off by one"): _one_layer_more,
    ("jsonl", "manifest n_layers off by one"): _one_layer_more,
    ("parquet", "the manifest deleted"): _manifest_deleted,
    ("jsonl", "the manifest deleted"): _manifest_deleted,
    ("parquet", "a stale lock after kill -9"): _writer_killed,
    ("jsonl", "a stale lock after kill -9"): _writer_killed,
    (
        "parquet",
        "a shard and its entry removed, committed edited to match",
    ): _short_shard,
    ("jsonl", "the last line removed, committed edited to match"): _short_line,
    ("parquet", "a manifest entry through .."): _entry_outside(absolute=False),
    ("parquet", "a manifest entry with an absolute path"): _entry_outside(absolute=True),
    ("parquet", "a committed shard replaced by a symlink to a file outside"): _shard_symlinked_outside,
    ("parquet", "none"): None,
    ("jsonl", "none"): None,
}
READ = {"a stale lock after kill -9", "none"}  # every door reads these stores whole
# whole records, fewer than the run set out to write: every door reads them and says so in one line, once
SHORT = {
    "a shard and its entry removed, committed edited to match",
    "the last line removed, committed edited to match",
}
# Parquet readers find a column by its schema element, not by the chunk's path: the records read are the very
# ones committed; only the sha256 sees the changed bytes — check's (without --quick) and regrade's, which
# verifies what it rewrites
HASHED = {"a column chunk's path renamed by a footer bit flip"}
VERIFIES = {"check", "regrade"}
CHECKS = ("check", "check --quick")
ESCAPED = {
    "a lone surrogate",
    "a lone surrogate's bytes",
}  # export writes it escaped (the other doors refuse)


# ---- the doors: each answers (refused, what it said) and asserts its exit code and no traceback ------------


class Doors:
    """Every door, run over one store; ``said`` keeps each door's words for the assertions."""

    def __init__(self, out: Path, fmt: str, tmp: Path, monkeypatch: Any, capsys: Any) -> None:
        self.out, self.fmt, self.tmp = out, fmt, tmp
        self.monkeypatch, self.capsys = monkeypatch, capsys
        self.said: dict[str, tuple[bool, str]] = {}

    def cli(self, door: str, *args: object, refused_code: int = 2) -> None:
        code, out, err = run(self.monkeypatch, self.capsys, *args)
        text = " ".join((out + err).split())
        assert "Traceback" not in text, (door, text)
        short = (3,) if door.startswith("check") else ()  # check's exit status for a store cut short
        assert code in (0, None, refused_code, *short), (door, code, text)
        self.said[door] = (code == refused_code, text)

    def python(self, door: str, read: Callable[[], int], records: int = RECORDS) -> None:
        from depthlens.stores import shortfall

        shortfall.forget()  # each door says it once
        warned: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
        logger = logging.getLogger("depthlens.stores")
        logger.addHandler(handler)
        try:
            rows = read()
        except DepthlensError as exc:  # anything else is a traceback, and fails the test
            self.said[door] = (True, " ".join(str(exc).split()))
            return
        finally:
            logger.removeHandler(handler)
            self.capsys.readouterr()  # what it printed (progress, the CLI's warning lines) is not the next door's
        assert rows == records, (door, rows)
        self.said[door] = (False, " ".join([f"{rows} rows", *warned]))

    def explorer(self, records: int = RECORDS) -> None:
        """The explorer's API: every response opened, then the page's notices (never a 500: the client raises)."""
        from depthlens.view.app import Explorer, make_app
        from depthlens.view.store import open_store

        explorer = Explorer.of(open_store(self.out))
        api = TestClient(make_app(explorer))
        for rid in list(explorer.store.by_id):
            assert api.get("/api/response", params={"id": rid}).status_code in (200, 400, 404)
        answer = api.get("/api/run")
        assert answer.status_code == 200
        notices = " ".join(" ".join(n.split()) for n in answer.json()["notices"])
        shown = len(explorer.store.by_id)
        self.said["explorer"] = (bool(notices), notices or f"{shown} records shown")
        if not notices:
            assert shown == records

    def run_all(self, records: int = RECORDS) -> None:
        from depthlens.api.pools import responses
        from depthlens.api.votes import think_at_n

        store = self.out / SHARDS if self.fmt == "parquet" else self.out / SAMPLES
        self.cli("check", "check", self.out, refused_code=1)
        self.cli("check --quick", "check", "--quick", self.out, refused_code=1)
        exported = self.tmp / "export.jsonl"
        self.cli("export", "export", store, "--out", exported)
        if self.said["export"][0]:
            assert not exported.exists()
        else:
            self.exported = exported.read_text(encoding="utf-8").splitlines()
        self.cli("thinkn --from", "thinkn", "--from", self.out, "--n", "2", "--trials", "2")
        self.cli("report", "report", self.out, "--bootstrap", "10", "--seeds", "1")
        corr = ["--no-sweeps", "--bootstrap", "10", "--seeds", "1"]
        self.cli("correlate", "correlate", self.out, "--out", self.tmp / "correlate", *corr)
        self.python("python responses", lambda: responses(self.out).num_rows, records)
        self.python(
            "python think_at_n", lambda: think_at_n(self.out, n=1, trials=2).num_rows and records, records
        )
        self.explorer(records)
        self.cli("regrade", "regrade", self.out)  # last: where it reads, it writes


def _whole_export(whole: Path, fmt: str, tmp: Path, monkeypatch: Any, capsys: Any) -> list[str]:
    """The lines ``export`` writes of the undamaged store."""
    target = tmp / "whole.jsonl"
    code, _, err = run(
        monkeypatch, capsys, "export", whole / (SHARDS if fmt == "parquet" else SAMPLES), "--out", target
    )
    assert code in (0, None), err
    return target.read_text(encoding="utf-8").splitlines()


def _files(out: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("fmt", "damage"), list(DAMAGES), ids=[f"{f}: {d}" for f, d in DAMAGES])
def test_every_door_agrees_on_each_damage(made, tmp_path, monkeypatch, capsys, fmt, damage):
    from depthlens.stores.check import check

    out = tmp_path / fmt
    shutil.copytree(made / fmt, out)
    change = DAMAGES[(fmt, damage)]
    if change is not None:
        change(out)
    reports = check(out)
    problems = [p for report in reports for p in report.problems]
    before = _files(out)
    doors = Doors(out, fmt, tmp_path, monkeypatch, capsys)
    if damage in SHORT:
        (report,) = reports
        assert not problems and report.incomplete, report
        _every_door_says_the_shortfall(doors, report.incomplete, RECORDS - 1)
        return
    doors.run_all()
    said = doors.said
    if damage in READ | HASHED:
        assert not problems if damage in READ else [p.kind for p in problems] == ["changed"], problems
        for door, (refused, text) in said.items():
            assert refused == (damage in HASHED and door in VERIFIES), (door, text)
            assert not refused or str(problems[0].path) in text, (door, text)
        assert "being written now" not in said["check"][1]  # the killed writer holds nothing
        assert doors.exported == _whole_export(made / fmt, fmt, tmp_path, monkeypatch, capsys)
        return
    assert problems, f"check says ok on {damage!r}"
    counted = [re.search(r"(\d+) shard\(s\), (\d+) committed|(\d+) record\(s\)", said[d][1]) for d in CHECKS]
    assert counted[0] and counted[1] and counted[0].groups() == counted[1].groups(), (
        said
    )  # whole records alike
    where = str(problems[0].path)  # the file (and line or row) check names first
    for door, (refused, text) in said.items():
        if door == "export" and damage in ESCAPED:
            assert not refused and "record 'q0#0' (text) held a lone surrogate" in text
            assert "\\ud800" in doors.exported[0]
            continue
        assert refused, (door, text)
        assert where in text, (door, where, text)
    assert _files(out) == before  # a refusal changes nothing


def _every_door_says_the_shortfall(doors: Doors, line: str, records: int) -> None:
    """Every door reads the store's whole records (none refuses: check exits 3, the others 0) and says ``line`` —
    ``check``'s — once: the commands on stderr, the Python verbs as a warning, the explorer as a notice."""
    assert (
        line.endswith("`--resume` finishes it, or it was cut by hand") and f"{records} of {RECORDS}" in line
    )
    doors.run_all(records)
    for door, (refused, text) in doors.said.items():
        assert not refused or (door == "explorer" and text == line), (door, text)  # the explorer: its notice
        assert text.count(line) == 1, (door, line, text)
    assert "ok: every committed record is whole" not in doors.said["check"][1]
    assert doors.exported and len(doors.exported) == records


def test_check_says_a_store_cut_short_with_its_own_exit_status(made, tmp_path, monkeypatch, capsys):
    """Exit 3: whole records, fewer than questions × pool; 1 (damaged) wins where both are true; 0 once the run is
    resumed (its remedy, followed)."""
    from depthlens.models.load import wrap
    from depthlens.studies.generate import generate
    from tests.conftest import CharTokenizer, tiny_model

    out = tmp_path / "parquet"
    shutil.copytree(made / "parquet", out)
    _short_shard(out)
    code, text, _ = run(monkeypatch, capsys, "check", out)
    assert code == 3 and f"{out}: incomplete, 3 of 4 responses (2 questions × pool 2)" in text, text
    _row(_set(seed=-1))(out)  # damaged too: the damage is what check says first
    assert run(monkeypatch, capsys, "check", out)[0] == 1
    shutil.rmtree(out)
    shutil.copytree(made / "parquet", out)
    _short_shard(out)
    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    readout = ReadoutConfig(layer_top_k=TOP_K)
    generate(
        lm,
        GenerateRun(StoreSpec(out, True), pool=2, seed=5, sampling=SAMPLING, batch_size=1, readout=readout),
        QUESTIONS,
    )
    code, text, _ = run(monkeypatch, capsys, "check", out)
    assert code in (0, None) and "ok: every committed record is whole" in text, text


def test_a_store_reaching_outside_itself_is_refused_before_any_read(made, tmp_path, monkeypatch):
    """No reader opens the file a `..` entry or a symlinked shard points at: refused by name first."""
    import pyarrow.parquet as pq

    from depthlens.stores.samples import read_responses

    opened: list[str] = []
    real = pq.read_table

    def read_table(source: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(source))
        return real(source, *args, **kwargs)

    for damage in (_entry_outside(absolute=False), _shard_symlinked_outside):
        out = tmp_path / damage.__name__ / "parquet"
        shutil.copytree(made / "parquet", out)
        damage(out)
        monkeypatch.setattr(pq, "read_table", read_table)
        with pytest.raises(DepthlensError, match="a store holds its own files"):
            list(read_responses(out))
        monkeypatch.undo()
        assert not [o for o in opened if "outside" in o or "part-000000" in o], opened


@pytest.mark.parametrize("damage", [_settings_bit_flip, _not_utf8])
def test_a_damaged_shard_is_mended_by_the_remedy_every_door_gives(made, tmp_path, damage):
    """The shard, not the manifest, is named (a flipped footer: its run's other shards say what the manifest
    says; texts that are not UTF-8), and its remedy, followed — `--resume` — sets it aside and computes its record
    again: the store is whole."""
    from depthlens.models.load import wrap
    from depthlens.stores.check import check
    from depthlens.studies.generate import generate
    from tests.conftest import CharTokenizer, tiny_model

    out = tmp_path / "parquet"
    shutil.copytree(made / "parquet", out)
    damage(out)
    (problem,) = [p for report in check(out) for p in report.problems]
    assert problem.path.name == "part-000000.parquet" and "--resume" in problem.remedy, problem
    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    readout = ReadoutConfig(layer_top_k=TOP_K)
    generate(
        lm,
        GenerateRun(StoreSpec(out, True), pool=2, seed=5, sampling=SAMPLING, batch_size=1, readout=readout),
        QUESTIONS,
    )
    assert not [p for report in check(out) for p in report.problems]
