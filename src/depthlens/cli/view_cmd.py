"""``depthlens view``: explore a store in the browser (docs/view.md)."""

from __future__ import annotations

from rich.markup import escape

from depthlens.cli import options as opt
from depthlens.cli.app import app, err_console
from depthlens.config.serve import LOCALHOST, VIEW_PORT
from depthlens.errors import InputError


def _web_extra() -> None:
    """Starlette and uvicorn (the ``view`` extra; the ``vllm`` extra brings them too), or one line saying so."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise InputError("depthlens view needs the view extra: pip install 'depthlens[view]'") from None


@app.command("view", short_help="Explore a store in the browser (read-only, offline).")
def view(
    store: opt.ViewStore,
    host: opt.ViewHost = LOCALHOST,
    port: opt.ViewPort = VIEW_PORT,
    open_browser: opt.OpenBrowser = False,
) -> None:
    """Serve a page over STORE: the run and its voting table, the questions, each response's tokens coloured by
    settling depth, each token's divergence across layers, and Think@n re-selecting as n, η and ℓ change.

    Read-only: nothing is written into the store. Every script and style ships with depthlens (no network).
    """
    import os
    import sys
    import time

    from depthlens.view.store import open_store

    _web_extra()
    started = time.perf_counter()
    opened = open_store(store)  # a path that is not a store is refused here, before any server starts
    from depthlens.view.app import Explorer, make_app
    from depthlens.view.server import bind, serve, url

    sock = bind(host, port)
    explorer = Explorer.of(opened)
    explorer.start()
    count = len(opened.records)
    what = f"{count} {'response' if opened.kind == 'samples' else 'record'}{'' if count == 1 else 's'}"
    for line in opened.notices:
        err_console.print(f"[yellow]notice:[/] {escape(line)}", highlight=False, soft_wrap=True)

    def ready() -> None:
        err_console.print(
            f"serving {opened.path} ({what}; opened in {time.perf_counter() - started:.1f} s) at {url(sock)} — "
            "read-only; Ctrl-C stops",
            highlight=False,
            soft_wrap=True,
        )

    try:
        stopped = serve(make_app(explorer), sock, on_ready=ready, open_browser=open_browser)
    finally:
        explorer.close()
    err_console.print(f"stopped ({stopped or 'by itself'}); the store was only read", highlight=False)
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit here, not through the interpreter's shutdown: a background vote or the tokenizer's import may still be
    # running on a daemon thread, and finalizing the interpreter under Arrow or torch code aborts the process
    # (measured: SIGABRT, "terminate called without an active exception"). Nothing is left to write: read-only.
    os._exit({"SIGTERM": 143, "SIGINT": 130}.get(stopped or "", 0))
