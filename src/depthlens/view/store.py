"""A store opened for viewing: which kind it is, its settings, its records' light fields, and what is damaged.

Kinds (docs/architecture.md, the sample store): a *sample store* (``generate`` / ``thinkn --out`` / an online
run: ``questions.jsonl``, ``samples/`` or ``samples.jsonl`` with its manifest, maybe ``online.jsonl`` and
``thinkn-*.json`` summaries) and a *score store* (``score``: a Parquet store directory, or a ``.jsonl`` file with
its ``.manifest.json`` beside it). A path that is neither is refused, naming both, before any server starts.

A damaged store opens: the manifest is read with the library's own readers and checks (``stores.samples.read_manifest``,
``stores.parquet.store_manifest``); where they refuse, the refusal becomes a notice and the settings are taken
from what is left (a shard's own recorded settings, the divergences' width). Only the records' light fields are
held (``access``); everything per token is read when a response is opened.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import DTRConfig
from depthlens.errors import DepthlensError
from depthlens.sampling.backend import PER_TOKEN
from depthlens.stores import samples
from depthlens.stores.access import Location, ParquetSource
from depthlens.stores.files import manifest_path
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.jsonl_access import JsonlSource
from depthlens.stores.layout import Problem, manifest_file
from depthlens.stores.meaning import Facts
from depthlens.stores.meaning import record_problem as meaning_problem
from depthlens.stores.records import id_problem, wrong_fields
from depthlens.stores.samples import SAMPLES
from depthlens.stores.shortfall import shortfall
from depthlens.stores.state import manifest_state
from depthlens.stores.validate import bounds, record_fault
from depthlens.studies.online import DECISIONS
from depthlens.view.sources import (
    TRACE,
    Kind,
    identify,
    manifest_dtr,
    open_samples,
    open_scores,
    read_loose,
    stored_layers,
)

LIGHT_REQUIRED = tuple(k for k in samples.REQUIRED if k not in PER_TOKEN and k != "divergence")
"""The fields every usable response holds that the explorer holds for every record (its light fields): checked
for every record at open, so a column renamed in a shard is named before any response is opened."""


@dataclasses.dataclass
class Question:
    """A sample store's question: its gold answer (from ``questions.jsonl``) and its records in store order."""

    id: str
    gold: str | None = None
    text: str | None = None
    choices: list[str] = dataclasses.field(default_factory=list)
    records: list[int] = dataclasses.field(default_factory=list)  # indices into ``ViewStore.records``


@dataclasses.dataclass
class ViewStore:
    path: Path
    kind: Kind
    manifest: dict[str, Any]
    source: ParquetSource | JsonlSource
    notices: list[str]
    records: list[dict[str, Any]]  # light fields of every readable record, in store order
    locations: list[Location]
    by_id: dict[str, int]
    n_layers: int | None
    dtr: DTRConfig
    questions: dict[str, Question] = dataclasses.field(default_factory=dict)
    online: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # online.jsonl by question
    state: str | None = (
        None  # the committed state shown (``stores.state``): a Parquet store's, from its manifest
    )

    def read(self, index: int, columns: list[str] | None = None) -> dict[str, Any]:
        """Record ``index`` with its per-token columns (``columns``: those wanted; None = all); what every reader
        refuses in it (a value out of its range, a field missing, values against each other or the manifest)
        becomes a notice naming the record, the field and the readers' remedy."""
        record = self.source.read(self.locations[index], columns)
        for name in CUBES:  # one (T, L, K) array, from JSONL's nested lists too
            if record.get(name) is not None:
                record[name] = cube(record[name])
        self.flag(index, record, columns)
        return record

    def flag(self, index: int, record: dict[str, Any], columns: list[str] | None = None) -> None:
        """Notice what every reader refuses in record ``index``: ``record`` holds its fields ``columns`` (None:
        all of them), read whole; its light fields are added."""
        fault = record_fault(record, bounds(self.manifest))
        meant = None if fault is not None else meaning_problem(record, self._facts)
        record = {**self.records[index], **record}
        if fault is not None or meant is not None:
            said = (
                fault.detail(record.get("id"))
                if fault is not None
                else f"record {record.get('id')!r}: {meant} — the record is damaged"
            )
            where = self.source.where(
                self.locations[index]
            )  # the file and line, or shard and row, check names
            wrong: str | None = (
                f"{where}: {said}: every reader (export, thinkn --from, report) refuses this "
                f"store; `depthlens check {self.path}` lists it with its remedy"
            )
        else:
            problem = self._problem(index, record, columns)
            wrong = (
                None
                if problem is None
                else f"{problem.message()} — every reader (export, thinkn --from, report) refuses this store"
            )
        if wrong is not None and wrong not in self.notices:
            self.notices.append(wrong)

    def _problem(self, index: int, record: dict[str, Any], columns: list[str] | None) -> Problem | None:
        """What the readers' one validation (``samples.response_problem``) refuses in a sample store's record,
        or None; only where the manifest is one the readers read (else its own notice says so)."""
        if self.kind != "samples" or self._manifest_refused:
            return None
        whole = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in record.items()}
        fields = [k for k in samples.REQUIRED if columns is None or k in columns or k in LIGHT_REQUIRED]
        where = self.source.where(self.locations[index])
        against = self._against
        if columns is not None and "layer_top_ids" not in columns:
            # each layer's top-k was not read: its absence says nothing about the store
            readout = against.get("readout")
            if isinstance(readout, dict) and readout.get("layer_top_k"):
                against = {**against, "readout": {**readout, "layer_top_k": 0}}
        return samples.response_problem(self.path, where, whole, against, fields)

    @functools.cached_property
    def _against(self) -> dict[str, Any]:
        return samples.checked_against(self.manifest)

    @functools.cached_property
    def _facts(self) -> Facts:
        return Facts.of(self.manifest)

    @functools.cached_property
    def _manifest_refused(self) -> bool:
        return bool(wrong_fields(self.manifest))

    def read_rows(self, indices: list[int], columns: list[str] | None = None) -> list[dict[str, Any]]:
        """Several records at once (each shard's row group read once)."""
        return self.source.read_rows([self.locations[i] for i in indices], columns)

    def usable(self, question: str) -> list[int]:
        """A question's responses voting uses (``studies.thinkn.load_pools``: all but failed ones), in store order."""
        return [i for i in self.questions[question].records if self.records[i].get("status") != "failed"]


CUBES = ("layer_top_ids", "layer_top_probs")  # per read-out token, per layer, K values (--layer-top-k)


def cube(value: Any) -> np.ndarray:
    """A stored [T][L][K] field as one numeric (T, L, K) array, whether it came as nested lists (JSONL) or as
    numpy arrays of arrays (the Arrow reader's nested lists)."""
    array = np.asarray(value)
    if array.dtype != object:
        return array
    return np.stack([cube(v) for v in array]) if len(array) else np.zeros((0, 0, 0))


def open_store(path: Path) -> ViewStore:
    """Open ``path`` for viewing (see the module docstring); InputError when it is not a store."""
    kind, root = identify(path.expanduser())
    notices: list[str] = []
    if kind == "samples":
        manifest, source = open_samples(root, notices)
    elif kind == "tcb":
        manifest, source = read_loose(manifest_path(root / TRACE)), JsonlSource(root / TRACE, notices)
    else:
        manifest, source = open_scores(root, notices)
    records, locations, by_id = _light_records(source, root, notices)
    n_layers = manifest.get("n_layers")
    n_layers = n_layers if isinstance(n_layers, int) else None
    if n_layers is None and kind != "tcb":
        n_layers = stored_layers(source)
    store = ViewStore(
        root,
        kind,
        manifest,
        source,
        notices,
        records,
        locations,
        by_id,
        n_layers,
        manifest_dtr(manifest, notices),
    )
    store.state = _state(manifest, source)
    if kind == "samples":
        _check_responses(store)
        _read_questions(store)
        _read_online(store)
    elif kind == "tcb":
        for i, record in enumerate(store.records):  # the trace's summary beside its id (one record)
            summary = (store.read(i).get("rows") or {}).get("summary") or {}
            record.update({k: v for k, v in summary.items() if not isinstance(v, dict | list)})
    note = unfinished(store)
    if note is not None:
        store.notices.append(note)
    return store


def _light_records(
    source: ParquetSource | JsonlSource, root: Path, notices: list[str]
) -> tuple[list[dict[str, Any]], list[Location], dict[str, int]]:
    """Every record's light fields, where it is and its index by id: one per id (a record without an id, or a
    repeat of one, is left out and said in ``notices``)."""
    records: list[dict[str, Any]] = []
    locations: list[Location] = []
    by_id: dict[str, int] = {}
    missing_id, twice = 0, []
    for location, record in source.scan():
        if not isinstance(record.get("id"), str | int):
            missing_id += 1
            continue
        if str(record["id"]) in by_id:  # what every reader refuses: shown once, with the readers' notice
            if not (id_problem(record) or id_problem(records[by_id[str(record["id"])]])):
                twice.append((str(record["id"]), source.where(location)))  # (an edited id: its own check)
            continue
        by_id[str(record["id"])] = len(records)
        records.append(record)
        locations.append(location)
    if missing_id:
        notices.append(f"{missing_id} record(s) without an id; not shown")
    if twice:
        notices.append(
            f"id {twice[0][0]!r}{f' and {len(twice) - 1} more' if len(twice) > 1 else ''} held twice (again at "
            f"{twice[0][1]}: a line repeated or a shard copied): every reader (export, thinkn --from, report) "
            f"refuses this store, `depthlens check {root}` lists each with its remedy; shown once"
        )
    return records, locations, by_id


def _check_responses(store: ViewStore) -> None:
    """At open, what every reader refuses and the explorer can see without reading the store whole: each record's
    light fields (a column renamed in a shard's footer, an id against its sample), then the first usable record
    whole (a manifest's ``n_layers`` or readout edited). Stops at the first, as the readers do; a record's own
    per-token faults are named when it is opened (``ViewStore.read``)."""
    held = len(store.notices)
    for index, record in enumerate(store.records):
        store.flag(index, record, columns=[])
        if len(store.notices) > held:
            return
    usable = next((i for i, r in enumerate(store.records) if r.get("status") == "ok"), None)
    if usable is not None:
        try:
            store.read(usable)
        except (OSError, LookupError):  # an unreadable shard: its notice is already shown
            return


def unfinished(store: ViewStore) -> str | None:
    """Whether the run that wrote ``store`` is still writing it (a command holds its lock: ``stores.lock.writer``)
    or ended before its work was done — interrupted, killed, out of memory, or cut by hand: fewer responses than its
    manifest's questions × pool (an online run: fewer questions decided; a score run: fewer records than the
    inputs it hashed) — in the words every reader says it (``stores.shortfall``). None: a finished run."""
    if store.kind == "scores":
        results, out_dir = store.path, None
    elif store.kind == "samples":
        sharded = isinstance(store.source, ParquetSource)
        results, out_dir = store.path / (samples.SHARDS if sharded else SAMPLES), store.path
    else:
        return None
    line = shortfall(results, store.manifest, len(store.records), out_dir)
    if line is not None and " so far: " in line:  # being written: what this page shows is a snapshot
        return f"{line}; shown is what was committed when this page opened"
    return line


def _read_questions(store: ViewStore) -> None:
    """Gold answers from ``questions.jsonl`` and each question's records, in the manifest's order."""
    order = [str(q) for q in store.manifest.get("questions", []) if isinstance(q, str | int)]
    store.questions = {q: Question(q) for q in order}
    path = store.path / samples.QUESTIONS
    try:
        for row in iter_jsonl(path):
            q = store.questions.setdefault(str(row.get("id")), Question(str(row.get("id"))))
            q.gold, q.text = _text(row.get("answer")), _text(row.get("question"))
            q.choices = [str(c) for c in row.get("choices") or []]
    except (OSError, DepthlensError) as exc:
        store.notices.append(f"{path}: {exc}; gold answers are not shown where it was not read")
    for i, record in enumerate(store.records):
        qid = str(record.get("question_id"))
        store.questions.setdefault(qid, Question(qid)).records.append(i)


def _read_online(store: ViewStore) -> None:
    """An online run's decisions (``online.jsonl``): per question, where each response was stopped and why."""
    path = store.path / DECISIONS
    if not path.is_file():
        return
    try:
        for line in iter_jsonl(path):
            store.online[str(line.get("id"))] = line
    except DepthlensError as exc:
        store.notices.append(f"{exc} — the online decisions after it are not shown")


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _state(manifest: dict[str, Any], source: ParquetSource | JsonlSource) -> str | None:
    """The fingerprint of the snapshot read, where it is cheap: a Parquet store's, from the manifest read at open
    (a JSONL store's is a hash of the whole file: not computed here)."""
    if not isinstance(source, ParquetSource) or not isinstance(manifest.get("shards"), list):
        return None
    try:
        return manifest_state(manifest, source.directory)
    except (AttributeError, TypeError, OSError):  # a damaged manifest's entries
        return None


def changed_since(store: ViewStore) -> str | None:
    """What a writer committed since the page opened (None: nothing): the page keeps showing its snapshot, and
    says so. A Parquet store's manifest is read again (small), a JSONL file's size and identity are looked at."""
    source = store.source
    if isinstance(source, ParquetSource):
        if store.state is None:
            return None
        now = _state(read_loose(manifest_file(source.directory)), source)
        if now in (None, store.state):
            return None
        return (
            f"the store has committed a new state ({now}) since this page opened ({store.state}); shown is "
            "the state as it was — restart `depthlens view` to see the new one"
        )
    try:
        stat = source.path.stat()
    except OSError:
        return f"{source.path} is gone since this page opened; shown is what was read then"
    if source.changed(stat):
        return (
            f"{source.path} has changed since this page opened (a writer appended or rewrote it); shown is "
            "what was committed then — restart `depthlens view` to see the rest"
        )
    return None
