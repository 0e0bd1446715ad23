"""``depthlens view`` in a real browser: Debian's chromium driven by Playwright follows question → response →
token, changes η, opens the heatmap, and checks what the page shows against the store's own numbers and what
``thinkn --from`` prints. Where chromium or playwright is missing they skip, saying why — except where they are
required (CI: ``$CI`` or ``$DEPTHLENS_BROWSER_TESTS`` set, as .ci/run sets it after installing chromium): there
they fail, naming what is missing.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import threading
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pytest
import torch

from depthlens.config import DTRConfig, VotingConfig
from depthlens.metrics.dtr import deep_flags, settling_depth
from depthlens.models.load import load_tokenizer
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.samples import iter_samples, read_manifest
from depthlens.studies.thinkn import load_pools
from depthlens.voting.methods import think_at_n
from depthlens.voting.trials import draw
from tests.test_cli import run
from tests.test_view import _printed_tables


def _required() -> bool:
    """CI must run these tests (.ci/run installs chromium and says so): there a missing browser fails them, so a
    broken install cannot pass as a skip. A developer machine without chromium skips them, saying why."""
    flag = os.environ.get("DEPTHLENS_BROWSER_TESTS", os.environ.get("CI", ""))
    return flag.lower() not in ("", "0", "false", "no", "optional")


def _chromium() -> str | None:
    """Debian's chromium: $DEPTHLENS_CHROMIUM, else ``chromium`` (or ``chromium-browser``) on PATH."""
    named = os.environ.get("DEPTHLENS_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _missing() -> str | None:
    if _chromium() is None:
        return (
            "Debian's chromium is not installed (apt-get install chromium, or point $DEPTHLENS_CHROMIUM at a "
            "chromium executable); .ci/run installs it"
        )
    if importlib.util.find_spec("playwright") is None or importlib.util.find_spec("uvicorn") is None:
        return "playwright or uvicorn is not installed (pip install -e '.[dev,view]')"
    return None


MISSING = _missing()
if MISSING is not None and not _required():
    pytest.skip(MISSING, allow_module_level=True)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 30_000


def js_fixed(value: float, digits: int) -> str:
    """``Number.prototype.toFixed``: the exact binary value rounded half up (Python's format rounds half even)."""
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


@pytest.fixture
def serve() -> Iterator:
    """``serve(store)`` → the URL of the explorer over ``store``, on uvicorn in a thread of this process."""
    import uvicorn

    from depthlens.view.app import Explorer, make_app
    from depthlens.view.server import bind, url
    from depthlens.view.store import open_store

    servers = []

    def start(path: Path) -> str:
        explorer = Explorer.of(open_store(path))
        explorer.start()
        sock = bind("127.0.0.1", 0)
        server = uvicorn.Server(uvicorn.Config(make_app(explorer), log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        servers.append((server, thread, sock))
        return url(sock)

    yield start
    for server, thread, sock in servers:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="session", autouse=True)
def _browser_present() -> None:
    """Where the tests are required (CI) and the browser is missing: fail each, naming what is missing (before the
    stores are built: session-scoped and autouse, it runs first)."""
    if MISSING is not None:
        pytest.fail(f"the browser tests are required here (CI) but {MISSING}", pytrace=False)


@pytest.fixture
def page() -> Iterator:
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=FLAGS)
        tab = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        yield tab
        browser.close()
        assert not errors, errors


def _cells(page, selector: str) -> list[list[str]]:
    return page.eval_on_selector_all(
        selector, "rows => rows.map(r => [...r.cells].map(c => c.innerText.trim()))"
    )


def test_question_response_token_and_eta_in_chromium(view_stores, serve, page, tmp_path, monkeypatch, capsys):
    store = view_stores["answers"]
    copy = tmp_path / "copy"  # thinkn --from writes its summary into the store it reads
    shutil.copytree(store, copy)
    # the page's defaults here: n cut to the pool
    voting = VotingConfig(n=4, eta=0.5, rank_prefix=50, trials=10)
    code, out, err = run(
        monkeypatch,
        capsys,
        "thinkn",
        "--from",
        copy,
        "--n",
        "4",
        "--eta",
        "0.5",
        "--prefix",
        "50",
        "--trials",
        "10",
        "--methods",
        "all",  # every DeepConf variant on its own line, as the page shows them
    )
    assert code in (0, None), err
    page.goto(serve(store))
    page.wait_for_selector("#voting.ready tbody tr", timeout=WAIT_MS)  # every row (DeepConf's come last)
    table, paired = _printed_tables(out)  # the voting table, then the paired table with the control under it
    assert _cells(page, "#voting tbody tr") == table
    assert _cells(page, "#paired tbody tr") == paired
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)

    # question → its responses, Think@n's marks on trial 0's draw
    page.wait_for_selector(
        "#questions tbody tr td.mark .right, #questions tbody tr td.mark .wrong", timeout=WAIT_MS
    )
    qid = page.eval_on_selector("#questions tbody tr", "r => r.dataset.id")
    page.click(f'#questions tbody tr[data-id="{qid}"] a')
    page.wait_for_selector("#responses tbody tr", timeout=WAIT_MS)
    dtr = DTRConfig.from_dict(read_manifest(store)["dtr"])
    pools, _ = load_pools(store, dtr, voting.n)
    ids = [r["id"] for r in iter_samples(store) if r["question_id"] == qid]
    picks = draw(len(pools[qid]), voting.n, voting.seed, 0, sorted(pools).index(qid))

    def kept_shown() -> list[str]:
        return page.eval_on_selector_all("#responses tbody tr.kept", "rows => rows.map(r => r.dataset.id)")

    for eta in (0.5, 0.75, 0.25):
        if eta != 0.5:  # η changed on the page: Think@n selects again
            page.fill("#set-eta", str(eta))
            page.press("#set-eta", "Enter")
            kept = math.ceil(eta * 4)
            page.wait_for_function(
                f"document.querySelectorAll('#responses tbody tr.kept').length === {kept}", timeout=WAIT_MS
            )
        outcome = think_at_n([pools[qid][p] for p in picks], VotingConfig(n=4, eta=eta, rank_prefix=50))
        assert kept_shown() == [ids[picks[k]] for k in outcome.kept]
    script = "rows => rows.map(r => [r.dataset.id, r.querySelector('[data-field=prefix_dtr]').innerText])"
    shown = dict(page.eval_on_selector_all("#responses tbody tr", script))
    assert shown == {i: js_fixed(r.prefix_dtr(50), 3) for i, r in zip(ids, pools[qid], strict=True)}
    script = "rows => rows.map(r => [r.dataset.id, r.querySelector('[data-field=token_count]').innerText])"
    counts = dict(page.eval_on_selector_all("#responses tbody tr", script))  # each response's, not "—"
    assert counts == {r["id"]: str(r["token_count"]) for r in iter_samples(store) if r["question_id"] == qid}
    page.screenshot(path=str(tmp_path / "question.png"), full_page=True)

    # response → its tokens; a token → its divergence at every layer; the heatmap
    # a kept response long enough for token 5 (a random-init model may draw its end token first)
    records = {r["id"]: r for r in iter_samples(store)}
    rid = next(i for i in kept_shown() + ids if records[i]["token_count"] > 5)
    record = records[rid]
    page.click(f'#responses tbody tr[data-id="{rid}"] a')
    page.wait_for_selector("#tokens .tok", timeout=WAIT_MS)
    assert page.eval_on_selector_all("#tokens .tok", "s => s.length") == record["token_count"]
    depth = settling_depth(torch.tensor(record["divergence"]), dtr.g).tolist()
    # its facts: generated tokens, the DTR once (4 decimals), the prompt as the model read it — open, foldable
    assert page.inner_text('[data-fact="tokens"]').startswith(f"{record['token_count']} generated, ")
    deep = deep_flags(torch.tensor(depth), 3, dtr.rho, dtr.deep_rule).tolist()
    assert page.inner_text('[data-fact="DTR"]').startswith(js_fixed(sum(deep) / len(deep), 4) + " over")
    assert (
        page.eval_on_selector_all(".facts dt", "ts => ts.filter(t => /dtr/i.test(t.innerText)).length") == 1
    )
    prompt = load_tokenizer(read_manifest(store)["model"]).decode(record["prompt_ids"])
    assert page.eval_on_selector("#prompt", "d => d.open") and page.is_visible("#prompt pre")
    assert page.eval_on_selector("#prompt pre", "p => p.textContent") == prompt
    page.click("#prompt summary")
    assert not page.is_visible("#prompt pre")
    page.click('#tokens .tok[data-i="2"]')
    assert page.inner_text('#token-facts [data-field="settling depth"]') == f"layer {depth[2]} of 3"
    page.click("#token-panel details summary")
    values = page.eval_on_selector_all("#layer-values td.num", "cells => cells.map(c => c.innerText)")
    assert values == [
        js_fixed(v, 5) for v in record["divergence"][2]
    ]  # the stored float32, as toFixed shows it
    page.click("#show-heatmap")
    box = page.locator("#heatmap").bounding_box()
    assert box and box["width"] > 0
    # the axes: every layer numbered (3 here), the tokens from 0 on, each axis titled
    layers = page.eval_on_selector_all("#heatmap-y text[data-layer]", "ts => ts.map(t => t.textContent)")
    assert layers == ["1", "2", "3"]
    ticks = page.eval_on_selector_all(
        "#heatmap-x text[data-token]", "ts => ts.map(t => Number(t.textContent))"
    )
    assert ticks[0] == 0 and ticks == sorted(ticks) and ticks[-1] < record["token_count"]
    titles = page.eval_on_selector_all(
        ".axis text:not([data-layer]):not([data-token])", "ts => ts.map(t => t.textContent)"
    )
    assert sorted(titles) == ["layer", "token"]
    page.screenshot(path=str(tmp_path / "heatmap.png"), full_page=True)
    page.mouse.click(
        box["x"] + box["width"] * (5.5 / record["token_count"]), box["y"] + 4
    )  # the column of token 5
    page.wait_for_function(
        "document.querySelector('#token-panel h3').innerText.startsWith('token 5')", timeout=WAIT_MS
    )
    page.screenshot(path=str(tmp_path / "response.png"), full_page=True)


def test_score_store_records_in_chromium(view_stores, serve, page, tmp_path):
    page.goto(serve(view_stores["scores"]))
    page.wait_for_selector("#records tbody tr", timeout=WAIT_MS)
    first = page.eval_on_selector("#records tbody tr", "r => r.dataset.id")
    stored = next(r for r in iter_samples(view_stores["samples_jsonl"]) if r["id"] == first)
    page.click(f'#records tbody tr[data-id="{first}"] a')
    page.wait_for_selector("#tokens .tok", timeout=WAIT_MS)
    assert page.eval_on_selector_all("#tokens .tok", "s => s.length") == stored["token_count"]
    # a record was scored, not generated; its DTR is shown once, to the 4 decimals of the metrics beside it
    assert page.inner_text("#response h2") == f"record {first}"
    assert page.inner_text('[data-fact="tokens"]').startswith(f"{stored['token_count']} scored, ")
    dts = page.eval_on_selector_all(".facts dt", "ts => ts.map(t => t.innerText)")
    assert [t for t in dts if t.lower() == "dtr"] == ["DTR"]
    assert page.locator("#prompt").count() == 0  # a score store keeps no prompt
    page.screenshot(path=str(tmp_path / "record.png"), full_page=True)


def test_an_interrupted_run_says_so_in_chromium(view_stores, serve, page, tmp_path, monkeypatch):
    from tests.test_view_edges import interrupted_store

    page.goto(serve(interrupted_store(view_stores, tmp_path / "cut", monkeypatch)))
    page.wait_for_selector("#notices p.notice", timeout=WAIT_MS)
    assert "incomplete, 2 of 4 responses (2 questions × pool 2); `--resume` finishes it" in page.inner_text(
        "#notices"
    )


def test_tcb_trace_in_chromium(view_stores, serve, page):
    (line,) = iter_jsonl(view_stores["tcb"] / "trace.progress.jsonl")
    rows = line["rows"]["rows"]
    page.goto(serve(view_stores["tcb"]) + "#/r/trace")
    page.wait_for_selector("#tokens .tok", timeout=WAIT_MS)
    assert page.eval_on_selector_all("#tokens .tok", "s => s.length") == len(rows)
    assert page.eval_on_selector_all("#tokens .tok.drop", "s => s.length") == sum(
        r["sharp_drop"] for r in rows
    )
    page.click('#tokens .tok[data-i="1"]')
    assert page.inner_text('#token-facts [data-field="tcb"]') == js_fixed(round(rows[1]["tcb"], 6), 4)


def _labels(store) -> dict[int, str]:
    """Every token id's label as the explorer shows it: ``token_texts`` with the store's model's tokenizer."""
    from depthlens.models.load import load_tokenizer
    from depthlens.models.tokens import token_texts

    tokenizer = load_tokenizer(read_manifest(store)["model"])
    return dict(enumerate(token_texts(tokenizer, list(range(len(tokenizer))))))


def _lens_grid(page) -> list[list[str]]:
    script = (
        "rows => rows.map(r => [r.dataset.layer, ...[...r.querySelectorAll('td')].map(c => c.textContent)])"
    )
    return page.eval_on_selector_all("#logit-lens tbody tr", script)


def _top_list(page) -> list[list[str]]:
    return page.eval_on_selector_all(
        "#layer-top tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )


def _check_colour_scale(page, scale: str, label: str, ticks: list[str], values: np.ndarray) -> None:
    """The logit lens's colour key (issue 57, item 6): what the colour means, its ends and middle numbered, shown
    above the grid, and every cell's colour the key's swatch at the cell's value ([T, L] values, scale 0..1)."""
    assert page.locator(f"{scale} .scale-label").inner_text() == label
    assert page.eval_on_selector_all(f"{scale} .tick", "ts => ts.map(t => t.textContent)") == ticks
    bar = page.locator(f"{scale} .ramp").bounding_box()
    grid = page.locator(".lens-scroll").bounding_box()
    assert (
        bar["width"] >= 200 and bar["height"] >= 10 and bar["y"] + bar["height"] <= grid["y"]
    )  # in view, above
    swatches = page.eval_on_selector_all(
        f"{scale} .ramp span", "s => s.map(e => getComputedStyle(e).backgroundColor)"
    )
    script = "cs => cs.map(c => [+c.dataset.t, +c.dataset.layer, getComputedStyle(c).backgroundColor])"
    cells = page.eval_on_selector_all("#logit-lens td", script)
    assert len(cells) == values.size and len(swatches) > 10
    top = len(swatches) - 1
    for t, layer, colour in cells:
        x = min(max(float(values[t, layer - 1]), 0.0), 1.0)
        assert colour == swatches[math.floor(x * top + 0.5)], (t, layer, x)


def test_layer_predictions_and_the_logit_lens_in_chromium(view_stores, serve, page, tmp_path):
    """``--layer-top-k``: a click on a heatmap cell (token t, layer l) lists that layer's top-k with probabilities;
    the logit lens draws every read-out token × layer with its top-1 token; both equal the stored ids and
    probabilities, labelled by the tokenizer. A store without them says how to get them."""
    store = view_stores["lens"]
    label = _labels(store)
    record = max(iter_samples(store), key=lambda r: r["token_count"])
    ids, probs = np.asarray(record["layer_top_ids"]), np.asarray(record["layer_top_probs"])
    T, L, _ = ids.shape
    assert ids.shape == (record["token_count"], 3, 3) and T > 2  # every token read out, 3 layers, K = 3
    page.goto(serve(store) + f"#/r/{record['id']}")
    page.wait_for_selector("#tokens .tok", timeout=WAIT_MS)
    page.click("#show-heatmap")
    box = page.locator("#heatmap").bounding_box()
    cw, ch = (
        box["width"] / T,
        (box["height"] - 6) / L,
    )  # the canvas: L rows of cells above a 6-pixel tick strip
    t, layer = 2, 2
    page.mouse.click(box["x"] + (t + 0.5) * cw, box["y"] + (L - layer + 0.5) * ch)
    page.wait_for_selector(f'#layer-top-title[data-layer="{layer}"]', timeout=WAIT_MS)
    assert page.inner_text("#token-panel h3").startswith(f"token {t}")

    def listed(t: int, layer: int) -> list[list[str]]:
        row = zip(ids[t, layer - 1], probs[t, layer - 1], strict=True)
        return [[str(k + 1), label[int(i)], js_fixed(float(p), 4)] for k, (i, p) in enumerate(row)]

    assert _top_list(page) == listed(t, layer)
    page.keyboard.press("ArrowUp")  # the next layer up, the same token
    page.wait_for_selector(f'#layer-top-title[data-layer="{layer + 1}"]', timeout=WAIT_MS)
    assert _top_list(page) == listed(t, layer + 1)
    page.screenshot(path=str(tmp_path / "layer-top.png"), full_page=True)

    page.click("#show-lens")
    page.wait_for_selector("#logit-lens tbody tr", timeout=WAIT_MS)
    expected = [[str(n), *(label[int(ids[s, n - 1, 0])] for s in range(T))] for n in range(L, 0, -1)]
    assert _lens_grid(page) == expected
    tokens = page.eval_on_selector_all("#logit-lens thead th[data-t]", "hs => hs.map(h => h.textContent)")
    assert tokens == [label[i] for i in record["token_ids"][:T]]
    page.click(f'#logit-lens td[data-t="{T - 1}"][data-layer="1"]')
    page.wait_for_selector('#layer-top-title[data-layer="1"]', timeout=WAIT_MS)
    assert _top_list(page) == listed(T - 1, 1)
    assert page.eval_on_selector("#logit-lens td.picked", "c => [c.dataset.t, c.dataset.layer]") == [
        str(T - 1),
        "1",
    ]
    _check_colour_scale(page, "#lens-scale", "top-1 probability", ["0", "0.5", "1"], probs[:, :, 0])
    page.select_option("#lens-colour", "divergence")  # coloured by the divergence: the same cells
    page.wait_for_selector("#logit-lens tbody tr", timeout=WAIT_MS)
    assert _lens_grid(page) == expected
    divergence = np.asarray(record["divergence"], dtype=np.float32)
    _check_colour_scale(
        page, "#lens-scale", "divergence to the final layer (bits)", ["0", "0.5", "1"], divergence
    )
    assert page.locator("#heatmap-scale .scale-label").inner_text() == "divergence to the final layer (bits)"
    page.screenshot(path=str(tmp_path / "logit-lens.png"), full_page=True)
    assert page.inner_text("#notices") == ""  # the nested [T][L][K] fields read as numbers: nothing "damaged"
    # a long response: the grid scrolls, the token labels and layer numbers stay in view
    assert T > 50
    scroll = page.locator(".lens-scroll")
    assert scroll.evaluate("s => s.scrollWidth > s.clientWidth")
    scroll.evaluate("s => { s.scrollLeft = s.scrollWidth; s.scrollTop = s.scrollHeight; }")
    frame = scroll.bounding_box()
    number = page.locator('#logit-lens tbody tr[data-layer="1"] th.layer').bounding_box()
    header = page.locator('#logit-lens thead th[data-t="0"]').bounding_box()
    assert abs(number["x"] - frame["x"]) <= 2 and abs(header["y"] - frame["y"]) <= 2

    # a score store (JSONL) keeps token labels but ids only for the layers: the tokenizer labels them
    scored = next(r for r in iter_jsonl(view_stores["lens_scores"]) if r.get("layer_top_ids"))
    page.goto(serve(view_stores["lens_scores"]) + f"#/r/{scored['id']}?view=lens")
    page.wait_for_selector("#logit-lens tbody tr", timeout=WAIT_MS)
    top = np.asarray(scored["layer_top_ids"])
    assert _lens_grid(page) == [
        [str(n), *(label[int(top[s, n - 1, 0])] for s in range(len(top)))] for n in range(L, 0, -1)
    ]

    # a store without them: both places say how to get them
    plain = next(r for r in iter_samples(view_stores["samples"]) if r["token_count"] > 1)
    page.goto(serve(view_stores["samples"]) + f"#/r/{plain['id']}")
    page.wait_for_selector("#tokens .tok", timeout=WAIT_MS)
    page.click('#tokens .tok[data-i="1"]')
    assert "--layer-top-k" in page.inner_text("#layer-top-missing")
    page.click("#show-lens")
    assert "--layer-top-k" in page.inner_text("#lens-missing")


def test_a_cells_list_says_the_read_out_tokens_probability_and_rank(serve, page, tmp_path):
    """``layer_target``: a click on a heatmap cell (token t, layer l) ends the cell's list with the read-out
    token's probability and rank at that layer, as stored; ↑ moves it with the layer; a store with the trajectory
    and no top-k shows that line alone, with the note on how to keep the top-k."""
    from tests.test_view_trajectory import trajectory_store

    for store in (trajectory_store(tmp_path), trajectory_store(tmp_path, top_k=0)):
        record = max(iter_samples(store), key=lambda r: r["token_count"])
        logprobs, ranks = (
            np.asarray(record["layer_target_logprobs"]),
            np.asarray(record["layer_target_ranks"]),
        )
        T, L = ranks.shape
        page.goto(serve(store) + f"#/r/{record['id']}")
        page.wait_for_selector("#tokens .tok", timeout=WAIT_MS)
        page.click("#show-heatmap")
        box = page.locator("#heatmap").bounding_box()
        cw, ch = box["width"] / T, (box["height"] - 6) / L
        t, layer = 2, 2
        page.mouse.click(box["x"] + (t + 0.5) * cw, box["y"] + (L - layer + 0.5) * ch)
        for at in (layer, layer + 1):
            page.wait_for_selector(f'#layer-target[data-layer="{at}"]', timeout=WAIT_MS)
            line = page.inner_text("#layer-target")
            rank = int(ranks[t, at - 1])
            assert page.get_attribute("#layer-target", "data-rank") == str(rank)
            assert f"layer {at}: p = {js_fixed(math.exp(float(logprobs[t, at - 1])), 4)}" in line
            assert f"rank {rank}" in line
            page.keyboard.press("ArrowUp")
        if "k0" in store.name:
            assert page.locator("#layer-top").count() == 0 and page.locator("#layer-top-missing").count() == 1
