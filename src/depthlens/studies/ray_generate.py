"""Generation on Ray: a store's questions spread over actors that each run a generation backend (hf or vllm).

Each actor (``_Sampler``) loads the model once and samples whole questions with the same code as
``thinkn.generate_store`` (``_generate_question``: per-response seeds, the same batches per question), so a
response does not depend on which actor sampled it or on how many there were. Every block of questions an actor
finishes becomes one shard of the store's ``samples/`` Parquet store, committed by the driver (no shared file
system is needed between machines); ``thinkn --from``, ``correlate`` and ``report`` read the shards as one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from depthlens.config import AnswerConfig, DTRConfig, EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.errors import ClusterError, DepthlensError, InputError, StoreError
from depthlens.studies.ray_score import RESTARTS, actor_env, import_ray, worker_error
from depthlens.studies.tasks import Question
from depthlens.studies.thinkn import GenerationReport


class _Collect:
    """What ``_generate_question`` writes to, inside an actor: the records of one call."""

    def __init__(self, done: set[str]) -> None:
        self.done = done
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def flush(self) -> None:
        """Nothing to commit here: the driver commits the call's records as one shard."""


class _Sampler:
    """One Ray actor: the model and its generation backend (a vLLM engine too, with ``--backend vllm``), built
    once; each call samples a block of questions."""

    def __init__(
        self, model: str, load_kwargs: dict[str, Any], questions: list[Question], settings: dict[str, Any]
    ) -> None:
        import torch

        from depthlens.models.load import load
        from depthlens.sampling.generate import make_backend

        torch.set_num_threads(settings["threads"])
        self.lm = load(model, **load_kwargs)
        self.generator = make_backend(self.lm, settings["engine"], settings["sampling"], settings["readout"])
        self.questions = {q.id: q for q in questions}
        self.settings = settings

    def __call__(self, batch: Any) -> Any:
        from depthlens.studies.parquet_store import to_table
        from depthlens.studies.thinkn import _generate_question

        s = self.settings
        records: list[dict[str, Any]] = []
        for row in batch.to_pylist():
            sink = _Collect(set(row["done"]))
            _generate_question(
                self.lm, self.generator, sink, self.questions[row["question_id"]], s["pool"], s["seed"], s["dtr"],
                s["answers"], s["batch_size"], GenerationReport(), lambda n: None,
            )  # fmt: skip
            records.extend(sink.records)
        for r in records:
            r["n_layers"] = self.lm.n_layers  # for the driver's manifest, dropped before writing
        return to_table(records, float16=s["float16"])


def generate_store_ray(
    model: str,
    out_dir: Path,
    questions: Sequence[Question],
    *,
    pool: int,
    seed: int = 0,
    sampling: SamplingConfig = SamplingConfig(),
    readout: ReadoutConfig = ReadoutConfig(),
    dtr: DTRConfig = DTRConfig(),
    batch_size: int = 16,
    resume: bool = False,
    overwrite: bool = False,
    task: dict[str, Any] | None = None,
    answers: AnswerConfig = AnswerConfig(),
    engine: EngineConfig = EngineConfig(),
    float16: bool = False,
    workers: int = 1,
    cpus: float = 1.0,
    gpus: float = 0.0,
    address: str | None = None,
    block_questions: int = 1,
    load_kwargs: dict[str, Any] | None = None,
    on_start: Callable[[int, int], None] = lambda total, done: None,
    on_batch: Callable[[int], None] = lambda n: None,
) -> GenerationReport:
    """As ``thinkn.generate_store``, on ``workers`` Ray actors, into ``out_dir/samples/`` (Parquet shards)."""
    from depthlens.studies.parquet_store import ShardWriter
    from depthlens.studies.ray_score import connect
    from depthlens.studies.thinkn import (
        MANIFEST_DEFAULTS,
        RESUME_EXTEND,
        RESUME_FREE,
        SAMPLES,
        SHARDS,
        remove_other_format,
        samples_entry,
        store_manifest,
        write_questions,
    )

    if pool < 1 or batch_size < 1 or workers < 1 or block_questions < 1:
        raise InputError(
            f"--pool {pool}, --batch-size {batch_size}, --workers {workers}: each must be 1 or more"
        )
    if (out_dir / SAMPLES).exists() and not overwrite:
        raise StoreError(
            f"{out_dir} holds a {SAMPLES} store, which --ray cannot continue; give a new --out, or resume it "
            "without --ray"
        )
    if overwrite:
        remove_other_format(out_dir, "parquet")
    manifest = store_manifest(
        model, None, questions, pool, seed, batch_size, sampling, readout, dtr, task or {}, answers, engine,
        **samples_entry("parquet", float16),
    )  # fmt: skip
    writer = ShardWriter(out_dir / SHARDS, manifest, resume, overwrite, MANIFEST_DEFAULTS, None,
                         free=RESUME_FREE, extend=RESUME_EXTEND)  # fmt: skip
    write_questions(out_dir, questions)
    report = GenerationReport(changed=writer.changed)
    rows = []
    for q in questions:
        done = [f"{q.id}#{i}" for i in range(pool) if f"{q.id}#{i}" in writer.done]
        report.skipped += len(done)
        if len(done) < pool:
            rows.append({"question_id": q.id, "done": done})
    on_start(len(questions) * pool, report.skipped)
    if not rows:
        return report
    ray = import_ray()
    connect(address, num_cpus=max(2, int(workers * cpus + 0.999)))
    from ray.data import ActorPoolStrategy, DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.actor_init_retry_on_errors = False
    settings = {"sampling": sampling, "readout": readout, "dtr": dtr, "answers": answers, "engine": engine,
                "pool": pool, "seed": seed, "batch_size": batch_size, "threads": max(1, int(cpus)),
                "float16": float16}  # fmt: skip
    kwargs = {"device": "cuda" if gpus > 0 else "cpu", **(load_kwargs or {})}
    dataset = ray.data.from_items(rows, override_num_blocks=max(1, -(-len(rows) // block_questions)))
    sampled = dataset.map_batches(
        _Sampler, fn_constructor_args=(model, kwargs, list(questions), settings), batch_size=block_questions,
        batch_format="pyarrow", compute=ActorPoolStrategy(size=workers), num_cpus=cpus, num_gpus=gpus,
        runtime_env=actor_env(cpus),
        max_restarts=RESTARTS, max_task_retries=RESTARTS,
    )  # fmt: skip
    n_layers = writer.manifest.get("n_layers")
    try:
        for block in sampled.iter_batches(batch_size=None, batch_format="pyarrow"):
            if block.num_rows:
                n_layers = int(block.column("n_layers")[0].as_py())
            block = block.drop_columns(["n_layers"])
            writer.write_table(block, n_layers)
            for record in block.select([c for c in ("status", "grade", "answer_source", "finish", "n_tokens")
                                        if c in block.column_names]).to_pylist():  # fmt: skip
                report.count(record)
            on_batch(block.num_rows)
    except DepthlensError:
        raise
    except Exception as exc:  # a Ray task or actor error: the worker's own line; finished shards are kept
        raise ClusterError(
            f"a Ray worker failed: {worker_error(exc)} — shards finished so far are kept in {out_dir}; "
            "fix the cause and rerun with --resume"
        ) from None
    return report
