"""``depthlens view`` on a large store: first page, a response's heatmap, the voting index, and the server's RSS
while one pages through it (issue 31, item 4). Measured, never asserted on.

Builds (or reuses, ``--store``) a synthetic sample store laid out as ``generate`` writes one — a sharded Parquet
store, one shard per batch of 16 responses of a question, every token read out at every layer — of
``--questions`` × ``--pool`` responses of ``--tokens`` tokens on average (uniform in ±40 %) at ``--layers``
layers: 250 × 32 × 2,500 × 30 = 20 M tokens × 30 layers by default. Then starts ``depthlens view`` on it in a
subprocess and times, over HTTP on one keep-alive connection (as a browser asks): the first page (the page, its
scripts, /api/run, /api/voting, the first page of /api/questions), a response with its ``[T × L]`` divergences
(what the heatmap is drawn from), a question with its draw, the voting index's build, the voting table; and, with
Debian's chromium and Playwright, the same in the browser (until the questions table / the heatmap is drawn).

    python benchmarks/view_store.py --out docs/benchmarks/view_store.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from depthlens.config import AnswerConfig, DTRConfig, EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.evals.tasks import Question
from depthlens.stores.arrow import to_table
from depthlens.stores.layout import is_legacy, is_store, manifest_file
from depthlens.stores.sample_writes import RESUME_RULES, samples_entry, store_manifest, write_questions
from depthlens.stores.samples import SHARDS
from depthlens.stores.shard_writer import ShardWriter
from depthlens.studies.generate import sample_seed

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _batch(
    rng: np.random.Generator, q: Question, first: int, args: argparse.Namespace, schema: pa.Schema
) -> pa.Table:
    """``args.shard`` responses of question ``q`` as one shard, in the sample store's schema."""
    n, layers = args.shard, args.layers
    lengths = rng.integers(int(args.tokens * 0.6), int(args.tokens * 1.4) + 1, size=n)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    total = int(lengths.sum())
    # D[t, l]: falling from c_t toward 0 at a token's own speed (settling depths spread over the layers)
    speed = rng.uniform(0.6, 3.0, size=(total, 1))
    depth = np.arange(layers) / (layers - 1)
    table = np.clip(
        rng.uniform(0.5, 1.0, (total, 1)) * (1 - depth) ** speed + rng.normal(0, 0.02, (total, layers)), 0, 1
    )
    table[:, -1] = 0.0
    divergence = pa.FixedSizeListArray.from_arrays(pa.array(np.round(table, 5).ravel(), pa.float32()), layers)

    def floats(low: float, high: float) -> pa.Array:
        return pa.ListArray.from_arrays(
            offsets, pa.array(np.round(rng.uniform(low, high, total), 5), pa.float32())
        )

    keys = [q.answer if rng.random() < 0.5 else str(rng.integers(0, 4)) for _ in range(n)]
    letters = rng.integers(97, 123, size=4 * total, dtype=np.uint8).tobytes().decode()
    starts = np.concatenate([[0], np.cumsum(4 * lengths)])
    columns = {
        "id": [f"{q.id}#{first + i}" for i in range(n)],
        "question_id": [q.id] * n,
        "sample": list(range(first, first + n)),
        "seed": [sample_seed(0, q.id, first + i) for i in range(n)],
        "status": ["ok"] * n,
        "finish": ["eos"] * n,
        "token_count": lengths.tolist(),
        "text": [letters[starts[i] : starts[i + 1]] for i in range(n)],
        "prompt_ids": [list(range(3, 60))] * n,
        "token_ids": pa.ListArray.from_arrays(offsets, pa.array(rng.integers(3, 49152, total))),
        "answer": keys,
        "answer_source": ["boxed"] * n,
        "vote_key": keys,
        "grade": ["correct" if k == q.answer else "wrong" for k in keys],
        "correct": [k == q.answer for k in keys],
        "task_score": [float(k == q.answer) for k in keys],
        "dtr": [0.0] * n,
        "log_prob": floats(-6, 0),
        "entropy": floats(0, 5),
        "self_certainty": floats(0, 8),
        "confidence": floats(0, 12),
        "divergence": pa.ListArray.from_arrays(offsets, divergence),
    }
    return pa.table(
        [
            pa.array(columns[f.name], f.type)
            if not isinstance(columns[f.name], pa.Array)
            else columns[f.name]
            for f in schema
        ],
        schema=schema,
    )


def build(out: Path, args: argparse.Namespace) -> None:
    """The synthetic store (see the module docstring), committed shard by shard through ``ShardWriter``."""
    rng = np.random.default_rng(0)
    questions = [Question(f"q{i:04d}", f"What is {i} + {i}?", str(2 * i % 7)) for i in range(args.questions)]
    sampling = SamplingConfig(max_new_tokens=2 * args.tokens, readout_tokens=None)
    settings = {
        "task": {"name": "synthetic", "questions": args.questions},
        "pool": args.pool,
        "seed": 0,
        "batch_size": args.shard,
        **samples_entry("parquet", False),
        "sampling": sampling,
        "readout": ReadoutConfig(),
        "dtr": DTRConfig(),
        "engine": EngineConfig(),
        "answers": AnswerConfig(),
    }
    manifest = store_manifest("synthetic", args.layers, questions, settings)
    out.mkdir(parents=True, exist_ok=True)
    write_questions(out, questions)
    example = {
        "id": "x",
        "question_id": "x",
        "sample": 0,
        "seed": 0,
        "status": "ok",
        "finish": "eos",
        "token_count": 1,
        "text": "",
        "prompt_ids": [1],
        "token_ids": [1],
        "answer": "1",
        "answer_source": "boxed",
        "vote_key": "1",
        "grade": "wrong",
        "correct": False,
        "task_score": 0.0,
        "dtr": 0.0,
        "log_prob": [0.5],
        "entropy": [0.5],
        "self_certainty": [0.5],
        "confidence": [0.5],
        "divergence": [[0.5] * args.layers],
    }
    schema = to_table([example]).schema  # exactly the columns and types a generate store's shards have
    with ShardWriter(out / SHARDS, manifest, resume=False) as writer:
        for q in questions:
            for first in range(0, args.pool, args.shard):
                writer.write_table(_batch(rng, q, first, args, schema), n_layers=args.layers)


def current_layout(store: Path) -> None:
    """A store built before issue 34's layout, moved to it as the next ``--resume`` would: a resumed writer that
    writes nothing (``recover`` + ``publish``: each shard's bytes, sha256 and ids, and a run id, in _manifest.json)."""
    shards = store / SHARDS
    stored = json.loads(manifest_file(shards).read_text())
    begin = time.perf_counter()
    writer = ShardWriter(
        shards, {k: v for k, v in stored.items() if k != "shards"}, resume=True, rules=RESUME_RULES
    )
    writer.close()
    print(f"moved {store} to the current layout in {time.perf_counter() - begin:.0f} s", file=sys.stderr)


class Server:
    """``depthlens view STORE --port 0`` in a subprocess; requests on one keep-alive connection."""

    def __init__(self, store: Path) -> None:
        env = {**os.environ, "COLUMNS": "400"}
        started = time.perf_counter()
        command = [
            sys.executable,
            "-c",
            "from depthlens.cli.app import main; main()",
            "view",
            str(store),
            "--port",
            "0",
        ]
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
        while True:
            line = self.proc.stderr.readline()
            found = re.search(r"opened in ([\d.]+) s\) at (http://127\.0\.0\.1:(\d+)/)", line)
            if found:
                break
            if not line:
                raise SystemExit(f"the server did not start: {self.proc.stderr.read()}")
        self.start_s, self.opened_s = time.perf_counter() - started, float(found.group(1))
        self.url, self.port = found.group(2), int(found.group(3))
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)

    def get(self, path: str) -> tuple[float, bytes]:
        begin = time.perf_counter()
        self.conn.request("GET", path)
        body = self.conn.getresponse().read()
        return time.perf_counter() - begin, body

    def json(self, path: str) -> dict:
        return json.loads(self.get(path)[1])

    def cpu_s(self) -> float:
        """The server process's CPU seconds so far (every thread: user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.proc.stderr.close()


FIRST_PAGE = [
    "/",
    "/static/style.css",
    "/static/common.js",
    "/static/tokens.js",
    "/static/app.js",
    "/api/run",
    "/api/voting",
    "/api/questions?page=0&size=50&sort=agreement",
]


def _until(server: Server, path: str, states: tuple[str, ...]) -> float:
    """Seconds until ``path`` answers one of ``states`` (polled as the page polls)."""
    begin = time.perf_counter()
    while server.json(path).get("state") not in states:
        time.sleep(0.2)
    return time.perf_counter() - begin


def _responses(server: Server, ids: list[str]) -> tuple[list[float], list[int]]:
    times, sizes = [], []
    for rid in ids:
        seconds, body = server.get(f"/api/response?id={rid.replace('#', '%23')}")
        times.append(seconds)
        sizes.append(len(body))
    return sorted(times), sizes


def measure(server: Server, ids: list[str], questions: list[str], repeats: int) -> dict:
    """The first page while the voting index is built; responses then; the voting; then, with nothing in the
    background, the first page, responses and questions again and the RSS while paging through them."""
    first = sum(server.get(p)[0] for p in FIRST_PAGE)  # the very first page, index still building
    busy, _ = _responses(server, ids[:10])  # responses opened while the voting index is built
    index_s = _until(server, "/api/voting", ("voting", "partial", "ready"))
    quick_s = _until(server, "/api/voting", ("partial", "ready"))
    table_s = quick_s + _until(server, "/api/voting", ("ready",))
    questions_s = table_s + _until(server, "/api/questions?page=0&size=50&sort=agreement", ("ready",))
    cpu = server.cpu_s()
    pages = [sum(server.get(p)[0] for p in FIRST_PAGE) for _ in range(repeats)]
    page_cpu = (server.cpu_s() - cpu) / repeats  # nothing runs in the background now: this is the pages' work
    cpu = server.cpu_s()
    times, sizes = _responses(server, ids)
    response_cpu = (server.cpu_s() - cpu) / len(ids)
    rss = [server.rss_mb()]
    details = []
    for start in range(0, len(ids), 10):  # 10 responses, a question, a page of questions; then the RSS
        _responses(server, ids[start : start + 10])
        details.append(server.get(f"/api/question?id={questions[start % len(questions)]}")[0])
        server.get(f"/api/questions?page={(start // 10) % (len(questions) // 50 + 1)}&size=50&sort=agreement")
        rss.append(server.rss_mb())
    times.sort()
    return {
        "first_page_s": first,
        "responses_while_indexing_s": busy,
        "index_s": index_s,
        "voting_quick_s": quick_s,
        "voting_table_s": table_s,
        "questions_with_methods_s": questions_s,
        "first_page_idle_s_median": statistics.median(pages),
        "first_page_idle_all": pages,
        "first_page_cpu_s": page_cpu,
        "response_cpu_s": response_cpu,
        "response_s_median": statistics.median(times),
        "response_s_p90": times[int(0.9 * len(times))],
        "response_s_max": times[-1],
        "response_kb_median": statistics.median(sizes) / 1024,
        "question_s_median": statistics.median(details),
        "rss_mb": rss,
    }


# Installed before the page's own scripts: the moment (ms after navigation start, in the page) the questions
# table first has a row — the first page as the reader sees it, without Playwright's round trips.
FIRST_ROW = """new MutationObserver((_, seen) => { if (document.querySelector('#questions tbody tr')) {
  window.__firstRowMs = performance.now(); seen.disconnect(); } })
  .observe(document, {subtree: true, childList: true});"""
# A click on a response's heatmap link as the page handles it: the hash changes, the response is fetched and drawn;
# seconds until the canvas is in the page and a frame has been painted, timed in the page.
HEATMAP = """async (target) => { const begin = performance.now(); location.hash = target;
  await new Promise((done) => { const look = () => document.querySelector('#heatmap') ? done() :
    requestAnimationFrame(look); look(); });
  await new Promise((done) => requestAnimationFrame(() => done()));
  return (performance.now() - begin) / 1000; }"""


def browser(url: str, rids: list[str], repeats: int) -> dict | None:
    """First page and a response's heatmap as Chromium draws them (None without chromium or playwright): timed
    from Playwright (navigation → drawn, its round trips to the browser included) and inside the page (another
    response each time: nothing of it read before)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path("/usr/bin/chromium").is_file():
        return None
    first, first_in_page, heatmap, heatmap_in_page = [], [], [], []

    def target(rid: str) -> str:
        return f"#/r/{rid.replace('#', '%23')}?view=heatmap"

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
        for i in range(repeats):
            page = chromium.new_page()
            page.add_init_script(FIRST_ROW)
            begin = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#questions tbody tr", timeout=60_000)
            first.append(time.perf_counter() - begin)
            first_in_page.append(page.evaluate("() => window.__firstRowMs") / 1000)
            page.wait_for_selector("#voting.ready tbody tr", timeout=600_000)
            begin = time.perf_counter()
            page.goto(f"{url}{target(rids[2 * i])}")
            page.wait_for_selector("#heatmap", timeout=60_000)
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
            heatmap.append(time.perf_counter() - begin)
            page.goto(f"{url}#/")  # back to the run; then another heatmap as a click opens it, in the page
            page.wait_for_selector("#questions tbody tr", timeout=60_000)
            heatmap_in_page.append(page.evaluate(HEATMAP, target(rids[2 * i + 1])))
            page.close()
        chromium.close()
    return {
        "first_page_s": first,
        "first_page_in_page_s": first_in_page,
        "heatmap_s": heatmap,
        "heatmap_in_page_s": heatmap_in_page,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--store", type=Path, default=None, help="an existing store to reuse, or where to build"
    )
    parser.add_argument("--questions", type=int, default=250)
    parser.add_argument("--pool", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=2500, help="mean generated tokens per response")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument(
        "--shard", type=int, default=16, help="responses per shard (generate: its --batch-size)"
    )
    parser.add_argument("--responses", type=int, default=200, help="responses opened while paging")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    store = args.store or Path(tempfile.mkdtemp(prefix="view-store-")) / "store"
    if not is_store(store / SHARDS):
        begin = time.perf_counter()
        build(store, args)
        print(f"built {store} in {time.perf_counter() - begin:.0f} s", file=sys.stderr)
    elif is_legacy(store / SHARDS):
        current_layout(store)
    size = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    import pyarrow.dataset as ds

    shards = sorted((store / SHARDS).glob("part-*.parquet"))
    tokens = int(ds.dataset(shards).to_table(columns=["token_count"]).column("token_count").to_numpy().sum())
    load = [os.getloadavg()[0]]  # the 1-minute load average before and after: the timings are wall times
    server = Server(store)
    try:
        run = server.json("/api/run")
        every = sorted(f"q{i:04d}#{j}" for i in range(args.questions) for j in range(args.pool))
        ids = random.Random(0).sample(every, args.responses)
        unread = [
            r for r in random.Random(1).sample(every, args.responses) if r not in set(ids)
        ]  # for chromium
        questions = [f"q{i:04d}" for i in range(args.questions)]
        result = {
            "store": str(store),
            "store_gb": size / 1e9,
            "responses": run["records"],
            "tokens": tokens,
            "layers": args.layers,
            "server_start_s": server.start_s,
            "store_opened_s": server.opened_s,
            **measure(server, ids, questions, args.repeats),
        }
        result["browser"] = browser(server.url, unread[: 2 * args.repeats], args.repeats)
        result["rss_mb_after_browser"] = server.rss_mb()
        result["load_1m_before_after"] = [*load, os.getloadavg()[0]]
    finally:
        server.stop()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
