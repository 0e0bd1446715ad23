"""``depthlens generate``: sample a pool per question into a resumable store, every token's layers read out (also
the sampling half of ``depthlens thinkn --out``, through the same ``cli.runs``)."""

from __future__ import annotations

from depthlens.cli import groups, runs, specs
from depthlens.cli import options as opt
from depthlens.cli.app import app
from depthlens.config import DTRConfig, GenerateRun, ReadoutConfig, SamplingConfig
from depthlens.studies import resolve
from depthlens.studies.runs import generate_run


@app.command("generate", short_help="Sample responses, read out, into a resumable store.")
@groups.grouped
def generate(
    *,
    out: opt.OutDir,
    task: groups.Task,
    model: groups.Model,
    pool: opt.Pool = GenerateRun.POOL,
    seed: opt.Seed = GenerateRun.seed,
    sampling: groups.Sampling,
    readout_tokens: opt.ReadoutTokens = str(SamplingConfig.readout_tokens),
    batch_size: opt.GenBatch = GenerateRun.batch_size,
    g: opt.G = DTRConfig.g,
    rho: opt.Rho = DTRConfig.rho,
    deep_rule: opt.DeepRuleOpt = DTRConfig.deep_rule,
    settle: opt.SettleOpt = DTRConfig.settle,
    divergence: opt.DivergenceOpt = ReadoutConfig.divergence,
    also_divergences: opt.AlsoDivergences = "",
    lens: opt.LensOpt = str(ReadoutConfig.lens),
    compile_kernel: opt.CompileOpt = ReadoutConfig.compile,
    layers: groups.Layers,
    answers: groups.Answers,
    arch: groups.Arch,
    store: groups.Store,
    backend: opt.BackendOpt = "auto",
    vllm: groups.Vllm,
    ray: groups.Ray,
) -> None:
    """Sample responses per question into a resumable store, with each token's layer readout.

    The store feeds `depthlens thinkn --from` and `depthlens correlate` (docs/definitions.md §4–5).
    """
    task_spec = task.spec()  # first: the task's own errors before torch loads
    # the lens resolved (its stamp read, its digest taken) before any load
    readout = resolve.readout(divergence, also_divergences, lens, compile=compile_kernel, **layers.fields())
    answer_rules = answers.config()
    window = specs.readout_tokens(readout_tokens, SamplingConfig.readout_tokens)
    sampled = sampling.config(window)
    spec = store.spec(out)
    job = specs.job_size(task.questions, pool, batch_size, sampled)  # what auto picks the backend for
    chosen = specs.engine_backend(backend, model.model, runs.resumed_manifest(spec), job)
    built = generate_run(
        store=spec,
        task=task_spec,
        pool=pool,
        seed=seed,
        batch_size=batch_size,
        sampling=sampled,
        readout=readout,
        dtr={"g": g, "rho": rho, "deep_rule": deep_rule, "settle": settle},
        answers=answer_rules,
        engine=vllm.engine(chosen, model),
    )
    runs.run_generation(model.spec(arch), built, ray.config())
