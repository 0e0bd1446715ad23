"""The JSON the page is drawn from: one function per view, each a thin layer over the store's readers and the
voting code. Every page of the explorer is one of these answers (``app`` serves them under ``/api/``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from depthlens.config import VotingConfig
from depthlens.errors import DepthlensError, InputError
from depthlens.stores.files import read_json
from depthlens.studies.comparisons import Comparison
from depthlens.studies.score import score_summary
from depthlens.studies.tables import method_cells, paired_cells, paired_title
from depthlens.studies.thinkn import stored_voting, summary_files, summary_stem, vote_notes
from depthlens.view.detail import scalar
from depthlens.view.pools import Failed, VotingIndex, answer_summary, draw_detail, question_pool
from depthlens.view.said import said
from depthlens.view.store import ViewStore, changed_since
from depthlens.viz.heatmap import _colour
from depthlens.voting.methods import METHODS, Response, in_order, trace_confidence
from depthlens.voting.trials import MethodSummary

RUN_FIELDS = (
    "model",
    "n_layers",
    "task",
    "study",
    "pool",
    "seed",
    "sampling",
    "readout",
    "dtr",
    "engine",
    "answers",
    "online",
    "store",
    "input",
    "tokens",
    "tcb",
    "settings",
    "command",
    "started",
    "depthlens_version",
)
PALETTE = [_colour(i / 63, 1.0) for i in range(64)]  # the heatmap's colours (viz.heatmap), light → dark


def default_voting(store: ViewStore) -> VotingConfig:
    """The settings the page opens with: the store's latest ``thinkn`` summary's, else the defaults with n cut
    to the pool and ℓ to the tokens read out."""
    files = summary_files(store.path) if store.kind == "samples" else []
    if files:
        try:
            summary = read_json(files[-1], "summary", "")
            voting = stored_voting(summary["voting"])
        except (DepthlensError, KeyError, TypeError):
            store.notices.append(f"{files[-1]}: a summary whose settings could not be read; defaults used")
        else:
            voted = summary.get("store_state")  # the state it was voted over (stores.state), where it says
            if store.state is not None and isinstance(voted, str) and voted != store.state:
                store.notices.append(
                    f"{files[-1].name} was voted over state {voted} of the store, which is now at "
                    f"{store.state}: the table here is voted over the state shown"
                )
            return voting
    sizes = [len(store.usable(q)) for q in store.questions] or [1]
    sampling = store.manifest.get("sampling")
    readout = sampling.get("readout_tokens") if isinstance(sampling, dict) else None
    # Think@n's ℓ, or what the store read out where that is less: Think@n ranks on it
    prefix = VotingConfig().rank_prefix
    if isinstance(readout, int) and readout >= 1 and prefix is not None:
        prefix = min(prefix, readout)
    return VotingConfig(n=max(1, min(VotingConfig().n, max(sizes))), rank_prefix=prefix)


def run_info(store: ViewStore, index: VotingIndex | None, voting: VotingConfig) -> dict[str, Any]:
    """The run: what was asked of which model with which settings, how much the store holds, what is damaged."""
    failed = sum(r.get("status") == "failed" for r in store.records)
    info = {
        "path": str(store.path),
        "kind": store.kind,
        "settings": {k: store.manifest[k] for k in RUN_FIELDS if k in store.manifest},
        "n_layers": store.n_layers,
        "dtr": dataclasses.asdict(store.dtr),
        "records": len(store.records),
        "failed": failed,
        "questions": len(store.questions),
        "online": bool(store.online),
        "summaries": [p.name for p in summary_files(store.path)] if store.kind == "samples" else [],
        "voting": _voting_dict(voting),
        "methods": list(METHODS),
        "palette": PALETTE,
        "notices": list(store.notices) + [line for line in [changed_since(store)] if line],
        "run_id": store.manifest.get("run_id"),
        "state": store.state,
        "index": None
        if index is None
        else {"done": index.done, "total": index.total, "ready": index.ready.is_set()},
    }
    if store.kind == "scores":
        summary = score_summary(store.records)
        info["summary"] = {k: scalar(v) for k, v in summary.items() if not isinstance(v, dict)}
    return info


def _voting_dict(voting: VotingConfig) -> dict[str, Any]:
    return {**voting.to_dict(), "prefix": "full" if voting.rank_prefix is None else voting.rank_prefix}


def voting_table(store: ViewStore, index: VotingIndex, voting: VotingConfig) -> dict[str, Any]:
    """The voting table as ``thinkn --from`` prints it (cli/thinkn_cmd.print_report): the same summaries
    (``run_trials``), the same cells, and the notes it prints under the table."""
    if not index.ready.is_set() or index.error:
        return _building(index)
    pools, excluded = index.pools(voting.n)
    if not pools:
        return {"state": "empty", "note": f"no question has n = {voting.n} usable responses; lower n"}
    quick = index.later(voting, "quick")  # queued first: Think@n's row shows before DeepConf's are done
    vote = index.later(voting, "vote")
    for failed in (quick, vote):
        if isinstance(failed, Failed):
            return {"state": "error", "note": failed.message}
    if vote is None and quick is None:
        return {"state": "voting", "questions": len(pools), "trials": voting.trials}
    state, summaries = ("ready", vote.summaries) if vote is not None else ("partial", quick)
    task = (
        (store.manifest.get("task") or {}).get("name", "?")
        if isinstance(store.manifest.get("task"), dict)
        else "?"
    )
    prefix = "full" if voting.rank_prefix is None else voting.rank_prefix
    title = (
        f"{store.manifest.get('model', '?')} · {task} · n={voting.n} η={voting.eta} ℓ={prefix} · "
        f"{voting.trials} trials × {len(pools)} questions"
    )
    paired = paired_rows(vote.paired, vote.control) if vote is not None else []
    return {
        "state": state,
        "title": title,
        "rows": _method_rows(summaries),
        "notes": _voting_notes(store, voting, summaries, excluded, partial=state == "partial"),
        "stem": summary_stem(voting),
        "paired": paired,
        "paired_title": paired_title(
            vote.paired[0].baseline, (vote.control.method, vote.control.baseline) if vote.control else None
        )
        if vote is not None and vote.paired
        else None,
    }


def _method_rows(summaries: list[MethodSummary]) -> list[dict[str, Any]]:
    """One row per method: its cells as ``thinkn`` prints them (``tables.method_cells``), and its summary's
    values."""
    cons = next((s for s in summaries if s.method == "cons@n"), None)
    by_method = {s.method: s for s in summaries}
    rows = []
    for s in (by_method[m] for m in in_order(list(by_method))):  # the paper's methods first, as thinkn prints
        _, exact, trials, tokens, vs_cons, paper = method_cells(s, cons)
        rows.append(
            {
                "method": s.method,
                "exact": exact,
                "accuracy": trials,
                "tokens": tokens,
                "vs_cons": vs_cons,
                "paper": paper,
                "values": dataclasses.asdict(s),
            }
        )
    return rows


def _voting_notes(
    store: ViewStore, voting: VotingConfig, summaries: list[MethodSummary], excluded: list[str], partial: bool
) -> list[str]:
    """The notes ``thinkn`` prints under its table: how answers were read, unanswered votes, questions left out;
    ``partial``: the DeepConf rows are still being voted."""
    notes = [answer_summary(store).line(), *vote_notes(summaries, voting)]
    if excluded:
        notes.append(
            f"{len(excluded)} question(s) left out (fewer than n usable responses): "
            + ", ".join(excluded[:10])
        )
    if partial:
        notes.append(
            f"the DeepConf rows follow (every trace's group confidences, {voting.trials} draws each)"
        )
    return notes


def paired_rows(paired: list[Comparison], control: Comparison | None = None) -> list[dict[str, Any]]:
    """The paired table ``thinkn --from`` prints under its table (cli/paired_view.py, the same cells): each method
    against Cons@n on the same questions — the difference in points [95 %], p · p_BH, won / lost, the interval
    against the paper's gaps — then Think@n − random@n, the control (one test: p alone)."""
    rows = []
    for c in [*paired, *([control] if control is not None else [])]:
        cells = paired_cells(c.row())
        rows.append(
            {
                "method": c.method if c is not control else f"{c.method} − {c.baseline}",
                "difference": cells.difference,
                "p": cells.tests if c is not control else cells.p,
                "won_lost": f"{c.test.wins} / {c.test.losses}",
                "gaps": cells.gaps,
                "control": c is control,
            }
        )
    return rows


def _building(index: VotingIndex) -> dict[str, Any]:
    if index.error:
        return {"state": "error", "note": index.error}
    return {"state": "building", "done": index.done, "total": index.total}


def question_rows(store: ViewStore) -> list[dict[str, Any]]:
    """Every question's gold answer and the pool's votes (from the light fields only)."""
    return [question_row(store, qid) for qid in store.questions]


def question_row(store: ViewStore, qid: str) -> dict[str, Any]:
    """A question's gold answer, the pool's votes (most first; whether that answer is right), its agreement (the
    top answer's share of the usable responses) and, for an online run, what the run answered."""
    q = store.questions[qid]
    usable = [store.records[i] for i in store.usable(qid)]
    votes: dict[str, dict[str, Any]] = {}
    for r in usable:
        key = r.get("vote_key")
        if key is None:
            continue
        vote = votes.setdefault(key, {"key": key, "answer": r.get("answer"), "votes": 0, "correct": False})
        vote["votes"] += 1
        vote["correct"] = vote["correct"] or bool(r.get("correct"))
    ranked = sorted(votes.values(), key=lambda v: -v["votes"])
    online = store.online.get(qid)
    return {
        "id": qid,
        "gold": q.gold,
        "question": (q.text or "")[:240],
        "responses": len(usable),
        "failed": len(q.records) - len(usable),
        "votes": ranked,
        "agreement": ranked[0]["votes"] / len(usable) if ranked and usable else 0.0,
        "pool_right": sum(bool(r.get("correct")) for r in usable) / len(usable) if usable else None,
        "online": None
        if online is None
        else {k: online.get(k) for k in ("answer", "correct", "stop", "tokens", "started")},
    }


def questions_page(
    base: list[dict[str, Any]], index: VotingIndex, voting: VotingConfig, query: dict[str, Any]
) -> dict[str, Any]:
    """A page of questions (``base``: ``question_rows``), filtered by a method's right/wrong and sorted
    (``query``: page, size, sort, order, filter, method)."""
    method, wanted = query["method"], query["filter"]
    tests = {"right": lambda a: a == 1.0, "wrong": lambda a: a == 0.0, "mixed": lambda a: 0.0 < a < 1.0}
    keys = {
        "id": lambda r: r["id"],
        "agreement": lambda r: (r["agreement"], r["id"]),
        "responses": lambda r: (r["responses"], r["id"]),
        "accuracy": lambda r: ((r["methods"] or {}).get(method, -1.0), r["id"]),
    }
    for name, value, known in (
        ("method", method, METHODS),
        ("filter", wanted, ["all", *tests]),
        ("sort", query["sort"], keys),
        ("order", query["order"], ORDERS),
    ):
        _known(name, value, known)
    vote = index.later(voting, "vote") if index.ready.is_set() and not index.error else None
    state = _building(index)["state"] if not index.ready.is_set() or index.error else "voting"
    per_q = None
    if isinstance(vote, Failed):
        state = "error"
    elif vote is not None:
        per_q, state = vote.per_question, "ready"
    rows = [{**r, "methods": None if per_q is None else per_q.get(r["id"])} for r in base]
    if wanted != "all":
        if per_q is None:
            return {"state": state, "rows": [], "total": 0, "page": query["page"], "size": query["size"]}
        rows = [r for r in rows if r["methods"] is not None and tests[wanted](r["methods"][method])]
    rows.sort(key=keys[query["sort"]], reverse=query["order"] == "desc")
    size, page = query["size"], query["page"]
    return {
        "state": state,
        "total": len(rows),
        "page": page,
        "size": size,
        "rows": rows[page * size : (page + 1) * size],
    }


def question_detail(store: ViewStore, qid: str, voting: VotingConfig, trial: int) -> dict[str, Any]:
    """A question, its pool's responses with their scores, and trial ``trial``'s draw voted by every method."""
    q = store.questions[qid]
    pool = question_pool(store, qid)
    detail = draw_detail(store, qid, pool, voting, trial)
    think = detail["methods"].get("think@n")
    kept = set(think["kept"]) if think else set()
    drawn = set(detail["drawn"])
    responses = dict(pool)
    decisions = {d.get("index"): d for d in (store.online.get(qid) or {}).get("decisions", [])}
    rows = []
    for i in q.records:
        record = store.records[i]
        r = responses.get(i)
        rows.append(
            {
                **{k: scalar(v) for k, v in record.items()},
                "think": None if i not in drawn else ("kept" if i in kept else "rejected"),
                **_scores(r, voting),
                "online": decisions.get(record.get("sample")),
            }
        )
    return {
        **question_row(store, qid),
        "question": q.text,
        "choices": q.choices,
        "trial": trial,
        "draw": detail,
        "rows": rows,
        "online_line": store.online.get(qid),
    }


def _scores(r: Response | None, voting: VotingConfig) -> dict[str, Any]:
    """A response's prefix DTR at ℓ, DTR over every read-out token, mean confidence and prefix self-certainty —
    the numbers Think@n and its peers rank by (``Response``'s own methods)."""
    if r is None:
        return {"prefix_dtr": None, "dtr": None, "confidence": None, "self_certainty": None, "readout": None}
    try:
        prefix_dtr: float | None = r.prefix_dtr(voting.rank_prefix)
        why = None
    except InputError as exc:
        prefix_dtr, why = None, said(exc)
    return {
        "prefix_dtr": prefix_dtr,
        "prefix_note": why,
        "dtr": float(r.deep.mean()) if len(r.deep) else None,
        "readout": len(r.deep),
        "confidence": scalar(trace_confidence(r.confidence, "mean", voting.deepconf_window)),
        "self_certainty": scalar(r.prefix_self_certainty(voting.rank_prefix)),
    }


ORDERS = ("asc", "desc")
"""The ``order`` a page of questions or records is sorted in."""


def _known(name: str, value: object, known: Iterable[str]) -> None:
    """Refuse a query value that is none of ``known``, naming the parameter and the choices (400)."""
    choices = list(known)
    if value not in choices:
        raise InputError(f"{name}={value}: use one of {', '.join(choices)}")


def records_page(store: ViewStore, query: dict[str, Any]) -> dict[str, Any]:
    """A page of records with their light fields (a score store's metrics), sorted by any of them (``store``: in
    store order); a ``sort`` that names no field of the records, or an ``order`` other than asc / desc, is
    refused naming the parameter and the choices."""
    key = query["sort"]
    fields = list(dict.fromkeys(k for r in store.records for k in r))
    _known("sort", key, ["store", *fields])
    _known("order", query["order"], ORDERS)
    rows = [{k: scalar(v) for k, v in r.items()} for r in store.records]
    if key != "store":
        present = [r for r in rows if isinstance(r.get(key), int | float)]
        absent = [r for r in rows if not isinstance(r.get(key), int | float)]
        present.sort(key=lambda r: r[key], reverse=query["order"] == "desc")
        rows = present + absent
    size, page = query["size"], query["page"]
    columns = list(dict.fromkeys(k for r in store.records[:200] for k in r))
    return {
        "total": len(rows),
        "page": page,
        "size": size,
        "columns": columns,
        "rows": rows[page * size : (page + 1) * size],
    }
