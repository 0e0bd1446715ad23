"""Ray (the ``depthlens[ray]`` extra), imported only in this package and only inside the functions that use it:
joining a cluster or starting a local one on 127.0.0.1, the actors' environment, and the one driver every
scale-out runs on — a Ray Data pool of actors, each holding the model once, whose blocks the driver commits one
shard each to a Parquet store (``stores.shard_writer.ShardWriter``), so a resumed run skips the committed ids and
recomputes at most the blocks in flight."""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from depthlens.config import ModelSpec, RayConfig
from depthlens.errors import ClusterError, DepthlensError, named
from depthlens.stores.shard_writer import ShardWriter

EXTRA_HINT = f"{named('ray')} needs the Ray extra: pip install 'depthlens[ray]'"
# Fault injection for tests/test_ray.py: the first actor call that finds this file absent creates it and has
# Ray kill its own actor, as an operator's ``ray.kill`` or a lost node would, mid-block.
RAY_KILL_ONCE = "DEPTHLENS_FAULT_RAY_KILL_ONCE"
# For tests/test_ray.py: each actor start appends its pid to this file, so a test counts starts (a restart after a
# kill; no retry loop after a failed load) instead of timing them on a machine whose speed it does not know.
RAY_STARTS = "DEPTHLENS_FAULT_RAY_STARTS"
# A killed actor is restarted and its block retried this often (scoring and generation alike); a model that fails
# to load is not.
RESTARTS = 3


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError(EXTRA_HINT) from None
    return ray


def _probe(address: str, timeout_s: float) -> None:
    """Fail within seconds when nothing listens at ``host:port`` (``ray.init`` would retry for a minute)."""
    match = re.fullmatch(r"(?:ray://)?\[?([^\]\s]+?)\]?:(\d+)", address)
    if match is None:
        if address == "auto":
            return
        raise ClusterError(f"{named('ray_address')} {address!r}: expected HOST:PORT, ray://HOST:PORT or auto")
    host, port = match.group(1), int(match.group(2))
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ClusterError(
            f"{named('ray_address')} {address}: no Ray cluster answers there ({exc.strerror or exc}); start one with "
            f"`ray start --head`, check the address, or leave {named('ray_address')} out to run a local Ray"
        ) from None


def connect(address: str | None = None, num_cpus: int | None = None, timeout_s: float = 5.0) -> str:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), or start a local Ray bound to 127.0.0.1.

    Returns the GCS address. A Ray already initialised in this process is used as it is.
    """
    # With this off, a local Ray takes 127.0.0.1 as its node address (with _node_ip_address alone it still bound
    # the machine's own address). Ray reads it when it is imported, and its workers inherit it from here.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = import_ray()
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # imported before this call (by a test, a notebook): same effect
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _probe(address, timeout_s)
    if not ray.is_initialized():
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # no per-run INFO lines on the console
        quiet: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
        if address:
            try:
                ray.init(address=address, **quiet)
            except (ConnectionError, TimeoutError, RuntimeError) as exc:
                raise ClusterError(
                    f"{named('ray_address')} {address}: could not join the Ray cluster ({exc})"
                ) from None
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", **quiet)
    return str(ray.get_runtime_context().gcs_address)


def actor_env(cpus: float) -> dict[str, Any]:
    """The runtime environment of an actor with ``cpus`` CPUs: that many OpenMP threads in every thread of it.

    Ray runs an actor's calls on another thread than its ``__init__``, and OpenMP's thread count is per thread:
    ``torch.set_num_threads`` in ``__init__`` left the calls at one thread per core (measured: a 1-CPU actor ran
    two busy threads). The environment variable sets the default for every thread before torch starts.
    """
    threads = str(max(1, int(cpus)))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    env.update({k: os.environ[k] for k in (RAY_KILL_ONCE, RAY_STARTS) if k in os.environ})  # (tests)
    return {"env_vars": env}


def actor_load_kwargs(model: ModelSpec, ray: RayConfig) -> dict[str, Any]:
    """How each actor loads the model: as ``model`` says, on the GPU Ray gives it (``ray.gpus`` > 0) or the CPU,
    unless ``model.device`` names one device (``cuda:1``)."""
    kwargs = model.load_kwargs()
    if kwargs["device"] in ("auto", "cpu", "cuda"):
        kwargs["device"] = "cuda" if ray.gpus > 0 else "cpu"
    return kwargs


def worker_error(exc: BaseException) -> str:
    """The failing worker's own one-line error out of Ray's wrapped traceback."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    found = [ln for ln in lines if re.match(r"^(depthlens\.errors\.)?\w*(Error|Exception)\b: ", ln)]
    last = found[-1] if found else (lines[-1] if lines else type(exc).__name__)
    return re.sub(r"\x1b\[[0-9;]*m", "", last)


def run_on_actors(
    dataset: Any,
    actor: type,
    args: tuple[Any, ...],
    ray: RayConfig,
    writer: ShardWriter,
    on_block: Callable[[Any], Any],
) -> int | None:
    """Map ``dataset`` through a pool of ``ray.workers`` actors of class ``actor`` (constructed with ``args``, each
    with ``ray.cpus`` CPUs and ``ray.gpus`` GPUs), ``ray.block`` rows a call; commit each block the actors return
    as one shard of ``writer``'s store, after ``on_block(block)`` has taken what it needs (it returns the block to
    commit). Returns the model's layer count the actors reported (an ``n_layers`` column, dropped before writing).
    A worker's failure stops the run with that worker's own error line; committed shards are kept."""
    from ray.data import ActorPoolStrategy, DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.actor_init_retry_on_errors = False  # a model that does not load stops the run with its error
    context.max_errored_blocks = 0
    # Ray Data's V2 Parquet reader lists files in a task that asks for a CPU whatever the read's num_cpus; with the
    # actors holding every CPU (2 workers on a 2-CPU Ray) that task never starts and the run hangs. The V1 reader
    # honours num_cpus=0, as read_text does.
    context.use_datasource_v2 = False
    mapped = dataset.map_batches(
        actor,
        fn_constructor_args=args,
        batch_size=ray.block,
        batch_format="pyarrow",
        compute=ActorPoolStrategy(size=ray.workers),
        num_cpus=ray.cpus,
        num_gpus=ray.gpus,
        runtime_env=actor_env(ray.cpus),
        max_restarts=RESTARTS,
        max_task_retries=RESTARTS,
    )
    n_layers = writer.manifest.get("n_layers")
    try:
        for block in mapped.iter_batches(batch_size=None, batch_format="pyarrow"):
            if "n_layers" in block.column_names:
                if block.num_rows:
                    n_layers = int(block.column("n_layers")[0].as_py())
                block = block.drop_columns(["n_layers"])
            if (
                "vocab_rows" in block.column_names
            ):  # the model's vocabulary: every stored id is checked against it
                if block.num_rows and block.column("vocab_rows")[0].as_py():
                    writer.manifest["vocab_rows"] = int(block.column("vocab_rows")[0].as_py())
                block = block.drop_columns(["vocab_rows"])
            block = on_block(block)
            writer.write_table(block, n_layers)
    except DepthlensError:
        raise
    except Exception as exc:  # a Ray task or actor error: report the worker's own line, keep the shards
        raise ClusterError(
            f"a Ray worker failed: {worker_error(exc)} — shards finished so far are kept in {Path(writer.out)}; "
            f"fix the cause and rerun with {named('resume')}"
        ) from None
    return n_layers


def note_actor_start() -> None:
    """Append this actor's pid to ``RAY_STARTS``'s file, where a test asked for it (see ``RAY_STARTS``)."""
    log = os.environ.get(RAY_STARTS)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")


def maybe_kill_self() -> None:
    """Fault injection for tests/test_ray.py: the first actor call that finds ``RAY_KILL_ONCE``'s file absent
    creates it and has Ray kill its own actor, as an operator's ``ray.kill`` or a lost node would, mid-block."""
    marker = os.environ.get(RAY_KILL_ONCE)
    if marker and not os.path.exists(marker):
        Path(marker).touch()
        import ray

        ray.kill(ray.get_runtime_context().current_actor, no_restart=False)
