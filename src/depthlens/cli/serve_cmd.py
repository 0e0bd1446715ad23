"""``depthlens serve``: an OpenAI-compatible server whose answers carry their depth (docs/serve.md)."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
from typing import TYPE_CHECKING, Annotated, Any

import typer

from depthlens.cli import options as opt
from depthlens.cli import specs
from depthlens.cli.app import app, err_console, load_for, warn
from depthlens.config import EngineConfig
from depthlens.errors import ConfigError

if TYPE_CHECKING:
    from depthlens.serve.engines import Engine
    from depthlens.serve.settings import ServeConfig

SERVE_MISSING = "depthlens serve needs the serve extra: pip install 'depthlens[serve]' (FastAPI and uvicorn)"
LOOPBACK = ("127.0.0.1", "localhost", "::1")

ServeBackendOpt = Annotated[
    str,
    typer.Option("--backend", help="vllm (one engine for every request: continuous batching; needs "
                 "depthlens[vllm]), hf (transformers, one request at a time) or auto = vllm where installed and "
                 "able to load the model, else hf ($DEPTHLENS_BACKEND, when set, decides auto)."),
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
    typer.Option("--readout-tokens", help="Leading tokens of each sample read out at every layer unless a request "
                 "says: N or 'all' (raised to a request's DTR prefix)."),
]  # fmt: skip
MaxN = Annotated[int, typer.Option("--max-n", min=1, help="Most samples one request may ask for.")]
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


def _check_extra() -> None:
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        raise ConfigError(SERVE_MISSING)


@app.command("serve", short_help="An OpenAI-compatible server whose answers carry their depth.")
def serve(
    model: opt.Model = opt.DEFAULTS["model"],
    backend: ServeBackendOpt = "auto",
    host: Host = "127.0.0.1",
    port: Port = 8000,
    api_key: ApiKey = None,
    served_model_name: ServedName = None,
    readout_tokens: ServeReadout = "50",
    max_n: MaxN = 64,
    max_tokens: MaxTokens = 4096,
    default_max_tokens: DefaultMax = 512,
    max_prompts: MaxPrompts = 16,
    max_running: MaxRunning = 32,
    max_queue: MaxQueue = 64,
    max_body_bytes: MaxBody = 1 << 20,
    shutdown_grace: Grace = 30.0,
    device: opt.Device = "auto",
    dtype: opt.DType = "auto",
    trust_remote_code: opt.TrustRemoteCode = False,
    tensor_parallel_size: opt.TensorParallel = 1,
    gpu_memory_utilization: opt.GpuMemory = None,
    max_model_len: opt.MaxModelLen = None,
    enforce_eager: opt.EnforceEager = False,
    kv_cache_gib: opt.KvCacheGib = None,
    log_level: LogLevel = "warning",
) -> None:
    """Serve MODEL behind the OpenAI API (/v1/models, /v1/completions, /v1/chat/completions, /health).

    Each choice carries a `depthlens` object (DTR, settling depth, the baselines); requests may ask for Think@n or
    online Think@n / DeepConf in `depthlens` (docs/serve.md). SIGTERM stops taking requests, lets those in flight
    finish for --shutdown-grace seconds, aborts the rest and exits 0.
    """
    _check_extra()
    from depthlens.serve.settings import ServeConfig

    window = specs.readout_tokens(readout_tokens, 50)
    settings = ServeConfig(served_model_name or model, api_key, max_n, max_tokens, default_max_tokens, max_prompts,
                           window, max_running, max_queue, max_body_bytes, shutdown_grace)  # fmt: skip
    chosen = _backend(backend, model)
    engine_config = EngineConfig(chosen, dtype, tensor_parallel_size, gpu_memory_utilization, max_model_len,
                                 enforce_eager, kv_cache_gib)  # fmt: skip
    if host not in LOOPBACK and api_key is None:
        warn(
            f"--host {host} answers other machines and no --api-key is set: anyone who reaches it can use it"
        )
    # vllm: only the tokenizer and config — the engine holds the one copy of the weights and reads them out itself
    model_or_info = load_for(engine_config, specs.model_spec(model, device, dtype, trust_remote_code))
    with err_console.status(f"starting the {chosen} engine"):
        engine = _engine(model_or_info, engine_config, max_running)
    _run(engine, model_or_info.tokenizer, settings, host, port, log_level)


def _backend(backend: str, model: str) -> str:
    """``--backend`` for a server. ``auto`` is not the job-size rule of ``generate`` (a server's work has no end:
    the engine's start is paid once, and only vllm batches many clients' requests): vllm where it is installed and
    can load ``model``, else hf."""
    from depthlens.sampling.choose import AUTO_ENV, is_gguf, vllm_available

    if backend == "auto" and not os.environ.get(AUTO_ENV):
        backend = "vllm" if vllm_available() and not is_gguf(model) else "hf"
    return specs.engine_backend(backend, model)


def _engine(model: Any, config: EngineConfig, max_running: int) -> Engine:
    """``model``: a ``ModelInfo`` for vllm, a ``LoadedModel`` for hf (``cli.app.load_for``)."""
    from depthlens.serve.engines import HFEngine, VLLMEngine

    if config.backend == "vllm":
        return VLLMEngine(model, config, max_running=max_running)
    return HFEngine(model)


def _run(engine: Engine, tokenizer: Any, settings: ServeConfig, host: str, port: int, log_level: str) -> None:
    import uvicorn

    from depthlens.serve.app import create_app

    application = create_app(engine, tokenizer, settings)
    config = uvicorn.Config(application, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=math.ceil(settings.shutdown_grace))  # fmt: skip
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM / SIGINT, then raises the signal again for the handler it found:
    # make those no-ops, so a server stopped on purpose exits 0 (the CLI's own handlers report an interrupted
    # store and exit 143 / 130).
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda signum, frame: None)
    err_console.print(f"serving {settings.model_id} ({engine.name}) on http://{host}:{port}/v1; SIGTERM or "
                      "Ctrl-C stops it", highlight=False)  # fmt: skip
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits 1 when it cannot bind; its log line says why
        raise ConfigError(
            f"could not serve on {host}:{port} (in use, or not an address of this machine)"
        ) from exc
