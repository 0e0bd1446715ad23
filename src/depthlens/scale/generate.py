"""``generate --ray``: a store's questions spread over actors that each run a generation backend (hf or vllm).

Each actor (``_Sampler``) loads the model once and samples whole questions with the same code as
``studies.generate`` (``generate_question``: per-response seeds, the same batches per question), so a response
does not depend on which actor sampled it or on how many there were. Every block of questions an actor finishes
becomes one shard of the store's ``samples/`` Parquet store, committed by the driver (``scale.ray.run_on_actors``;
no shared file system is needed between machines); ``thinkn --from``, ``correlate`` and ``report`` read the
shards as one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from depthlens.config import GenerateRun, ModelSpec, RayConfig
from depthlens.errors import StoreError, named
from depthlens.evals.tasks import Question
from depthlens.models.precision import planned_precision
from depthlens.scale.ray import actor_load_kwargs, connect, import_ray, note_actor_start, run_on_actors
from depthlens.stores.sample_writes import RESUME_RULES, remove_other_format, write_questions
from depthlens.stores.samples import SAMPLES, SHARDS
from depthlens.stores.shard_writer import ShardWriter
from depthlens.studies.generate import GenerationEvents, GenerationReport, run_manifest


class _Collect:
    """What ``generate_question`` writes to, inside an actor: the records of one call."""

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
        self,
        model: str,
        load_kwargs: dict[str, Any],
        questions: list[Question],
        run: GenerateRun,
        threads: int,
    ) -> None:
        note_actor_start()
        import torch

        from depthlens.models.info import load_info
        from depthlens.models.load import load
        from depthlens.sampling.choose import make_backend
        from depthlens.studies.generate import engine_job

        torch.set_num_threads(threads)
        if run.engine.backend == "vllm":  # the engine reads the layers out: tokenizer and config only
            self.lm: Any = load_info(model, load_kwargs.get("trust_remote_code", False))
        else:
            self.lm = load(model, **load_kwargs)
        job = engine_job(
            self.lm, questions, run.sampling.max_new_tokens, run.batch_size, run.answers.prompt_style
        )
        self.generator = make_backend(self.lm, run.engine, run.sampling, run.readout, job=job)
        torch.set_num_threads(run.engine.threads or threads)  # the actor's CPUs, over the sampler's choice
        self.questions = {q.id: q for q in questions}
        self.run = run

    def __call__(self, batch: Any) -> Any:
        from depthlens.stores.parquet import to_table
        from depthlens.studies.generate import QuestionJob, generate_question

        records: list[dict[str, Any]] = []
        for row in batch.to_pylist():
            sink = _Collect(set(row["done"]))
            job = QuestionJob(self.lm, self.generator, sink, self.questions[row["question_id"]], self.run)
            generate_question(job, GenerationReport(), lambda n: None)
            records.extend(sink.records)
        for r in records:
            r["n_layers"] = self.lm.n_layers  # for the driver's manifest, dropped before writing
            r["vocab_rows"] = self.lm.vocab_rows  # so is the vocabulary
        return to_table(records, float16=self.run.store.float16)


def generate_on_ray(
    model: ModelSpec,
    run: GenerateRun,
    questions: Sequence[Question],
    ray: RayConfig,
    events: GenerationEvents = GenerationEvents(),
) -> GenerationReport:
    """As ``studies.generate.generate``, on ``ray.workers`` Ray actors, into ``run.store.out/samples/`` (Parquet
    shards); ``ray.block`` questions per block (default 1)."""
    out_dir, spec = run.store.out, run.store
    if (out_dir / SAMPLES).exists() and not spec.overwrite:
        raise StoreError(
            f"{out_dir} holds a {SAMPLES} store, which {named('ray')} cannot continue; give a new {named('out')}, or "
            f"resume it "
            f"without {named('ray')}"
        )
    if spec.overwrite:
        remove_other_format(out_dir, "parquet")
    device = actor_load_kwargs(model, ray)["device"]
    manifest = {
        **run_manifest(model.name, None, questions, run, "parquet"),
        "precision": planned_precision(model.name, model.dtype, device, run.engine),
    }
    writer = ShardWriter(out_dir / SHARDS, manifest, spec.resume, spec.overwrite, RESUME_RULES)
    write_questions(out_dir, questions)
    report = GenerationReport(changed=writer.changed)
    rows = []
    for q in questions:
        done = [f"{q.id}#{i}" for i in range(run.pool) if f"{q.id}#{i}" in writer.done]
        report.skipped += len(done)
        if len(done) < run.pool:
            rows.append({"question_id": q.id, "done": done})
    events.on_start(len(questions) * run.pool, report.skipped)
    if not rows:
        return report
    ray_module = import_ray()
    connect(ray.address, num_cpus=max(2, int(ray.workers * ray.cpus + 0.999)))
    block = ray.block or RayConfig.GENERATE_BLOCK
    ray = dataclasses.replace(ray, block=block)
    dataset = ray_module.data.from_items(rows, override_num_blocks=max(1, -(-len(rows) // block)))

    def take(block: Any) -> Any:  # count what the block holds, then commit it whole
        counted = [
            c
            for c in ("status", "grade", "answer_source", "finish", "token_count")
            if c in block.column_names
        ]
        for record in block.select(counted).to_pylist():
            report.count(record)
        events.on_batch(block.num_rows)
        return block

    args = (model.name, actor_load_kwargs(model, ray), list(questions), run, max(1, int(ray.cpus)))
    run_on_actors(dataset, _Sampler, args, ray, writer, take)
    return report
