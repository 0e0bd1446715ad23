"""Serving the explorer: bind first (a port in use is one error line, before anything starts), then uvicorn.

Ctrl-C and SIGTERM stop it cleanly: uvicorn takes both signals while it serves, closes the socket and its
connections (waiting at most two seconds for one in flight), then hands the signal back; ``serve`` reports it
to its caller instead of letting it become an exception.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
import threading
import webbrowser
from collections.abc import Callable, Iterator
from typing import Any

from depthlens.errors import InputError, named


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; InputError naming the flag that fixes it when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise InputError(
            f"{named('host')} {host}: not an address of this machine ({exc.strerror}); use 127.0.0.1"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise InputError(
                f"{named('port')} {port}: {host}:{port} is in use (another server?); pick another {named('port')}"
            ) from None
        if exc.errno == errno.EACCES:
            raise InputError(
                f"{named('port')} {port}: not allowed to listen on it here; use a port above 1023"
            ) from None
        raise InputError(
            f"{named('host')} {host} {named('port')} {port}: cannot listen there ({exc.strerror})"
        ) from None
    return sock


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


@contextlib.contextmanager
def _caught(signals: list[int]) -> Iterator[None]:
    """Handlers that only note SIGINT / SIGTERM: uvicorn re-raises the signal it stopped on once it is down."""
    kinds = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda number, frame: signals.append(number)) for s in kinds}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def serve(
    app: Any, sock: socket.socket, on_ready: Callable[[], None] = lambda: None, open_browser: bool = False
) -> str | None:
    """Run ``app`` on ``sock`` until a signal stops it; returns the signal's name (None if it stopped by itself).

    ``on_ready`` runs once the server accepts connections; ``open_browser`` then opens the page.
    """
    import uvicorn

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    address = url(sock)

    def when_started() -> None:
        while not server.started and not server.should_exit:
            threading.Event().wait(0.05)
        if server.started:
            on_ready()
            if open_browser:
                webbrowser.open(address)

    threading.Thread(target=when_started, name="view-ready", daemon=True).start()
    received: list[int] = []
    with _caught(received):
        server.run(sockets=[sock])
    sock.close()
    return signal.Signals(received[0]).name if received else None
