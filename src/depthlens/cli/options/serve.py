"""The two servers: ``depthlens serve`` (the OpenAI-compatible API) and ``depthlens view`` (the store explorer)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "ApiKey", "DefaultMax", "Grace", "Host", "LogLevel", "MaxBody", "MaxPrompts", "MaxQueue", "MaxRunning",
    "MaxTokens", "OpenBrowser", "Port", "ServeMaxN", "ServeReadout", "ServedName", "ViewHost", "ViewPort",
    "ViewStore",
]  # fmt: skip

Host = Annotated[
    str, typer.Option("--host", help="Address to bind; 127.0.0.1 (this machine only) by default.")
]
Port = Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port.")]
ApiKey = Annotated[
    str | None,
    typer.Option("--api-key", envvar="DEPTHLENS_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1."),
]
ServedName = Annotated[
    str | None, typer.Option("--served-model-name", help="The model's name in the API (default: --model).")
]
ServeReadout = Annotated[
    str,
    typer.Option(
        "--readout-tokens",
        help="Leading tokens of each sample read out at every layer unless a request says: N or 'all' (raised "
        "to a request's DTR prefix).",
    ),
]
ServeMaxN = Annotated[int, typer.Option("--max-n", min=1, help="Most samples one request may ask for.")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", min=1, help="Most tokens one sample may generate.")]
DefaultMax = Annotated[
    int, typer.Option("--default-max-tokens", min=1, help="A chat request's max_tokens when it gives none.")
]
MaxPrompts = Annotated[
    int, typer.Option("--max-prompts", min=1, help="Most prompts one completions request batches.")
]
MaxRunning = Annotated[
    int,
    typer.Option("--max-running", min=1, help="Requests running at once (vLLM batches them; hf runs one)."),
]
MaxQueue = Annotated[int, typer.Option("--max-queue", min=0, help="Requests waiting beyond those; then 429.")]
MaxBody = Annotated[int, typer.Option("--max-body-bytes", min=1, help="Larger request bodies get 413.")]
Grace = Annotated[
    float,
    typer.Option(
        "--shutdown-grace", min=0, help="Seconds SIGTERM gives in-flight requests before aborting them."
    ),
]
LogLevel = Annotated[str, typer.Option("--log-level", help="uvicorn's log level: warning, info, debug.")]

# `depthlens view`
ViewStore = Annotated[
    Path,
    typer.Argument(
        help="A sample store (generate / thinkn --out / an online run), a score store or a TCB trace."
    ),
]
ViewHost = Annotated[
    str, typer.Option("--host", help="Address to listen on; keep 127.0.0.1 unless you mean it.")
]
ViewPort = Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0: any free one).")]
OpenBrowser = Annotated[bool, typer.Option("--open", help="Open the page in the default browser.")]
