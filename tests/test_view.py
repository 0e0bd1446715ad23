"""``depthlens view``: what its JSON API shows equals the store and the library (``thinkn --from`` above all),
damaged stores open with notices, nothing is written, and the server refuses what it should.

The pages themselves are driven in a real browser in tests/test_view_browser.py.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from depthlens.config import DTRConfig, VotingConfig
from depthlens.errors import ConfigError, InputError
from depthlens.metrics.dtr import settling_depth
from depthlens.models.load import load_tokenizer
from depthlens.models.tokens import token_texts
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.layout import manifest_file
from depthlens.stores.samples import SHARDS, iter_samples, read_manifest
from depthlens.studies.online import DECISIONS
from depthlens.studies.thinkn import load_pools
from depthlens.view.store import open_store
from depthlens.voting.exact import exact_outcomes
from depthlens.voting.methods import think_at_n
from depthlens.voting.trials import draw, trial_outcomes
from tests.test_cli import run

TestClient = pytest.importorskip("starlette.testclient", reason="the view extra is not installed").TestClient


def client(path: Path) -> tuple[Any, Any]:
    """The explorer over ``path`` and a client of its app, the voting index built (the tests read it at once)."""
    from depthlens.view.app import Explorer, make_app

    explorer = Explorer.of(open_store(path))
    explorer.start()
    if explorer.index is not None:
        assert explorer.index.ready.wait(60), "the voting index was not built in 60 s"
    return explorer, TestClient(make_app(explorer))


def settled(api: Any, path: str, **params: Any) -> dict[str, Any]:
    """An answer that may be computed in the background (the voting table, each question's methods), once ready."""
    deadline = time.monotonic() + 60
    while True:
        body = api.get(path, params=params).json()
        if body.get("state") not in ("building", "voting", "partial") or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def _printed_tables(out: str) -> list[list[list[str]]]:
    """The rows of each table ``thinkn --from`` printed (rich's box characters: ┏ opens one), cells stripped."""
    tables: list[list[list[str]]] = []
    for line in out.splitlines():
        if line.startswith("┏"):
            tables.append([])
        elif line.startswith("│") and tables:
            cells = [c.strip() for c in line.strip("│").split("│")]
            if tables[-1] and not cells[0]:  # a cell wrapped at a space (a narrow terminal): its next line
                tables[-1][-1] = [f"{a} {b}".strip() for a, b in zip(tables[-1][-1], cells, strict=True)]
            else:
                tables[-1].append(cells)
    return tables


@pytest.mark.parametrize("name", ["samples", "samples_jsonl", "answers"])
def test_pools_are_load_pools(view_stores, name):
    explorer, _ = client(view_stores[name])
    dtr = DTRConfig.from_dict(read_manifest(view_stores[name])["dtr"])
    expected, _ = load_pools(view_stores[name], dtr, n=1)
    pools, excluded = explorer.index.pools(1)
    assert sorted(pools) == sorted(expected) and not excluded
    for q, pool in pools.items():
        for mine, theirs in zip(pool, expected[q], strict=True):
            assert (mine.key, mine.correct, mine.length) == (theirs.key, theirs.correct, theirs.length)
            for field in ("deep", "self_certainty", "confidence"):
                a, b = getattr(mine, field), getattr(theirs, field)
                assert a.dtype == b.dtype and np.array_equal(a, b), (q, field)


@pytest.mark.parametrize(
    ("n", "eta", "prefix"), [("2", "0.5", "3"), ("3", "0.75", "full"), ("4", "0.25", "5")]
)
def test_voting_table_is_what_thinkn_from_prints(view_stores, tmp_path, monkeypatch, capsys, n, eta, prefix):
    store = tmp_path / "copy"  # thinkn --from writes its summary into the store it reads
    shutil.copytree(view_stores["answers"], store)
    code, out, err = run(
        monkeypatch,
        capsys,
        "thinkn",
        "--from",
        store,
        "--n",
        n,
        "--eta",
        eta,
        "--prefix",
        prefix,
        "--trials",
        "4",
        "--methods",
        "all",  # every DeepConf variant on its own line, as the explorer shows them
    )
    assert code in (0, None), err
    _, api = client(view_stores["answers"])
    shown = settled(api, "/api/voting", n=n, eta=eta, prefix=prefix, trials=4)
    assert shown["state"] == "ready"
    table, paired_printed = _printed_tables(out)  # the table, then the paired table under it
    cells = [
        [r["method"], r["exact"], r["accuracy"], r["tokens"], r["vs_cons"], r["paper"]] for r in shown["rows"]
    ]
    assert cells == table
    paired = [[r["method"], r["difference"], r["p"], r["won_lost"], r["gaps"]] for r in shown["paired"]]
    assert paired == paired_printed
    # every method but Cons@n, the baseline; then Think@n − random@n, the control
    assert len(paired) == len(cells) and paired[-1][0] == "think@n − random@n"
    assert [r["method"] for r in shown["rows"]][:3] == ["think@n", "cons@n", "random@n"]
    assert shown["paired_title"] in " ".join(out.split())
    assert shown["notes"][0] in " ".join(err.split())  # the answers line, as printed (rich wraps stderr)
    assert " ".join(shown["title"].split()) in " ".join(out.split())  # rich wraps the title to the table


def test_each_questions_results_average_to_the_table(view_stores):
    explorer, _ = client(view_stores["answers"])
    voting = VotingConfig(n=3, eta=0.5, rank_prefix=4, trials=5)
    vote = explorer.index.vote(voting)
    per_q = vote.per_question
    pools = explorer.index.pools(voting.n)[0]
    assert vote.summaries == trial_outcomes(pools, voting).summaries(exact_outcomes(pools, voting))
    for s in vote.summaries:
        mean = sum(per_q[q][s.method] for q in per_q) / len(per_q)
        # same outcomes, summed over questions then trials instead of trials then questions: float reordering
        assert math.isclose(mean, s.accuracy_mean, rel_tol=1e-12, abs_tol=1e-12), s.method


@pytest.mark.parametrize("eta", [0.25, 0.5, 1.0])
def test_a_question_shows_think_at_n_on_the_trials_draw(view_stores, eta):
    store = view_stores["answers"]
    _, api = client(store)
    voting = VotingConfig(n=3, eta=eta, rank_prefix=4, trials=3)
    pools, _ = load_pools(store, DTRConfig.from_dict(read_manifest(store)["dtr"]), voting.n)
    records = sorted(iter_samples(store), key=lambda r: (r["question_id"], r["sample"]))
    for qi, q in enumerate(sorted(pools)):
        ids = [r["id"] for r in records if r["question_id"] == q]
        picks = draw(len(pools[q]), voting.n, voting.seed, 2, qi)
        outcome = think_at_n([pools[q][p] for p in picks], voting)
        shown = api.get(
            "/api/question", params={"id": q, "n": 3, "eta": eta, "prefix": 4, "trials": 3, "trial": 2}
        ).json()
        marks = {r["id"]: r["think"] for r in shown["rows"]}
        assert [i for i in ids if marks[i] == "kept"] == [ids[picks[k]] for k in outcome.kept]
        assert sum(m == "kept" for m in marks.values()) == math.ceil(eta * 3)
        assert sum(m is not None for m in marks.values()) == 3  # drawn: kept or rejected
        assert shown["draw"]["methods"]["think@n"]["answer"] == outcome.answer
        for row, response in zip(shown["rows"], pools[q], strict=True):
            assert row["prefix_dtr"] == response.prefix_dtr(4)


# Fields a response's row reads that only some records carry: a failed record's error, an online run's phase.
OPTIONAL_ROW_FIELDS = {"error", "phase"}


@pytest.mark.parametrize("name", ["samples", "samples_jsonl", "online"])
def test_the_question_pages_rows_read_fields_the_api_sends(view_stores, name):
    """Every field app.js's response row reads is one /api/question sends (the token count went blank when the
    API's ``n_tokens`` became ``token_count``: issue 57, item 8), and the token count is each record's."""
    script = (Path(__file__).parents[1] / "src/depthlens/view/static/app.js").read_text()
    row_js = script[script.index("function responseRow") : script.index("// ---- a score store")]
    read = set(re.findall(r"\br\.(\w+)", row_js))
    assert "token_count" in read and "n_tokens" not in read
    _, api = client(view_stores[name])
    stored = {r["id"]: r for r in iter_samples(view_stores[name])}
    questions = sorted({r["question_id"] for r in stored.values()})
    for qid in questions:
        rows = api.get("/api/question", params={"id": qid, "n": 2}).json()["rows"]
        for row in rows:
            assert read - OPTIONAL_ROW_FIELDS <= set(row), row["id"]
            assert row["token_count"] == stored[row["id"]]["token_count"]


def test_a_response_shows_the_stored_tokens_and_layers(view_stores):
    store = view_stores["samples"]
    _, api = client(store)
    manifest = read_manifest(store)
    record = next(r for r in iter_samples(store) if r["sample"] == 1)
    shown = api.get("/api/response", params={"id": record["id"]}).json()
    table = torch.tensor(record["divergence"], dtype=torch.float32)
    assert shown["settling_depth"] == settling_depth(table, manifest["dtr"]["g"]).tolist()
    assert shown["n_layers"] == manifest["n_layers"] == len(record["divergence"][0])
    divergence = np.frombuffer(base64.b64decode(shown["divergence"]), dtype="<f4")
    assert divergence.tolist() == [v for row in record["divergence"] for v in row]  # float32, as stored
    assert shown["tokens"] == token_texts(load_tokenizer(manifest["model"]), record["token_ids"])
    assert shown["per_token"]["confidence"] == [round(v, 6) for v in record["confidence"]]
    assert shown["deep"] == [d >= shown["deep_from"] for d in shown["settling_depth"]]


def test_a_response_sends_each_layers_top_k_as_stored(view_stores):
    """``--layer-top-k``: the response's ``layer_top`` is the stored [T × L × K] ids (int32) and probabilities
    (float32) exactly, with a label for each distinct id (``token_texts``, the store's tokenizer) — for a Parquet
    sample store and a JSONL score store; a record without them sends none and says how to get them."""
    for name, records in (
        ("lens", lambda path: iter_samples(path)),
        ("lens_scores", lambda path: iter_jsonl(path)),
    ):
        store = view_stores[name]
        explorer, api = client(store)
        assert not explorer.store.notices  # the nested fields read as numbers: nothing "damaged"
        tokenizer = load_tokenizer(explorer.store.manifest["model"])
        record = next(r for r in records(store) if r.get("layer_top_ids"))
        shown = api.get("/api/response", params={"id": record["id"]}).json()["layer_top"]
        ids = np.frombuffer(base64.b64decode(shown["ids"]), dtype="<i4")
        probs = np.frombuffer(base64.b64decode(shown["probs"]), dtype="<f4")
        assert shown["k"] == 3 and ids.tolist() == np.ravel(record["layer_top_ids"]).tolist()
        assert probs.tolist() == np.ravel(np.asarray(record["layer_top_probs"], dtype=np.float32)).tolist()
        distinct = sorted(set(ids.tolist()))
        assert shown["texts"] == dict(zip(map(str, distinct), token_texts(tokenizer, distinct), strict=True))
        assert not explorer.store.notices
    _, api = client(view_stores["samples"])
    plain = api.get("/api/response", params={"id": next(iter_samples(view_stores["samples"]))["id"]}).json()
    assert plain["layer_top"] is None and "--layer-top-k" in plain["layer_top_missing"]


def test_token_kinds_name_whitespace_and_bytes():
    from depthlens.view.detail import token_kind

    assert [token_kind(t) for t in ["␣", "↵↵", "⟨e2⟩", "a⟨80⟩", "∅", "␣the", "x"]] == [
        "space",
        "space",
        "byte",
        "byte",
        "empty",
        "text",
        "text",
    ]


def test_score_store_records_and_their_tokens(view_stores):
    for name in ("scores", "scores_jsonl"):
        _, api = client(view_stores[name])
        stored = list(iter_jsonl(view_stores["scores_jsonl"]))
        page = api.get("/api/records", params={"sort": "dtr", "order": "desc", "size": 5}).json()
        assert page["total"] == len(stored)
        assert [r["dtr"] for r in page["rows"]] == sorted((r["dtr"] for r in stored), reverse=True)[:5]
        shown = api.get("/api/response", params={"id": stored[0]["id"]}).json()
        assert (
            shown["tokens"] == stored[0]["tokens"] and shown["settling_depth"] == stored[0]["settling_depth"]
        )
        assert shown["deep"] == stored[0]["deep"]
        assert api.get("/api/questions").status_code == 404  # a score store has no questions


def test_an_online_run_shows_where_it_stopped_each_response(view_stores):
    store = view_stores["online"]
    _, api = client(store)
    for line in iter_jsonl(store / DECISIONS):
        shown = api.get("/api/question", params={"id": line["id"], "n": 2}).json()
        assert [r["online"] for r in shown["rows"]] == line["decisions"]
        assert shown["online_line"]["stop"] == line["stop"]
    stopped = [r for r in iter_samples(store) if r["stopped_at"] is not None]
    assert stopped, "the test store should hold a response the policy stopped"
    shown = api.get("/api/response", params={"id": stopped[0]["id"]}).json()
    assert shown["fields"]["stopped_at"] == stopped[0]["stopped_at"] == len(shown["tokens"])


def test_a_vote_past_what_was_read_out_is_refused_by_the_querys_name():
    """Ranking by more tokens than a store read out is refused naming the query's ``prefix`` (the setting behind
    it is ``VotingConfig.rank_prefix``), as the page shows it (``view.said``)."""
    import numpy as np

    from depthlens.view.said import said
    from depthlens.voting.methods import Response

    read_out_3 = Response("a", True, 10, np.zeros(3, dtype=bool), np.zeros(10), np.zeros(10))
    with pytest.raises(InputError) as refused:
        read_out_3.prefix_dtr(5)
    assert said(refused.value).endswith("regenerate with readout_tokens 5 or a shorter prefix"), said(
        refused.value
    )
    assert said(ConfigError(setting="rank_prefix", value=0, requirement="must be ≥ 1 token")) == (
        "prefix=0: must be ≥ 1 token"
    )


def test_a_tcb_trace_shows_each_tokens_delta(view_stores):
    _, api = client(view_stores["tcb"])
    (line,) = iter_jsonl(view_stores["tcb"] / "trace.progress.jsonl")
    rows = line["rows"]["rows"]
    page = api.get("/api/records").json()
    assert page["total"] == 1 and page["rows"][0]["sharp_drops"] == line["rows"]["summary"]["sharp_drops"]
    shown = api.get("/api/response", params={"id": "trace"}).json()
    assert len(shown["tokens"]) == len(rows) and shown["marked"] == [r["sharp_drop"] for r in rows]
    assert shown["per_token"]["tcb"] == [round(r["tcb"], 6) for r in rows]
    assert min(shown["shade"]) == 0.0 and max(shown["shade"]) == 1.0  # log δ over the trace's own range


def _fingerprint(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def test_viewing_writes_nothing(view_stores):
    for name in ("samples", "samples_jsonl", "online", "scores"):
        store = view_stores[name]
        before = _fingerprint(store)
        _, api = client(store)
        run = api.get("/api/run").json()
        assert not run["notices"], run["notices"]
        if run["kind"] == "samples":
            settled(api, "/api/voting")
            qid = settled(api, "/api/questions")["rows"][0]["id"]
            rid = api.get("/api/question", params={"id": qid, "n": 2}).json()["rows"][0]["id"]
        else:
            rid = api.get("/api/records").json()["rows"][0]["id"]
        assert api.get("/api/response", params={"id": rid}).status_code == 200
        assert _fingerprint(store) == before


def test_questions_filter_and_sort(view_stores):
    _, api = client(view_stores["answers"])
    query = {"n": 3, "eta": 0.5, "prefix": 4, "trials": 3, "method": "cons@n"}
    every = settled(api, "/api/questions", **query, sort="agreement", order="desc")
    agreement = [r["agreement"] for r in every["rows"]]
    assert agreement == sorted(agreement, reverse=True) and every["state"] == "ready"
    right = settled(api, "/api/questions", **query, filter="right")["rows"]
    wrong = settled(api, "/api/questions", **query, filter="wrong")["rows"]
    mixed = settled(api, "/api/questions", **query, filter="mixed")["rows"]
    assert all(r["methods"]["cons@n"] == 1 for r in right) and all(r["methods"]["cons@n"] == 0 for r in wrong)
    assert len(right) + len(wrong) + len(mixed) == every["total"]
    assert (
        api.get("/api/questions", params={"filter": "maybe"})
        .json()["error"]
        .startswith("filter=maybe: use one of")
    )
    refused = api.get("/api/voting", params={"eta": "1.5"})
    assert refused.status_code == 400
    error = refused.json()["error"]  # named as the query spells it, not as a Python field
    assert "eta=1.5: must be in (0, 1]" in error and "VotingConfig" not in error, error


@pytest.mark.parametrize(
    ("query", "said", "followed"),
    [
        ({"eta": "1.5"}, "eta=1.5: must be in (0, 1]", {"eta": "0.5"}),
        ({"eta": "half"}, "eta='half': give a number in (0, 1]", {"eta": "0.5"}),
        (
            {"tie_break": "coin"},
            "tie_break=coin: must be one of uniform, summed-dtr",
            {"tie_break": "uniform"},
        ),
    ],
)
def test_a_query_out_of_range_is_named_as_the_query_spells_it(view_stores, query, said, followed):
    """Issue 51: named as the query parameter (``eta=1.5``), not as Python's ``VotingConfig.eta``; the value the
    message asks for, sent, is answered."""
    _, api = client(view_stores["answers"])
    base = {"n": 3, "prefix": 4, "trials": 3}
    answer = api.get("/api/voting", params={**base, **query})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error.startswith(said) and "Config" not in error, error
    assert "state" in settled(api, "/api/voting", **base, **followed)


# ---- damaged stores: each opens, names what is missing, shows the rest ----


def _damaged(view_stores, tmp_path, name):
    store = tmp_path / name
    shutil.copytree(view_stores[name], store)
    return store


def test_a_missing_or_cut_shard_is_a_notice(view_stores, tmp_path):
    store = _damaged(view_stores, tmp_path, "answers")
    shards = sorted((store / SHARDS).glob("part-*.parquet"))
    shards[0].unlink()
    shards[1].write_bytes(shards[1].read_bytes()[:200])
    (store / SHARDS / ".part-000099.parquet.tmp").write_bytes(b"PAR1")  # a writer's shard, not committed
    explorer, api = client(store)
    notices = api.get("/api/run").json()["notices"]
    assert any(shards[0].name in n and "missing" in n for n in notices)
    assert any(shards[1].name in n and "cut short" in n for n in notices)  # the library's own check
    assert any("a shard being written" in n for n in notices)
    left = [r["id"] for r in iter_samples(view_stores["answers"])][8:]
    assert sorted(explorer.store.by_id) == sorted(left)
    assert settled(api, "/api/voting", n=2)["state"] == "ready"


def test_a_cut_manifest_is_a_notice_and_the_shards_are_read(view_stores, tmp_path):
    store = _damaged(view_stores, tmp_path, "answers")
    manifest = manifest_file(store / SHARDS)
    manifest.write_bytes(manifest.read_bytes()[:100])
    explorer, api = client(store)
    run = api.get("/api/run").json()
    assert any("manifest" in n and "cut" in n for n in run["notices"]), run["notices"]
    assert run["n_layers"] == 3 and len(explorer.store.records) == 12  # depth from the divergences' width
    assert settled(api, "/api/voting", n=2)["state"] == "ready"


def test_a_torn_jsonl_line_and_a_foreign_one(view_stores, tmp_path):
    store = _damaged(view_stores, tmp_path, "samples_jsonl")
    lines = (store / "samples.jsonl").read_bytes().splitlines(keepends=True)
    (store / "samples.jsonl").write_bytes(lines[0] + b"not json\n" + b"".join(lines[1:-1]) + lines[-1][:40])
    explorer, api = client(store)
    notices = api.get("/api/run").json()["notices"]
    assert any("samples.jsonl:2: not a JSON record" in n for n in notices)
    assert any("the last line is cut short" in n for n in notices)
    assert len(explorer.store.records) == 11
    assert api.get("/api/question", params={"id": "chain_sum-0", "n": 2}).status_code == 200


def test_a_path_that_is_not_a_store_is_refused_naming_what_was_expected(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("hello\n")
    for path in (tmp_path, tmp_path / "notes.txt", tmp_path / "absent"):
        with pytest.raises(
            InputError, match=r"give a sample store directory .*, a score store .* or a TCB trace"
        ):
            open_store(path)
    code, _, err = run(monkeypatch, capsys, "view", tmp_path / "notes.txt")
    assert code == 2
    assert re.fullmatch(r"error: \S+notes\.txt: not a depthlens store \(a file .*\n", err)


def test_a_writer_commits_while_the_page_is_open_and_the_page_keeps_its_snapshot(
    view_stores, tmp_path, monkeypatch, capsys
):
    from depthlens.stores.parquet import store_manifest
    from depthlens.stores.shard_writer import rewrite_store
    from depthlens.stores.state import store_state

    store = _damaged(view_stores, tmp_path, "answers")  # a copy: a writer commits into it below
    state, run_id = store_state(store), store_manifest(store / SHARDS)["run_id"]
    code, _, err = run(monkeypatch, capsys, "thinkn", "--from", store, "--n", "2", "--trials", "2")
    assert code in (0, None), err  # a summary of this state: the page opens with its settings
    explorer, api = client(store)
    info = api.get("/api/run").json()
    assert (info["state"], info["run_id"], info["notices"]) == (state, run_id, [])
    rid = next(iter(explorer.store.by_id))
    text = api.get("/api/response", params={"id": rid}).json()["text"]

    def regrade() -> None:  # a commit through the store's own writer, under the lock the view never takes
        rewrite_store(store / SHARDS, store_manifest(store / SHARDS), lambda r: {**r, "text": "rewritten"})

    regrade()  # the replaced shards are kept under hidden names until the next write
    notices = api.get("/api/run").json()["notices"]
    assert len(notices) == 1 and f"new state ({store_state(store)})" in notices[0] and state in notices[0]
    assert api.get("/api/response", params={"id": rid}).json()["text"] == text  # the snapshot's, not the new
    assert settled(api, "/api/voting", n=2)["state"] == "ready"
    regrade()  # ... which removes them: the snapshot's records are gone from disk, and the page says so
    gone = api.get("/api/response", params={"id": rid})
    assert gone.status_code == 404 and "gone since the page opened" in gone.json()["error"]
    _, fresh = client(store)  # a page opened now shows the new state, and that the summary is of the old one
    assert fresh.get("/api/response", params={"id": rid}).json()["text"] == "rewritten"
    info = fresh.get("/api/run").json()
    assert info["state"] == store_state(store) != state
    assert any(
        f"was voted over state {state} of the store, which is now at {info['state']}" in n
        for n in info["notices"]
    )


def test_a_jsonl_store_appended_or_replaced_while_the_page_is_open(view_stores, tmp_path):
    store = _damaged(view_stores, tmp_path, "samples_jsonl")
    path = store / "samples.jsonl"
    explorer, api = client(store)
    rid = next(iter(explorer.store.by_id))
    assert api.get("/api/response", params={"id": rid}).status_code == 200
    lines = path.read_bytes().splitlines(keepends=True)
    with path.open("ab") as f:  # a writer appends a record: lines read at open are where they were
        f.write(lines[0])
    assert any("has changed since this page opened" in n for n in api.get("/api/run").json()["notices"])
    assert api.get("/api/response", params={"id": rid}).json()["id"] == rid
    replacement = store / "samples.jsonl.new"  # a rewrite renames a new file in: offsets no longer hold
    replacement.write_bytes(b"".join(reversed(lines)))
    replacement.replace(path)
    moved = api.get("/api/response", params={"id": rid})
    assert moved.status_code == 404 and "rewritten since the page opened" in moved.json()["error"]
