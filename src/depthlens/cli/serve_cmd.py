"""``depthlens serve``: an OpenAI-compatible server whose answers carry their depth (docs/serve.md)."""

from __future__ import annotations

import dataclasses
import importlib.util
import signal
from typing import TYPE_CHECKING, Any

from depthlens.cli import groups, specs
from depthlens.cli import options as opt
from depthlens.cli.app import app, err_console, load_for, warn
from depthlens.config import Backend, EngineConfig, ModelSpec, ReadoutConfig, ServeConfig
from depthlens.errors import ConfigError
from depthlens.models.catalogue import DEFAULT_MODEL

if TYPE_CHECKING:
    from depthlens.serve.engines import Engine

SERVE_MISSING = (
    "depthlens serve needs the serve extra: pip install 'depthlens[serve]' "
    "(FastAPI, uvicorn, prometheus-client)"
)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _check_extra() -> None:
    if any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "prometheus_client")):
        raise ConfigError(SERVE_MISSING)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask, and how many are served at once (``ServeConfig``)."""

    max_n: opt.ServeMaxN = ServeConfig.max_n
    max_tokens: opt.MaxTokens = ServeConfig.max_tokens
    default_max_tokens: opt.DefaultMax = ServeConfig.default_max_tokens
    max_prompts: opt.MaxPrompts = ServeConfig.max_prompts
    max_running: opt.MaxRunning = ServeConfig.max_running
    max_queue: opt.MaxQueue = ServeConfig.max_queue
    max_body_bytes: opt.MaxBody = ServeConfig.max_body_bytes
    shutdown_grace: opt.Grace = ServeConfig.shutdown_grace

    def config(self, model_id: str, api_key: str | None, readout_tokens: int | None) -> ServeConfig:
        return ServeConfig(
            model_id,
            api_key,
            self.max_n,
            self.max_tokens,
            self.default_max_tokens,
            self.max_prompts,
            readout_tokens,
            self.max_running,
            self.max_queue,
            self.max_body_bytes,
            self.shutdown_grace,
        )


@app.command("serve", short_help="An OpenAI-compatible server whose answers carry their depth.")
@groups.grouped
def serve(
    *,
    model: opt.Model = DEFAULT_MODEL,
    backend: opt.ServeBackend = "auto",
    host: opt.Host = ServeConfig.HOST,
    port: opt.Port = ServeConfig.PORT,
    api_key: opt.ApiKey = ServeConfig.api_key,
    served_model_name: opt.ServedName = None,
    readout_tokens: opt.ServeReadout = str(ServeConfig.readout_tokens),
    lens: opt.LensOpt = str(ReadoutConfig.lens),
    limits: Limits,
    device: opt.Device = ModelSpec.device,
    dtype: opt.DType = ModelSpec.dtype,
    trust_remote_code: opt.TrustRemoteCode = ModelSpec.trust_remote_code,
    tensor_parallel_size: opt.TensorParallel = EngineConfig.tensor_parallel_size,
    gpu_memory_utilization: opt.GpuMemory = EngineConfig.gpu_memory_utilization,
    max_model_len: opt.ModelLen = EngineConfig.max_model_len,
    enforce_eager: opt.EnforceEager = EngineConfig.enforce_eager,
    kv_cache_gib: opt.KvCacheGib = EngineConfig.kv_cache_gib,
    log_level: opt.LogLevel = ServeConfig.LOG_LEVEL,
) -> None:
    """Serve MODEL behind the OpenAI API (/v1/models, /v1/completions, /v1/chat/completions, /health).

    Each choice carries a `depthlens` object (DTR, settling depth, the baselines); requests may ask for Think@n or
    online Think@n / DeepConf in `depthlens` (docs/serve.md). SIGTERM stops taking requests, lets those in flight
    finish for --shutdown-grace seconds, aborts the rest and exits 0.
    """
    _check_extra()
    window = specs.readout_tokens(readout_tokens, ServeConfig.readout_tokens)
    readout = specs.readout_config(
        ReadoutConfig.divergence, lens=lens
    )  # a tuned lens resolved, before any load
    settings = limits.config(served_model_name or model, api_key, window)
    from depthlens.studies.runs import check_serve, sample_limit

    check_serve(settings)  # the request threads and bodies it holds, against this machine
    chosen = _backend(backend, model)
    model_spec = ModelSpec(model, device, dtype, trust_remote_code)
    vllm = (tensor_parallel_size, gpu_memory_utilization, max_model_len, enforce_eager, kv_cache_gib)
    engine_config = EngineConfig(chosen, dtype, *vllm)
    if host not in LOOPBACK and api_key is None:
        warn(
            f"--host {host} answers other machines and no --api-key is set: anyone who reaches it can use it"
        )
    # vllm: only the tokenizer and config — the engine holds the one copy of the weights and reads them out itself
    model_or_info = load_for(engine_config, model_spec)
    if chosen == "hf":  # one request at a time: its samples' KV cache and readout must fit the memory
        settings = sample_limit(settings, model_or_info)
    from depthlens.models.info import sampling_defaults

    temperature, top_p, source = sampling_defaults(model_or_info)
    settings = dataclasses.replace(settings, temperature=temperature, top_p=top_p)
    err_console.print(
        f"a request without temperature / top_p samples at {temperature:g} / {top_p:g} ({source})"
    )
    with err_console.status(f"starting the {chosen} engine"):
        engine = _engine(model_or_info, engine_config, limits.max_running, readout)
    _run(engine, model_or_info.tokenizer, settings, host, port, log_level)


def _backend(backend: str, model: str) -> Backend:
    """``--backend`` for a server (``sampling.choose.server_backend``: vllm where it is installed and can load
    ``model``, else hf), checked, and said on stderr with why and what its start costs, before anything loads."""
    from depthlens.cli.flags import flag_for
    from depthlens.errors import spelt
    from depthlens.sampling.choose import server_backend, server_backend_line

    name, why = server_backend(backend, model)
    chosen = specs.engine_backend(name, model)
    line = spelt(server_backend_line(chosen, why), lambda s: flag_for(None, s) or s)
    err_console.print(line, highlight=False, markup=False, soft_wrap=True)
    return chosen


def _engine(model: Any, config: EngineConfig, max_running: int, readout: ReadoutConfig) -> Engine:
    """``model``: a ``ModelInfo`` for vllm, a ``LoadedModel`` for hf (``cli.app.load_for``)."""
    from depthlens.serve.engines import HFEngine, VLLMEngine

    if config.backend == "vllm":
        return VLLMEngine(model, config, readout, max_running=max_running)
    return HFEngine(model, readout)


def _run(engine: Engine, tokenizer: Any, settings: ServeConfig, host: str, port: int, log_level: str) -> None:
    from depthlens.serve.app import create_app
    from depthlens.serve.server import finish, make_server

    application = create_app(engine, tokenizer, settings)
    server = make_server(application, host, port, log_level, settings.shutdown_grace)
    # uvicorn shuts down gracefully on SIGTERM / SIGINT, then raises the signal again for the handler it found:
    # make those no-ops, so a server stopped on purpose exits 0 (the CLI's own handlers report an interrupted
    # store and exit 143 / 130).
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda signum, frame: None)
    err_console.print(
        f"serving {settings.model_id} ({engine.name}) on http://{host}:{port}/v1; SIGTERM or Ctrl-C stops it",
        highlight=False,
    )
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits 1 when it cannot bind; its log line says why
        raise ConfigError(
            f"could not serve on {host}:{port} (in use, or not an address of this machine)"
        ) from exc
    finally:
        finish(application.state.server.runner)  # no request thread left inside an engine step at exit
