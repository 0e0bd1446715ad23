"""Voting over a viewed sample store with the library's own code: the table ``thinkn --from`` prints, each
question's methods, and one draw's Think@n selection.

The pools are those ``thinkn.load_pools`` builds — every response but failed ones, in store order, as a
``Response`` with deep flags from the stored divergences under the store's g, ρ and deep rule — built from
columns read shard by shard: a shard's divergences go through ``settling_depth`` / ``deep_flags`` (the functions
``deep_from_divergence`` calls) in one call, and per response only what voting reads is kept: the deep flags
(a byte a token) and the stored self-certainty and confidence at the store's width, widened to float64 when a
method reads them, exactly as ``response_from_record`` widens them (tested equal to ``load_pools``). A JSONL
store's records go through ``response_from_record`` itself. ``trial_outcomes``, ``exact_outcomes`` (every
method's expectation over every draw), ``trials.draw`` and ``METHODS`` then vote: nothing of Think@n's selection
is written again here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import torch

from depthlens.config import DTRConfig, VotingConfig
from depthlens.errors import DepthlensError
from depthlens.evals.grading import AnswerSummary
from depthlens.metrics.dtr import deep_flags, settling_and_deep, settling_depth
from depthlens.stores.access import Location, ParquetSource, ShardArrays, release_unused
from depthlens.stores.jsonl_access import JsonlSource
from depthlens.stores.samples import REQUIRED
from depthlens.studies.comparisons import Comparison, control_comparison
from depthlens.studies.footprint import check_trials
from depthlens.studies.thinkn import compare_methods, response_from_record
from depthlens.view.jobs import Background
from depthlens.view.said import said
from depthlens.view.store import ViewStore
from depthlens.voting.exact import exact_outcomes
from depthlens.voting.methods import DRAW_SEEDED, METHODS, Response
from depthlens.voting.trials import MethodSummary, draw, per_question_accuracy, trial_outcomes

QUICK = tuple(m for m in METHODS if not m.startswith("deepconf"))
VOTING_COLUMNS = (
    "status",
    "question_id",
    "vote_key",
    "correct",
    "token_count",
    "divergence",
    "self_certainty",
    "confidence",
)


def voting_columns(dtr: DTRConfig) -> tuple[str, ...]:
    """The columns a vote reads: under the top-K rule each layer's stored top-k ids too (its depth settles from
    them, as ``response_from_record`` settles it)."""
    return VOTING_COLUMNS if dtr.top_k is None else (*VOTING_COLUMNS, "layer_top_ids")


@dataclasses.dataclass(frozen=True)
class Stored:
    """One response as the index keeps it: the ``Response`` fields, per-token floats at the store's width."""

    key: str | None
    correct: bool
    length: int
    deep: np.ndarray  # [R] bool
    self_certainty: np.ndarray  # [T] as stored
    confidence: np.ndarray

    def response(self) -> Response:
        f64 = np.float64
        return Response(
            self.key,
            self.correct,
            self.length,
            self.deep,
            np.asarray(self.self_certainty, f64),
            np.asarray(self.confidence, f64),
        )


class Pool(Sequence[Response]):
    """A question's responses, each made a ``Response`` (float64) only when voting reads it.

    Each read also yields the GIL (``time.sleep(0)``): voting runs for minutes on a large store, in pure Python on
    a background thread, and a page request waiting for the GIL would otherwise wait out the interpreter's 5 ms
    switch interval at every pyarrow or socket call it makes (measured: a response 0.2 s idle, ~1 s beside a vote).
    """

    def __init__(self, stored: list[Stored]) -> None:
        self._stored = stored

    def __len__(self) -> int:
        return len(self._stored)

    @overload
    def __getitem__(self, i: int) -> Response: ...
    @overload
    def __getitem__(self, i: slice) -> list[Response]: ...
    def __getitem__(self, i: int | slice) -> Response | list[Response]:
        time.sleep(0)
        if isinstance(i, slice):
            return [s.response() for s in self._stored[i]]
        return self._stored[i].response()


def shard_responses(shard: ShardArrays, n_layers: int, dtr: DTRConfig) -> list[Stored | None]:
    """Each row of a shard (``VOTING_COLUMNS``) as ``Stored``; None for a failed response."""
    lengths, rows = shard.lists["divergence"]  # rows: [all read-out tokens of the shard, L]
    rows = rows.astype(np.float32, copy=False)  # a float16 store widened, as response_from_record reads it
    if dtr.top_k is None:
        settled = settling_depth(torch.from_numpy(rows), dtr.g)
        deep = deep_flags(settled, n_layers, dtr.rho, dtr.deep_rule).numpy()
    else:
        deep = settling_and_deep(rows, n_layers, dtr, shard.lists["layer_top_ids"][1])[1].numpy()
    ends = np.cumsum(lengths)
    certainty, confidence = shard.row_values("self_certainty"), shard.row_values("confidence")
    status, key, correct, count = (shard.scalars[c] for c in ("status", "vote_key", "correct", "token_count"))
    out: list[Stored | None] = []
    for i in range(shard.rows):
        if status[i] == "failed":
            out.append(None)
            continue
        out.append(
            Stored(
                key[i],
                bool(correct[i]),
                int(count[i]),
                deep[ends[i] - lengths[i] : ends[i]],
                certainty[i],
                confidence[i],
            )
        )
    return out


class VotingIndex:
    """Every usable response of a sample store, built once in the background (``build``), then voted on."""

    def __init__(self, store: ViewStore) -> None:
        self.store = store
        self.total = (
            len(store.source.names) if isinstance(store.source, ParquetSource) else len(store.records)
        )
        self.done = 0
        self.ready = threading.Event()
        self.error: str | None = None
        self._stored: dict[int, Stored] = {}
        self._background = Background()

    def build(self, stop: threading.Event) -> None:
        """Read the voting columns of every record (shard by shard) into the index; ``stop`` ends it early."""
        store = self.store
        index = {loc: i for i, loc in enumerate(store.locations)}
        try:
            if store.n_layers is None:
                raise DepthlensError("the model's depth is unknown (no manifest and no divergences)")
            if isinstance(store.source, JsonlSource):
                self._build_jsonl(store.source, index, stop)
            else:
                self._build_parquet(store.source, index, stop)
        except (DepthlensError, ValueError, TypeError, KeyError, RuntimeError, OSError) as exc:
            self.error = f"the voting index could not be built ({type(exc).__name__}: {exc})"
        give_back_memory()
        self.ready.set()

    def _build_parquet(
        self, source: ParquetSource, index: dict[Location, int], stop: threading.Event
    ) -> None:
        columns = voting_columns(self.store.dtr)
        for part, shard in source.arrays(columns):
            if stop.is_set():
                return
            lacking = [c for c in columns if c not in shard.scalars and c not in shard.lists]
            if lacking:
                self._note(
                    f"{source.directory / source.names[part]}: lacks {lacking}; its responses do not vote"
                )
            else:
                for row, stored in enumerate(
                    shard_responses(shard, int(self.store.n_layers or 0), self.store.dtr)
                ):
                    if stored is not None and (i := index.get(Location(part, row))) is not None:
                        self._stored[i] = stored
            self.done += 1

    def _build_jsonl(self, source: JsonlSource, index: dict[Location, int], stop: threading.Event) -> None:
        skipped = 0
        for location, record in source.records():
            if stop.is_set():
                return
            self.done += 1
            if record.get("status") == "failed" or (i := index.get(location)) is None:
                continue
            if any(k not in record for k in REQUIRED):
                skipped += 1
                continue
            r = response_from_record(record, int(self.store.n_layers or 0), self.store.dtr)
            self._stored[i] = Stored(r.key, r.correct, r.length, r.deep, r.self_certainty, r.confidence)
        if skipped:
            self._note(f"{source.path}: {skipped} response(s) lack fields voting needs; they do not vote")

    def _note(self, line: str) -> None:
        if line not in self.store.notices:
            self.store.notices.append(line)

    def pools(self, n: int) -> tuple[dict[str, Pool], list[str]]:
        """The questions with ≥ n usable responses (as ``load_pools``), and the ids of those left out."""
        pools, excluded = {}, []
        for q in self.store.questions:
            stored = [self._stored[i] for i in self.store.usable(q) if i in self._stored]
            if len(stored) >= n:
                pools[q] = Pool(stored)
            else:
                excluded.append(q)
        return pools, sorted(excluded)

    def summaries(self, voting: VotingConfig, methods: Sequence[str] | None = None) -> list[MethodSummary]:
        """Each method's accuracy and cost over ``voting.trials`` draws and exactly over every draw
        (``voting.exact``), as ``thinkn --from`` (a method's numbers do not depend on which others run: the draws
        are seeded per trial and question)."""
        pools = self.pools(voting.n)[0]
        check_trials(
            voting, len(pools), list(methods or METHODS)
        )  # the trials' arrays fit, or the page says why
        return trial_outcomes(pools, voting, methods).summaries(exact_outcomes(pools, voting, methods))

    def vote(self, voting: VotingConfig) -> Vote:
        """Every method on every trial's draws (``trial_outcomes``, once) and over every draw (``exact_outcomes``):
        the table, each question's accuracy per method (the trials' means, what a question's draw shows) and the
        paired comparisons on the exact figures — what ``thinkn --from`` derives from the same outcomes."""
        pools = self.pools(voting.n)[0]
        check_trials(voting, len(pools), list(METHODS))
        outcomes, exact = trial_outcomes(pools, voting), exact_outcomes(pools, voting)
        accuracy = per_question_accuracy(outcomes)
        per_question = {
            q: {m: float(a[i]) for m, a in accuracy.items()} for i, q in enumerate(outcomes.questions)
        }
        control = control_comparison(exact.accuracy, seed=voting.seed)
        return Vote(
            outcomes.summaries(exact), per_question, compare_methods(exact, seed=voting.seed), control
        )

    def later(self, voting: VotingConfig, what: str) -> Any:
        """For ``voting``, computed in the background: ``quick`` (the table without the DeepConf rows, which cost
        most: their group confidences) or ``vote`` (everything, ``vote``). The result, a ``Failed`` when voting
        refused the settings, or None while it is computed."""
        jobs = {"quick": (0, lambda: self.summaries(voting, QUICK)), "vote": (1, lambda: self.vote(voting))}
        priority, compute = jobs[what]

        def attempt() -> Any:
            try:
                return compute()
            except DepthlensError as exc:  # e.g. a prefix longer than the store read out
                return Failed(said(exc))

        return self._background.later((voting, what), voting, priority, attempt)


@dataclasses.dataclass(frozen=True)
class Vote:
    """One vote over the store: the summaries (the table), accuracy per question per method, the paired table."""

    summaries: list[MethodSummary]
    per_question: dict[str, dict[str, float]]
    paired: list[Comparison]
    control: Comparison | None = None  # Think@n − random@n, as ``thinkn`` prints it under the paired table


@dataclasses.dataclass(frozen=True)
class Failed:
    """Voting refused these settings (its error, for the page)."""

    message: str


def give_back_memory() -> None:
    """Hand the pass's freed buffers back to the system: shard after shard of decompressed columns and settling
    tables leaves the allocators' free lists holding several times the index (measured over 60 shards: +216 MB
    for 21 MB kept; +56 MB beyond it after ``malloc_trim`` and Arrow's ``release_unused``)."""
    release_unused()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass


def answer_summary(store: ViewStore) -> AnswerSummary:
    """Where the store's usable answers came from: the notes ``thinkn --from`` prints under its table."""
    usable = [r for r in store.records if r.get("status") != "failed" and "question_id" in r]
    return AnswerSummary.of(store.manifest, usable)


def question_pool(store: ViewStore, question: str) -> list[tuple[int, Response]]:
    """A question's usable responses read now (record index, ``response_from_record``), in store order."""
    n_layers, indices = int(store.n_layers or 0), store.usable(question)
    out = []
    columns = voting_columns(store.dtr)
    for i, record in zip(indices, store.read_rows(indices, list(columns)), strict=True):
        if all(k in record for k in columns[2:]):
            out.append((i, response_from_record(record, n_layers, store.dtr)))
    return out


def drawn_questions(store: ViewStore, n: int) -> list[str]:
    """The questions ``run_trials`` draws from at this n, in its order (a question's draw seeds on its place)."""
    return sorted(q for q in store.questions if len(store.usable(q)) >= n)


def draw_detail(
    store: ViewStore, question: str, pool: list[tuple[int, Response]], voting: VotingConfig, trial: int
) -> dict[str, Any]:
    """Trial ``trial``'s draw of n from a question's pool and what every method made of it: its answer, whether
    right, its cost and the responses it kept (record indices) — ``trials.draw`` and ``METHODS``."""
    order = drawn_questions(store, voting.n)
    if question not in order or len(pool) < voting.n:
        return {
            "drawn": [],
            "methods": {},
            "note": f"fewer than n = {voting.n} usable responses: not voted on",
        }
    picks = draw(len(pool), voting.n, voting.seed, trial, order.index(question))
    drawn = [pool[p][1] for p in picks]
    methods = {}
    for name, method in METHODS.items():
        seeded = {"draw": (trial, order.index(question))} if name in DRAW_SEEDED else {}  # as trial_outcomes
        outcome = method(drawn, voting, **seeded)
        methods[name] = {
            "answer": outcome.answer,
            "accuracy": outcome.accuracy,
            "cost": round(outcome.cost, 1),  # random@n: an expectation
            "voted": outcome.voted,
            "subsets": outcome.subsets,  # random@n: an expectation over this many subsets, no one answer
            "kept": [pool[picks[k]][0] for k in outcome.kept],
        }
    return {"drawn": [pool[p][0] for p in picks], "methods": methods, "note": None}
