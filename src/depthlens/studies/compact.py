"""A store's responses as a compact per-response table, so that a study's numbers can be re-voted and re-tested
without the model or the store (docs/definitions.md §4–5, findings §6).

One row per usable response: its model, task and question, its text, its answer and grade under the store's
rules and under the final-result fallback (``correct_fallback``: the same text read again, no resampling), its
length and its depth (``dtr``, ``dtr_prefix``, ``mean_settling_depth``, as the store carries them). No per-token
values: a 30-question × 16-response store fits in a few hundred kB of CSV, small enough to commit under
docs/data and diff.

``table_one_from_rows`` re-derives Table 1's rows for the metrics the table holds (DTR, token count and its
reverse) with the study's own statistics (``studies.correlation.correlate``) — the check that a committed table
still says what the tables computed from the store said. ``compact_pools`` turns the rows back into the pools
voting reads (``voting.methods.Response``), so Think@n and every method that needs no per-token signal
(``COMPACT_METHODS``) votes from them exactly as from the store.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import PREFIX_TOKENS, CorrelationConfig, DTRConfig, depth_prefix
from depthlens.config.answers import Fallback
from depthlens.errors import InputError
from depthlens.evals.answers import vote_key
from depthlens.evals.grading import answer_fields, store_answers
from depthlens.stores.samples import iter_samples, read_manifest
from depthlens.studies.correlation import correlate
from depthlens.studies.pool_table import pool_row
from depthlens.studies.regrade import rebuild_questions
from depthlens.studies.tables import write_whole
from depthlens.voting.methods import Response

COLUMNS = (
    "model",
    "task",
    "id",
    "question_id",
    "question",
    "finish",
    "text",
    "answer",
    "correct",
    "answer_fallback",
    "correct_fallback",
    "token_count",
    "dtr",
    "dtr_prefix",
    "mean_settling_depth",
    "rules",
)
"""The compact table's columns; ``rules``: the store's rules and fallback (``correct``), then the fallback's."""

FLOAT_DIGITS = 6  # depth to 6 decimals: a ratio of ≤ 10^5 tokens is exact to well within it

# Table 1's metrics the compact table holds: name → its value from a row. ``dtr_prefix``: DTR over the first ℓ
# tokens, Think@n's ranking score (a row of its own beside ``correlate``'s whole-response DTR).
METRICS = {
    "dtr": lambda row: row["dtr"],
    "dtr_prefix": lambda row: row["dtr_prefix"],
    "token_count": lambda row: float(row["token_count"]),
    "reverse_token_count": lambda row: -float(row["token_count"]),
}


def _task_name(manifest: dict[str, Any]) -> str:
    # As Table 1 names it (studies.stored.Store.task): the reasoning-gym family without its prefix.
    return str((manifest.get("task") or {}).get("name", "?")).removeprefix("reasoning_gym:")


def compact_rows(store: Path, fallback: Fallback = "final-result") -> list[dict[str, Any]]:
    """The compact table of ``store``: one row per usable response, in the store's order (``COLUMNS``)."""
    manifest = read_manifest(store)
    rules, rules_name = store_answers(manifest)
    other = dataclasses.replace(rules, fallback=fallback)
    questions = rebuild_questions(store, manifest)
    dtr = DTRConfig.from_dict(manifest["dtr"])
    prefix = (manifest.get("depth") or {}).get("prefix", depth_prefix(dtr))
    n_layers = int(manifest["n_layers"])
    label = f"{rules_name} {rules.fallback}; {fallback}"
    rows = []
    for record in iter_samples(store):
        if record.get("status") == "failed":
            continue
        question = questions[str(record["question_id"])]
        if other == rules:
            again = {"answer": record.get("answer"), "correct": record.get("correct")}
        else:  # the same text read under the fallback
            again = answer_fields(question, record["text"], record.get("finish", "eos"), other)
        depth = pool_row(record, n_layers, dtr, prefix, as_stored=True)
        rows.append(
            {
                "model": manifest.get("model", "?"),
                "task": _task_name(manifest),
                "id": record["id"],
                "question_id": question.id,
                "question": question.question,
                "finish": record.get("finish", "eos"),
                "text": record["text"],
                "answer": record.get("answer"),
                "correct": bool(record["correct"]),
                "answer_fallback": again["answer"],
                "correct_fallback": bool(again["correct"]),
                "token_count": int(record["token_count"]),
                "dtr": depth["dtr"],
                "dtr_prefix": depth["dtr_prefix"],
                "mean_settling_depth": depth["mean_settling_depth"],
                "rules": label,
            }
        )
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{round(value, FLOAT_DIGITS):.{FLOAT_DIGITS}g}" if math.isfinite(value) else ""
    return str(value)


def write_compact(rows: Sequence[dict[str, Any]], out: Path) -> Path:
    """``rows`` as CSV (``COLUMNS``; gzip-compressed when ``out`` ends in .gz), written whole; empty cells are
    None, booleans 1/0."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([_cell(row.get(c)) for c in COLUMNS] for row in rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".gz":
        out.write_bytes(gzip.compress(text.getvalue().encode("utf-8"), mtime=0))
        return out
    return write_whole(out, text.getvalue())


def read_compact(path: Path) -> list[dict[str, Any]]:
    """A compact table back as rows with their types (ints, floats, booleans; None for empty cells)."""
    raw = (
        gzip.decompress(path.read_bytes()).decode("utf-8")
        if path.suffix == ".gz"
        else path.read_text("utf-8")
    )
    reader = csv.DictReader(io.StringIO(raw))
    missing = sorted(set(COLUMNS) - set(reader.fieldnames or ()))
    if missing:
        raise InputError(
            f"{path}: no column(s) {', '.join(missing)}; a compact table has {', '.join(COLUMNS)} "
            "(write one with examples/compact_table.py)"
        )
    rows = []
    for row in reader:
        typed: dict[str, Any] = {k: (v if v != "" else None) for k, v in row.items()}
        for key in ("correct", "correct_fallback"):
            typed[key] = typed[key] == "1"
        typed["token_count"] = int(typed["token_count"])
        for key in ("dtr", "dtr_prefix", "mean_settling_depth"):
            typed[key] = None if typed[key] is None else float(typed[key])
        rows.append(typed)
    return rows


COMPACT_METHODS = ("mean@n", "cons@n", "think@n", "random@n", "short@n", "think-strata@n", "long@n")
"""The voting methods a compact table can vote: those that read answers, grades, lengths and prefix DTR alone.
Self-Certainty@n and DeepConf's need per-token self-certainty and confidences, which the table does not keep."""


def _count(ratio: float, tokens: int, what: str, row: dict[str, Any]) -> int:
    """The deep tokens behind a stored ratio over ``tokens`` tokens (whole up to the table's 6 digits)."""
    deep = ratio * tokens
    if abs(deep - round(deep)) > 1e-3:
        raise InputError(
            f"{row['id']}: its {what} {ratio} is not a count of deep tokens over {tokens} tokens; give "
            "readout= the tokens its store read out (None: every token)"
        )
    return round(deep)


def compact_response(
    row: dict[str, Any], prefix: int, readout: int | None, correct: str = "correct"
) -> Response:
    """A compact row as voting sees it: vote key and grade under ``correct``'s rule (``correct`` or
    ``correct_fallback``), length, and deep flags that give its stored ``dtr_prefix`` over the first ``prefix``
    tokens and, where every token was read out (``readout`` None), its ``dtr`` over the whole response. Which of
    the tokens were deep is not kept, only how many: every ranking of prefix or whole-response DTR is exact."""
    answer = row["answer" if correct == "correct" else "answer_fallback"]
    length = int(row["token_count"])
    window = min(prefix, length)
    head = _count(row["dtr_prefix"] or 0.0, window, "dtr_prefix", row)
    deep = np.zeros(length if readout is None else min(readout, length), dtype=bool)
    deep[:head] = True
    if readout is None and length > window:
        rest = _count(row["dtr"] or 0.0, length, "dtr", row) - head
        if not 0 <= rest <= length - window:
            raise InputError(f"{row['id']}: its dtr and dtr_prefix disagree about its deep tokens")
        deep[window : window + rest] = True
    empty = np.zeros(0)
    return Response(
        None if answer is None else vote_key(answer), bool(row[correct]), length, deep, empty, empty
    )


def readout_of(rows: Sequence[dict[str, Any]], prefix: int = PREFIX_TOKENS) -> int | None:
    """The tokens a compact table's store read out: ``prefix`` where every response longer than it has a ``dtr``
    equal to its ``dtr_prefix`` (the store read out only the prefix, so both are over it), else None (all). A store
    read out in full would need every long response's whole-response DTR to equal its prefix's to be taken for
    one read out over the prefix alone."""
    long = [r for r in rows if r["token_count"] > prefix]
    return prefix if long and all(r["dtr"] == r["dtr_prefix"] for r in long) else None


def compact_pools(
    rows: Iterable[dict[str, Any]],
    prefix: int = PREFIX_TOKENS,
    readout: int | None = None,
    correct: str = "correct",
) -> dict[tuple[str, str], dict[str, list[Response]]]:
    """Per (model, task), each question's pool in table order (the store's), as ``thinkn.load_pools`` builds it
    from the store; ``prefix``: the ℓ of the table's ``dtr_prefix``; ``readout``: the tokens the store read out
    (None: all)."""
    out: dict[tuple[str, str], dict[str, list[Response]]] = {}
    for row in rows:
        pools = out.setdefault((row["model"], row["task"]), {})
        pools.setdefault(row["question_id"], []).append(compact_response(row, prefix, readout, correct))
    return out


def table_one_from_rows(
    rows: Iterable[dict[str, Any]],
    cfg: CorrelationConfig = CorrelationConfig(),
    correct: str = "correct",
    metrics: Sequence[str] = tuple(METRICS),
) -> list[dict[str, Any]]:
    """Table 1's statistics per (model, task) and metric from a compact table, as ``correlate`` computes them
    from a store: per question, the responses with a defined metric in table order (``correct``: which grade,
    ``correct`` or ``correct_fallback``)."""
    stores: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        stores.setdefault((row["model"], row["task"]), {}).setdefault(row["question_id"], []).append(row)
    out = []
    for (model, task), by_question in stores.items():
        for name in metrics:
            value = METRICS[name]
            groups, lengths, cuts = [], [], []
            for responses in by_question.values():
                kept = [r for r in responses if value(r) is not None and math.isfinite(value(r))]
                groups.append(
                    (np.array([value(r) for r in kept], float), np.array([float(r[correct]) for r in kept]))
                )
                lengths.append(np.array([float(r["token_count"]) for r in kept]))
                cuts.append(np.array([float(r["finish"] == "length") for r in kept]))
            c = correlate(name, groups, cfg, lengths, cuts)
            every = [r for rs in by_question.values() for r in rs]
            out.append(
                {
                    "model": model,
                    "task": task,
                    "questions": len(by_question),
                    "metric": name,
                    "accuracy": float(np.mean([r[correct] for r in every])),
                    **{k: v for k, v in dataclasses.asdict(c).items() if k != "metric"},
                }
            )
    return out
