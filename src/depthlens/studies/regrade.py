"""Re-grade a sample store under the current answer rules, without the model (docs/definitions.md §5).

Each stored response keeps its text and finish, so its answer can be read again: ``regrade_store`` rebuilds the
task's questions (reasoning-gym regenerates its entries from the manifest's seed and config, so the dataset's
``score_answer`` gets the real entry; other tasks are read back from ``questions.jsonl``), re-extracts and
re-grades every response, and rewrites the responses atomically: ``samples.jsonl`` as a temporary file, fsynced,
renamed over it; a sharded ``samples/`` store as new shards committed by its manifest
(``parquet_store.rewrite_store``). It is also the migration of a store written before one name per quantity:
its records get today's names (``stores.names``) and the depth they lacked (``stores.samples.DEPTH_FIELDS``,
from their stored divergences with the manifest's DTR settings). Nothing is lost: each record appends the answer
fields it had before to its ``answer_history`` list, with the rules that produced them. The manifest records the
rules now in force (``answers``) and a ``regraded`` log. Every summary already in the store is recomputed with its
own voting settings. ``regrade_copy`` does all this to a copy, leaving the store as it was.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shutil
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from depthlens.config import AnswerConfig, DTRConfig, depth_prefix
from depthlens.errors import StoreError, named
from depthlens.evals.answers import RULES
from depthlens.evals.grading import ANSWER_FIELDS, AnswerSummary, answer_fields, store_answers
from depthlens.evals.loading import load_task, parse_task_config
from depthlens.evals.tasks import HUB_TASKS, Question, infer_answer_type
from depthlens.metrics.dtr import response_depth
from depthlens.stores.commits import COMMITTED, Running
from depthlens.stores.files import WriteFailed, manifest_path
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.lock import store_lock
from depthlens.stores.names import current_names
from depthlens.stores.samples import (
    DEPTH_FIELDS,
    QUESTIONS,
    read_manifest,
    read_responses,
    samples_path,
    stored_format,
)
from depthlens.stores.shard_writer import new_run_id, rewrite_store
from depthlens.studies.regrade_files import copy_store, write_together
from depthlens.studies.thinkn import stored_voting, summarise, summary_files

GRADED = ("answer", "answer_source", "vote_key", "grade", "correct", "task_score")


@dataclasses.dataclass(frozen=True)
class RegradeReport:
    """A store before and after: answers per source, grades, and how many responses changed."""

    store: Path
    rules_before: str
    rules_after: str
    answers: AnswerConfig
    before: AnswerSummary
    after: AnswerSummary
    grades_before: dict[str, int]
    grades_after: dict[str, int]
    responses: int
    changed_answer: int
    changed_grade: int
    summary_rewritten: bool
    wrong_references: dict[str, str] = dataclasses.field(default_factory=dict)  # question id -> why


def _stored_questions(store: Path) -> list[dict[str, Any]]:
    path = store / QUESTIONS
    if not path.is_file():
        raise StoreError(f"{store} has no {QUESTIONS}; it was not written by `depthlens generate`")
    return list(iter_jsonl(path))


def rebuild_questions(store: Path, manifest: dict[str, Any]) -> dict[str, Question]:
    """The store's questions as grading needs them: reasoning-gym ones regenerated (with their scorer and
    entry), and checked against the stored references; other tasks from ``questions.jsonl``."""
    stored = _stored_questions(store)
    task = manifest.get("task") or {}
    name = str(task.get("name", ""))
    if name.startswith("reasoning_gym:"):
        # By index, unchecked: a store may predate the reference check (ids 0..n-1, wrong references included)
        # or follow it (ids with gaps where questions were skipped); either way its own questions come back.
        indices = [
            int(str(r["id"]).rsplit("-", 1)[-1]) for r in stored if str(r["id"]).rsplit("-", 1)[-1].isdigit()
        ]
        generated = load_task(
            name,
            max(indices, default=len(stored) - 1) + 1,
            int(task.get("task_seed", 0)),
            None,
            parse_task_config(task.get("task_config")),
            check_references=False,
        )
        by_id = {q.id: q for q in generated}
        for row in stored:
            q = by_id.get(row["id"])
            if q is None or q.answer != row["answer"]:
                now = f"with answer {q.answer!r}" if q else "no such question"
                raise StoreError(
                    f"{store}: reasoning-gym now generates {row['id']} {now}, but the store holds "
                    f"{row['answer']!r}; regrade with the reasoning-gym version that wrote it"
                )
        return {row["id"]: by_id[row["id"]] for row in stored}
    plain = [r for r in stored if not r.get("choices")]
    default = (
        HUB_TASKS[name].answer_type if name in HUB_TASKS else infer_answer_type([r["answer"] for r in plain])
    )
    return {
        r["id"]: Question(
            r["id"],
            r["question"],
            r["answer"],
            tuple(r.get("choices") or ()),
            answer_type="letter" if r.get("choices") else r.get("answer_type", default),
        )
        for r in stored
    }


@dataclasses.dataclass
class _Regrader:
    """Re-reads one response's answer under ``rules`` (a callable for ``rewrite_store``), keeping what it had before
    in its ``answer_history`` and the answer fields before and after for the report."""

    samples: Path
    questions: dict[str, Question]
    rules: AnswerConfig
    rules_before: str
    timeout_s: int
    on_record: Callable[[], None]
    n_layers: int
    dtr: DTRConfig
    now: str = dataclasses.field(
        default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    )
    old: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    new: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    changed: Counter[str] = dataclasses.field(default_factory=Counter)

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        current_names(record)
        if record.get("status") == "failed":
            return record
        if any(k not in record for k in DEPTH_FIELDS) and "divergence" in record:
            record.update(
                response_depth(
                    record["divergence"],
                    self.n_layers,
                    self.dtr,
                    depth_prefix(self.dtr),
                    record.get("layer_top_ids"),
                )
            )
        question = self.questions.get(str(record.get("question_id")))
        if question is None or "text" not in record:
            raise StoreError(
                f"{self.samples}: response {record.get('id')!r}: "
                f"{'no text' if question else 'a question not in the store'}; "
                "cannot regrade it (the store is damaged or not from `depthlens generate`)"
            )
        fields = answer_fields(
            question, record["text"], record.get("finish", "eos"), self.rules, self.timeout_s
        )
        previous = {k: record.get(k) for k in GRADED}
        self.changed["answer"] += previous["vote_key"] != fields["vote_key"]
        self.changed["grade"] += previous["grade"] != fields["grade"]
        history = [
            *record.get("answer_history", []),
            {**previous, "rules": self.rules_before, "until": self.now},
        ]
        self.old.append({k: record.get(k) for k in ANSWER_FIELDS})
        record.update(fields, answer_history=history)
        self.new.append({k: record.get(k) for k in ANSWER_FIELDS})
        self.on_record()
        return record


def _rules(
    manifest: dict[str, Any], answer_type: str | None, fallback: str | None
) -> tuple[AnswerConfig, str]:
    """The rules a regrade reads the store under, and the rules that graded it so far."""
    settings, rules_before = store_answers(manifest)
    if "answers" not in manifest:
        settings = dataclasses.replace(AnswerConfig(), prompt_style=settings.prompt_style)
    asked: dict[str, Any] = {"answer_type": answer_type, "fallback": fallback}  # AnswerConfig checks each
    rules = dataclasses.replace(settings, **{k: v for k, v in asked.items() if v is not None})
    return rules, rules_before


def regrade_store(
    store: Path,
    answer_type: str | None = None,
    fallback: str | None = None,
    timeout_s: int = 5,
    on_record: Callable[[], None] = lambda: None,
    derived_from: dict[str, Any] | None = None,
) -> RegradeReport:
    """Re-extract and re-grade every response of ``store`` under the current rules; rewrite it in place.

    ``answer_type`` / ``fallback``: None keeps the store's own settings (a store from before the answer rules
    takes today's defaults: no fallback). The prompt style is the store's: it is how the model was asked.
    Holds the store's write lock throughout (a second writer is refused naming it). ``derived_from``: the store is
    a copy (``regrade_copy``) — it gets a run id of its own, and the manifest records its source.
    A write that fails (a full disk) says whether the regrade was committed (``WriteFailed``).
    """
    with store_lock(samples_path(store, stored_format(store))):
        try:
            return _regrade_locked(store, answer_type, fallback, timeout_s, on_record, derived_from)
        except WriteFailed:
            raise
        except OSError as exc:  # a file read or written beside the responses (questions, summaries)
            if exc.errno is None:
                raise
            raise WriteFailed(
                Path(exc.filename or store), exc, "run regrade again once the cause is mended"
            ) from None


def regrade_copy(
    store: Path,
    out: Path,
    answer_type: str | None = None,
    fallback: str | None = None,
    timeout_s: int = 5,
    on_record: Callable[[], None] = lambda: None,
) -> RegradeReport:
    """Copy ``store`` to ``out`` and regrade the copy (``regrade_store``); ``store`` is left as it was.

    One store's responses graded under two rules side by side — the same texts, no resampling — so every
    summary and table (thinkn, correlate, report) can be read under both. ``out`` must not exist yet. The store
    is read whole (every reader's checks) before anything is copied; the copy is a store of its own (a new run
    id; its manifest's ``derived_from`` names the source's run and path); a copy that fails is removed whole.
    """
    if out.exists():
        raise StoreError(
            f"{named('out')} {out} already exists; regrade into a new directory (the copy is made there)"
        )
    if out.resolve().is_relative_to(store.resolve()):
        raise StoreError(f"{named('out')} {out} lies inside the store {store}; give a directory outside it")
    samples = samples_path(store, stored_format(store))
    with store_lock(samples):  # no writer changes the store while it is read and copied
        manifest = read_manifest(store)  # a store, not any directory
        for _ in read_responses(store):  # every reader's checks: nothing damaged (or outside it) is copied
            pass
        copy_store(store, out)
    source = {"run_id": manifest.get("run_id"), "path": str(store.resolve()), "by": "regrade --out"}
    try:
        return regrade_store(out, answer_type, fallback, timeout_s, on_record, derived_from=source)
    except BaseException as exc:
        shutil.rmtree(out, ignore_errors=True)  # half a copy is no store: removed, the source untouched
        if isinstance(exc, WriteFailed):
            raise exc.keeping(
                f"the copy {out} was removed and {store} is as it was — {exc.remedy}, then run the same regrade again"
            ) from None
        raise


def _regrade_locked(
    store: Path,
    answer_type: str | None,
    fallback: str | None,
    timeout_s: int,
    on_record: Callable[[], None],
    derived_from: dict[str, Any] | None,
) -> RegradeReport:
    manifest = read_manifest(store)
    rules, rules_before = _rules(manifest, answer_type, fallback)
    questions = rebuild_questions(store, manifest)
    fmt = stored_format(store)
    samples = samples_path(store, fmt)
    dtr = DTRConfig.from_dict(manifest["dtr"])
    regrade = _Regrader(
        samples, questions, rules, rules_before, timeout_s, on_record, manifest["n_layers"], dtr
    )
    updated = {
        **manifest,
        "depth": manifest.get("depth", {"prefix": depth_prefix(dtr)}),
        "answers": {**rules.to_dict(), "rules": RULES},
        "regraded": [
            *manifest.get("regraded", []),
            {"at": regrade.now, "from_rules": rules_before, "rules": RULES, "command": " ".join(sys.argv)},
        ],
    }
    if derived_from is not None:  # a copy: a store of its own, whose shards are never taken for its source's
        updated.update(run_id=new_run_id(), derived_from=derived_from)
    if fmt == "parquet":  # new shards, then the manifest as the commit (stores.shard_writer.rewrite_store)
        for _ in read_responses(store):  # the readers' one validation first: a damaged store is refused whole
            pass
        rewrite_store(samples, updated, regrade)
    else:
        # the readers' checked read: a damaged record is refused, not regraded (nor a repeat regraded twice)
        lines = [
            json.dumps(regrade(record), ensure_ascii=False) + "\n" for _, record in read_responses(store)
        ]
        committed = Running()
        for line in lines:
            committed.add(line.encode("utf-8"))
        meta = [json.dumps({**updated, COMMITTED: committed.entry()}, indent=2, ensure_ascii=False) + "\n"]
        write_together({samples: lines, manifest_path(samples): meta}, store)
    old, new = regrade.old, regrade.new
    return RegradeReport(
        store,
        rules_before,
        RULES,
        rules,
        AnswerSummary.of(manifest, old),
        AnswerSummary.of(updated, new),
        dict(Counter(str(r["grade"]) for r in old)),
        dict(Counter(str(r["grade"]) for r in new)),
        len(new),
        regrade.changed["answer"],
        regrade.changed["grade"],
        _resummarise_committed(store),
        {q.id: q.reference_issue for q in questions.values() if q.reference_issue},
    )


def _resummarise_committed(store: Path) -> bool:
    """``_resummarise`` after the regrade's commit: a failure then (a full disk) says the regrade stands."""
    try:
        return _resummarise(store)
    except (StoreError, OSError) as exc:
        raise StoreError(
            f"{' '.join(str(exc).split())} — the regrade of {store} itself is committed; its summaries are of the "
            f"state before it: rerun `depthlens thinkn --from {store} --overwrite` (with each summary's settings) "
            "once that is mended"
        ) from None


def _resummarise(store: Path) -> bool:
    """Recompute every summary already in the store (``thinkn-*.json``, or a ``thinkn.json`` written before
    summaries were named by their settings) with the voting settings it was made with: it is stale otherwise."""
    from depthlens.voting.methods import METHODS

    paths = [*summary_files(store), *[p for p in [store / "thinkn.json"] if p.is_file()]]
    for path in paths:
        previous = json.loads(path.read_text())
        summarise(
            store,
            stored_voting(previous["voting"]),
            DTRConfig.from_dict(previous["dtr"]),
            [m for m in previous.get("methods_asked") or [] if m in METHODS] or None,
            with_ablation=bool(previous.get("ablation")),
            overwrite=True,
        )
    return bool(paths)
