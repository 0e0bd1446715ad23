"""Scoring on Ray: records spread over a pool of actors that each hold the model once, into a sharded Parquet store.

Ray Data feeds blocks of records to ``map_batches`` with a callable class (``_Scorer``): its ``__init__`` loads the
model once per actor, each call scores one block with the same code as a single-process ``score`` and returns an
Arrow table. The driver commits each finished block as one shard (``parquet_store.ShardWriter``), so a resumed
run skips the committed ids and recomputes at most the blocks that were in flight. Ray is imported only here,
inside the functions that use it (``depthlens[ray]``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from depthlens.config import DTRConfig, ReadoutConfig, TCBConfig
from depthlens.errors import ClusterError, DepthlensError, InputError

EXTRA_HINT = "--ray needs the Ray extra: pip install 'depthlens[ray]'"
# Fault injection for tests/test_ray.py: the first actor call that finds this file absent creates it and has
# Ray kill its own actor, as an operator's ``ray.kill`` or a lost node would, mid-block.
_RAY_KILL_ONCE = "DEPTHLENS_FAULT_RAY_KILL_ONCE"
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
        raise ClusterError(f"--ray-address {address!r}: expected HOST:PORT, ray://HOST:PORT or auto")
    host, port = match.group(1), int(match.group(2))
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ClusterError(
            f"--ray-address {address}: no Ray cluster answers there ({exc.strerror or exc}); start one with "
            "`ray start --head`, check the address, or leave --ray-address out to run a local Ray"
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
                    f"--ray-address {address}: could not join the Ray cluster ({exc})"
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
    env.update({k: os.environ[k] for k in (_RAY_KILL_ONCE,) if k in os.environ})  # fault injection (tests)
    return {"env_vars": env}


def worker_error(exc: BaseException) -> str:
    """The failing worker's own one-line error out of Ray's wrapped traceback."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    found = [ln for ln in lines if re.match(r"^(depthlens\.errors\.)?\w*(Error|Exception)\b: ", ln)]
    last = found[-1] if found else (lines[-1] if lines else type(exc).__name__)
    return re.sub(r"\x1b\[[0-9;]*m", "", last)


class _Scorer:
    """One Ray actor: loads the model once, then scores a block of records per call into an Arrow table."""

    def __init__(
        self,
        model: str,
        load_kwargs: dict[str, Any],
        settings: dict[str, Any],
        threads: int,
        pending: set[str] | None = None,
    ) -> None:
        import torch

        from depthlens.models.load import load

        torch.set_num_threads(threads)
        self.lm = load(model, **load_kwargs)
        self.settings = settings
        self.pending = pending  # rows read by Ray Data: only these ids are scored (the rest are done or bad)

    def _records(self, batch: Any) -> list[Any]:
        """The block's records: rows the driver sent (id, line, data), or rows Ray Data read from the input
        (a JSONL line as ``text``, or a Parquet row), kept where their id is pending."""
        from depthlens.studies.records import InputRecord

        names = batch.column_names
        if "data" in names and "line" in names:
            return [InputRecord(r["id"], r["line"], json.loads(r["data"])) for r in batch.to_pylist()]
        rows = batch.column("text").to_pylist() if names == ["text"] else batch.to_pylist()
        records = []
        for row in rows:
            if isinstance(row, str):  # a JSONL line; the driver has checked every line already
                if not row.strip():
                    continue
                row = json.loads(row)
            data = {k: v for k, v in row.items() if v is not None}
            if self.pending is not None and str(data.get("id")) in self.pending:
                records.append(InputRecord(str(data["id"]), 0, data))
        return records

    def __call__(self, batch: Any) -> Any:
        from depthlens.studies.parquet_store import to_table
        from depthlens.studies.score import score_records

        marker = os.environ.get(_RAY_KILL_ONCE)
        if marker and not os.path.exists(marker):
            Path(marker).touch()
            import ray

            ray.kill(ray.get_runtime_context().current_actor, no_restart=False)
        s = self.settings
        skipped: list[dict[str, Any]] = []
        records = [dataclasses.replace(r, line=i) for i, r in enumerate(self._records(batch), start=1)]
        by_line = {r.line: r.id for r in records}
        results = list(score_records(
            self.lm, records, readout=s["readout"], dtr=s["dtr"], tcb=s["tcb"], tokens=s["tokens"],
            batch_size=s["batch_size"],
            on_skip=(lambda bad: skipped.append({"id": by_line[bad.line], "skipped": bad.reason}))
            if s["skip_bad"] else None,
        ))  # fmt: skip
        for r in results:
            r["n_layers"] = self.lm.n_layers  # read by the driver for the manifest, dropped before writing
        return to_table([*results, *skipped], float16=s["float16"])


def _input_dataset(
    ray: Any, in_path: Path, records: list[Any], todo: list[Any], bad: list[Any], block_rows: int
) -> tuple[Any, set[str] | None]:
    """The records to score as a Ray Dataset, and the ids its workers keep (None: every row is one to score).

    A clean input (every record with its own id, no bad line) is read by Ray Data itself (``read_text`` for JSONL,
    ``read_parquet``), so on a cluster the records go from storage to the workers, not through the driver. Records
    named by their line number, an input with bad lines skipped, or a Ray Client connection (``ray://``, where
    ``local://`` paths cannot be read) are sent from the driver's own reading (which knows the line numbers).
    """
    if not bad and all("id" in r.data for r in records) and not ray.util.client.ray.is_connected():
        from depthlens.studies.stores import input_shards

        shards = input_shards(in_path)
        reader = ray.data.read_text if shards is None else ray.data.read_parquet
        paths = str(in_path.resolve()) if shards is None else [str(p.resolve()) for p in shards]
        # Read on the driver's node (the input need not be on every node of a cluster), split there into blocks
        # of about ``block_rows`` lines for the actors. No CPU is reserved for it: the actors may hold them all.
        here = {"ray.io/node-id": ray.get_runtime_context().get_node_id()}
        dataset = reader(paths, override_num_blocks=max(1, -(-len(records) // block_rows)), num_cpus=0,
                         label_selector=here)  # fmt: skip
        return dataset, {r.id for r in todo}
    rows = [{"id": r.id, "line": r.line, "data": json.dumps(r.data, ensure_ascii=False)} for r in todo]
    return ray.data.from_items(rows, override_num_blocks=max(1, -(-len(rows) // block_rows))), None


def score_ray(
    model: str,
    in_path: Path,
    out_path: Path,
    *,
    readout: ReadoutConfig = ReadoutConfig(),
    dtr: DTRConfig = DTRConfig(),
    tcb: TCBConfig | None = TCBConfig(),
    tokens: bool = False,
    batch_size: int = 1,
    resume: bool = False,
    overwrite: bool = False,
    skip_bad: bool = False,
    float16: bool = False,
    workers: int = 1,
    cpus: float = 1.0,
    gpus: float = 0.0,
    address: str | None = None,
    block_rows: int = 16,
    load_kwargs: dict[str, Any] | None = None,
    on_start: Callable[[int, int], None] = lambda total, done: None,
    on_records: Callable[[int], None] = lambda n: None,
) -> tuple[list[Any], int | None]:
    """Score ``in_path`` on Ray into the Parquet store ``out_path``; returns (records skipped, layer count).

    ``workers`` actors, each with ``cpus`` CPUs (its torch threads) and ``gpus`` GPUs; ``block_rows`` records per
    block, and so per shard at most. The numbers equal ``score_file``'s for the same records and settings.
    """
    from depthlens.studies.parquet_store import ShardWriter
    from depthlens.studies.records import BadLine
    from depthlens.studies.score import MANIFEST_DEFAULTS, refuse_same_file, score_manifest
    from depthlens.studies.stores import read_inputs, results_format

    if workers < 1 or cpus <= 0 or gpus < 0 or block_rows < 1:
        raise InputError(
            f"--workers {workers}, --cpus {cpus:g}, --gpus {gpus:g}: need 1+ workers, CPUs > 0, GPUs ≥ 0"
        )
    refuse_same_file(in_path, out_path)
    if results_format(out_path) == "jsonl":
        raise InputError(
            f"--out {out_path}: scoring on Ray writes a sharded Parquet store; give a directory name"
        )
    records, skipped = read_inputs(in_path, skip_bad=skip_bad)
    store = {"format": "parquet", "float16": float16}
    manifest = score_manifest(model, None, in_path, readout, dtr, tcb, tokens, store)
    hashes = {r.id: r.digest for r in records}
    writer = ShardWriter(out_path, manifest, resume, overwrite, MANIFEST_DEFAULTS, hashes)
    todo = [r for r in records if r.id not in writer.done]
    on_start(len(records), len(records) - len(todo))
    if not todo:
        return skipped, writer.manifest.get("n_layers")
    ray = import_ray()
    connect(address, num_cpus=max(2, int(workers * cpus + 0.999)))
    from ray.data import ActorPoolStrategy, DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.actor_init_retry_on_errors = False  # a model that does not load stops the run with its error
    context.max_errored_blocks = 0
    # Ray Data's V2 Parquet reader lists files in a task that asks for a CPU whatever the read's num_cpus; with
    # the actors holding every CPU (2 workers on a 2-CPU Ray) that task never starts and the run hangs. The V1
    # reader honours num_cpus=0, as read_text does.
    context.use_datasource_v2 = False
    settings = {"readout": readout, "dtr": dtr, "tcb": tcb, "tokens": tokens, "batch_size": batch_size,
                "skip_bad": skip_bad, "float16": float16}  # fmt: skip
    kwargs = {"device": "cuda" if gpus > 0 else "cpu", **(load_kwargs or {})}
    dataset, pending = _input_dataset(ray, in_path, records, todo, skipped, block_rows)
    scored = dataset.map_batches(
        _Scorer, fn_constructor_args=(model, kwargs, settings, max(1, int(cpus)), pending),
        batch_size=block_rows, batch_format="pyarrow", compute=ActorPoolStrategy(size=workers),
        num_cpus=cpus, num_gpus=gpus, runtime_env=actor_env(cpus),
        max_restarts=RESTARTS, max_task_retries=RESTARTS,
    )  # fmt: skip
    n_layers = writer.manifest.get("n_layers")
    try:
        for block in scored.iter_batches(batch_size=None, batch_format="pyarrow"):
            names = block.column_names
            if "skipped" in names:
                for row in block.select(["id", "skipped"]).to_pylist():
                    if row["skipped"] is not None:
                        skipped.append(
                            BadLine(next(r.line for r in todo if r.id == row["id"]), row["skipped"])
                        )
                block = block.filter(block.column("skipped").is_null()).drop_columns(["skipped"])
            if "n_layers" in block.column_names:
                if block.num_rows:
                    n_layers = int(block.column("n_layers")[0].as_py())
                block = block.drop_columns(["n_layers"])
            writer.write_table(block, n_layers)
            on_records(block.num_rows)
    except DepthlensError:
        raise
    except Exception as exc:  # a Ray task or actor error: report the worker's own line, keep the shards
        raise ClusterError(
            f"a Ray worker failed: {worker_error(exc)} — shards finished so far are kept in {out_path}; "
            "fix the cause and rerun with --resume"
        ) from None
    return skipped, n_layers
