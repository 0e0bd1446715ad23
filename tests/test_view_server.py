"""``depthlens view`` as a server: a real uvicorn in a subprocess refuses paths outside its page (``..``, encoded
or not), stops cleanly on SIGTERM and Ctrl-C; a port in use and a missing extra are one error line each."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_cli import run

pytest.importorskip("uvicorn")
SRC = Path(__file__).parent.parent / "src"
OUTSIDE = [
    "/static/../../pyproject.toml",
    "/static/%2e%2e/%2e%2e/pyproject.toml",
    "/static/..%2f..%2fpyproject.toml",
    "/static/%2E%2E%2F%2E%2E%2Fsamples%2Fmanifest.json",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/../../etc/passwd",
    "/samples/manifest.json",
    "/questions.jsonl",
    "/static//etc/passwd",
    "/api/response?id=../../samples/manifest.json",
]


def _start(store: Path) -> tuple[subprocess.Popen[str], int]:
    """``depthlens view STORE --port 0`` in a subprocess, once it serves: (the process, its port)."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "400", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from depthlens.cli.app import main; main()",
            "view",
            str(store),
            "--port",
            "0",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        found = re.search(r"at http://127\.0\.0\.1:(\d+)/", line)
        if found:
            return proc, int(found.group(1))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    err = proc.stderr.read()
    proc.stderr.close()
    raise AssertionError(f"the server did not start: {err}")


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)  # sent as written: http.client does not normalise the path
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


@pytest.mark.parametrize(("stop", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_serves_only_its_page_and_stops_cleanly(view_stores, stop, code):
    proc, port = _start(view_stores["samples"])
    try:
        assert _get(port, "/")[0] == 200 and _get(port, "/static/app.js")[0] == 200
        if stop == signal.SIGTERM:
            for path in OUTSIDE:
                status, body = _get(port, path)
                assert status == 404, (path, status, body[:200])
            status, _ = _get(port, "/api/run")
            assert status == 200
        proc.send_signal(stop)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        err = proc.stderr.read()
        proc.stderr.close()
    assert proc.returncode == code, err
    assert f"stopped ({stop.name}); the store was only read" in err and "Traceback" not in err
    with socket.socket() as probe:  # the port was let go
        probe.bind(("127.0.0.1", port))


def test_a_port_in_use_is_one_error_line(view_stores, monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, _, err = run(monkeypatch, capsys, "view", view_stores["samples"], "--port", port)
    assert code == 2
    assert err == f"error: --port {port}: 127.0.0.1:{port} is in use (another server?); pick another --port\n"


def test_without_the_web_extra_the_command_says_how_to_install_it(view_stores, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn → ImportError
    code, _, err = run(monkeypatch, capsys, "view", view_stores["samples"])
    assert code == 2
    assert err == "error: depthlens view needs the view extra: pip install 'depthlens[view]'\n"


def test_open_opens_the_page_once_it_serves(view_stores, monkeypatch):
    import webbrowser

    from depthlens.view.app import Explorer, make_app
    from depthlens.view.server import bind, serve
    from depthlens.view.store import open_store

    opened: list[str] = []

    def fake_open(url: str) -> bool:
        opened.append(url)
        assert _get(int(url.rsplit(":", 1)[1].strip("/")), "/api/run")[0] == 200  # it serves already
        os.kill(os.getpid(), signal.SIGINT)  # then stop it, as Ctrl-C would
        return True

    monkeypatch.setattr(webbrowser, "open", fake_open)
    explorer = Explorer.of(open_store(view_stores["samples"]))
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    assert serve(make_app(explorer), sock, open_browser=True) == "SIGINT"
    assert opened == [f"http://127.0.0.1:{port}/"]
