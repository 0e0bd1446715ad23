"""``score --ray``: records spread over a pool of actors that each hold the model once, into a sharded Parquet store.

Ray Data feeds blocks of records to a callable class (``_Scorer``): its ``__init__`` loads the model once per actor,
each call scores one block with the same code as a single-process ``score`` and returns an Arrow table; the driver
(``scale.ray.run_on_actors``) commits each block as one shard.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from depthlens.config import ModelSpec, RayConfig, ScoreRun
from depthlens.errors import InputError, named
from depthlens.models.precision import planned_precision
from depthlens.scale.ray import (
    actor_load_kwargs,
    connect,
    import_ray,
    maybe_kill_self,
    note_actor_start,
    run_on_actors,
)
from depthlens.studies.score import ScoreEvents


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
        note_actor_start()
        import torch

        from depthlens.models.load import load

        torch.set_num_threads(threads)
        self.lm = load(model, **load_kwargs)
        self.settings = settings
        self.pending = pending  # rows read by Ray Data: only these ids are scored (the rest are done or bad)

    def _records(self, batch: Any) -> list[Any]:
        """The block's records: rows the driver sent (id, line, data), or rows Ray Data read from the input
        (a JSONL line as ``text``, or a Parquet row), kept where their id is pending."""
        from depthlens.stores.inputs import InputRecord

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
        from depthlens.stores.parquet import to_table
        from depthlens.studies.scoring import score_records

        maybe_kill_self()
        s = self.settings
        skipped: list[dict[str, Any]] = []
        records = [dataclasses.replace(r, line=i) for i, r in enumerate(self._records(batch), start=1)]
        by_line = {r.line: r.id for r in records}
        results = list(
            score_records(
                self.lm,
                records,
                readout=s["readout"],
                dtr=s["dtr"],
                tcb=s["tcb"],
                tokens=s["tokens"],
                batch_size=s["batch_size"],
                on_skip=(lambda bad: skipped.append({"id": by_line[bad.line], "skipped": bad.reason}))
                if s["skip_bad"]
                else None,
            )
        )
        for r in results:
            r["n_layers"] = self.lm.n_layers  # read by the driver for the manifest, dropped before writing
            r["vocab_rows"] = self.lm.vocab_rows  # so is the vocabulary
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
        from depthlens.stores.formats import input_shards

        shards = input_shards(in_path)
        reader = ray.data.read_text if shards is None else ray.data.read_parquet
        paths = str(in_path.resolve()) if shards is None else [str(p.resolve()) for p in shards]
        # Read on the driver's node (the input need not be on every node of a cluster), split there into blocks
        # of about ``block_rows`` lines for the actors. No CPU is reserved for it: the actors may hold them all.
        here = {"ray.io/node-id": ray.get_runtime_context().get_node_id()}
        dataset = reader(
            paths, override_num_blocks=max(1, -(-len(records) // block_rows)), num_cpus=0, label_selector=here
        )
        return dataset, {r.id for r in todo}
    rows = [{"id": r.id, "line": r.line, "data": json.dumps(r.data, ensure_ascii=False)} for r in todo]
    return ray.data.from_items(rows, override_num_blocks=max(1, -(-len(rows) // block_rows))), None


@dataclasses.dataclass(frozen=True)
class RayScoreReport:
    skipped: list[Any]  # input lines skipped (with ``skip_bad``), as ``BadLine``s
    n_layers: int | None  # the model's depth as the actors reported it (None: nothing was scored)
    rescored: list[str]  # records scored again because their input changed since (a resumed run)


def _check_per_layer(model: ModelSpec, run: ScoreRun) -> None:
    """The per-layer quantities a run keeps, checked against the model's tokenizer and config (no weights) as the
    single-process ``score`` checks them (``studies.layer_settings.readout_quantities``)."""
    readout = run.readout
    if not (readout.layer_target or readout.track or readout.layer_entropy):
        return
    from depthlens.models.info import load_info
    from depthlens.models.locate import locate
    from depthlens.studies.layer_settings import readout_quantities

    if (
        locate(model.name).kind == "gguf"
    ):  # its tokenizer comes with its weights: each actor checks it on load
        return
    readout_quantities(load_info(model.name, model.trust_remote_code), readout, None, run.tokens)


def score_on_ray(
    model: ModelSpec, run: ScoreRun, ray: RayConfig, events: ScoreEvents = ScoreEvents()
) -> RayScoreReport:
    """Score ``run`` on Ray actors into its Parquet store; the numbers equal ``run_score``'s for the same records
    and settings. ``ray.block`` records per block (default ``RayConfig.SCORE_BLOCK``), and so per shard at most."""
    from depthlens.stores.formats import read_inputs, results_format
    from depthlens.stores.guard import refuse_same_file
    from depthlens.stores.inputs import BadLine
    from depthlens.stores.shard_writer import ShardWriter
    from depthlens.studies.score import RESUME_RULES, note_skipped

    out_path, spec = run.store.out, run.store
    refuse_same_file(run.source, out_path)
    if results_format(out_path) == "jsonl":
        raise InputError(
            f"{named('out')} {out_path}: scoring on Ray writes a sharded Parquet store; give a directory name"
        )
    records, skipped = read_inputs(run.source, skip_bad=run.skip_bad)
    _check_per_layer(model, run)  # a tracked id past the vocabulary: refused before the store is written
    hashes = {r.id: r.digest for r in records}
    writer = ShardWriter(
        out_path, _ray_manifest(model, run, ray), spec.resume, spec.overwrite, RESUME_RULES, hashes
    )
    events.on_rescore(writer.rescored)
    todo = [r for r in records if r.id not in writer.done]
    events.on_start(len(records), len(records) - len(todo))
    if not todo:
        return RayScoreReport(skipped, writer.manifest.get("n_layers"), writer.rescored)
    ray_module = import_ray()
    connect(ray.address, num_cpus=max(2, int(ray.workers * ray.cpus + 0.999)))
    block = ray.block or RayConfig.SCORE_BLOCK
    ray = dataclasses.replace(ray, block=block)
    settings = {
        "readout": run.readout,
        "dtr": run.dtr,
        "tcb": run.tcb,
        "tokens": run.tokens,
        "batch_size": run.batch_size,
        "skip_bad": run.skip_bad,
        "float16": spec.float16,
    }
    dataset, pending = _input_dataset(ray_module, run.source, records, todo, skipped, block)
    line_of = {r.id: r.line for r in todo}

    def take(block: Any) -> Any:  # the skipped records' lines, then the scored rows to commit
        if "skipped" in block.column_names:
            for row in block.select(["id", "skipped"]).to_pylist():
                if row["skipped"] is not None:
                    skipped.append(BadLine(line_of[row["id"]], row["skipped"]))
            block = block.filter(block.column("skipped").is_null()).drop_columns(["skipped"])
        events.on_block(block.num_rows)
        return block

    args = (model.name, actor_load_kwargs(model, ray), settings, max(1, int(ray.cpus)), pending)
    n_layers = run_on_actors(dataset, _Scorer, args, ray, writer, take)
    note_skipped(writer, records, skipped)
    return RayScoreReport(skipped, n_layers, writer.rescored)


def _ray_manifest(model: ModelSpec, run: ScoreRun, ray: RayConfig) -> dict[str, Any]:
    """The manifest of ``run`` scored on Ray: ``score_manifest`` before any model is loaded (no layer count), with
    the precision the actors will compute in."""
    from depthlens.studies.score import score_manifest

    store = {"format": "parquet", "float16": run.store.float16}
    device = actor_load_kwargs(model, ray)["device"]
    return {
        **score_manifest(model.name, None, run, store),
        "precision": planned_precision(model.name, model.dtype, device, run.engine),
    }
