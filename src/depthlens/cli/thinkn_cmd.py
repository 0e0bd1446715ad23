"""``depthlens generate``, ``depthlens thinkn`` and ``depthlens tasks``: Think@n from sampling to the table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from depthlens.cli import online_cmd as oc
from depthlens.cli import options as opt
from depthlens.cli.app import (
    actor_load_kwargs,
    app,
    console,
    engine_config,
    err_console,
    load_model,
    warn,
    writes_to,
)
from depthlens.cli.progress import make_progress
from depthlens.config import AnswerConfig, EngineConfig, OnlineConfig, SamplingConfig, VotingConfig
from depthlens.errors import InputError

if TYPE_CHECKING:
    from depthlens.studies.thinkn import GenerationReport, ThinkReport

_A = AnswerConfig()


def answer_config(
    prompt_style: str, answer_type: str | None, fallback: str, task: str | None
) -> AnswerConfig:
    """The answer settings of --prompt-style, --answer-type and --answer-fallback (checked)."""
    from typing import get_args

    from depthlens.config import AnswerType, Fallback, PromptStyle

    for option, value, literal in (
        ("--prompt-style", prompt_style, PromptStyle),
        ("--answer-type", answer_type, AnswerType),
        ("--answer-fallback", fallback, Fallback),
    ):
        if value is not None and value not in get_args(literal):
            raise InputError(f"{option} {value!r}: use one of {', '.join(get_args(literal))}")
    rules = AnswerConfig(prompt_style, answer_type, fallback)  # type: ignore[arg-type]
    if task is not None and rules.prompt_style == "native" and not task.startswith("reasoning_gym:"):
        raise InputError(
            f"--prompt-style native asks in reasoning-gym's own format, so it needs a reasoning_gym task, "
            f"not {task!r}; use --prompt-style paper"
        )
    return rules


D = opt.DEFAULTS
_S = SamplingConfig()
_V = VotingConfig()
_O = OnlineConfig()

Task = Annotated[
    str,
    typer.Option(
        "--task",
        help="reasoning_gym:<dataset>, aime2024, aime2025, hmmt_feb2025, gpqa_diamond, or a .jsonl file.",
    ),
]
Data = Annotated[
    Path | None,
    typer.Option("--data", dir_okay=False, help="Local JSONL for a hub task (same columns), offline."),
]
Questions = Annotated[int | None, typer.Option("--questions", min=1, help="How many questions (default 50).")]
TaskSeed = Annotated[int, typer.Option("--task-seed", help="Seed of generated tasks (reasoning-gym).")]
TaskConfig = Annotated[
    str | None,
    typer.Option("--task-config", help="reasoning-gym generator settings, e.g. 'max_terms=3,max_digits=2'."),
]
Pool = Annotated[
    int | None, typer.Option("--pool", min=1, help="Responses sampled per question (default 2·n for thinkn).")
]
Seed = Annotated[int, typer.Option("--seed", help="Seeds every response's sampler and the trials' draws.")]
Temperature = Annotated[
    float,
    typer.Option("--temperature", callback=opt.finite, help="Sampling temperature; 0 = greedy."),
]
TopP = Annotated[float, typer.Option("--top-p", callback=opt.finite, help="Nucleus mass, in (0, 1].")]
MaxNew = Annotated[int, typer.Option("--max-new-tokens", min=1, help="Most tokens generated per response.")]
ReadoutTokens = Annotated[
    str | None,
    typer.Option(
        "--readout-tokens",
        help="Leading generated tokens read out at every layer in the generation pass: N or 'all' "
        "(default: the prefix; 'all' with --ablation).",
    ),
]
GenBatch = Annotated[int, typer.Option("--batch-size", min=1, help="Responses sampled together.")]
OutDir = Annotated[Path, typer.Option("--out", file_okay=False, help="Store directory (created).")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue an interrupted store.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing store.")]
N = Annotated[int, typer.Option("--n", min=1, help="Responses drawn per question per trial.")]
Eta = Annotated[
    float,
    typer.Option("--eta", callback=opt.finite, help="Share of n kept by the selecting methods, in (0, 1]."),
]
PrefixOpt = Annotated[str, typer.Option("--prefix", help="ℓ_prefix in tokens, or 'full'.")]
Trials = Annotated[int, typer.Option("--trials", min=1, help="Resamplings of n from each pool.")]
Methods = Annotated[str | None, typer.Option("--methods", help="Comma-separated subset (default: all).")]
Ablation = Annotated[
    bool, typer.Option("--ablation", help="Also Think@n over ℓ_prefix ∈ {50,100,500,full} × η.")
]
FromStore = Annotated[
    Path | None, typer.Option("--from", file_okay=False, help="Re-summarise this store; generate nothing.")
]


def ray_settings(
    ray: bool, address: str | None, workers: int, cpus: float, gpus: float
) -> dict[str, Any] | None:
    """``generate_store_ray``'s Ray arguments, or None to generate in this process (--ray-address implies --ray)."""
    if not ray and address is None:
        return None
    return {"workers": workers, "cpus": cpus, "gpus": gpus, "address": address}


def _readout_tokens(value: str | None, default: int | None) -> int | None:
    if value is None:
        return default
    if value == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--readout-tokens {value!r}: give a number of tokens or 'all'") from None


def _prefix(value: str) -> int | None:
    if value == "full":
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--prefix {value!r}: give a number of tokens or 'full'") from None


def _generate(
    *,
    model: str,
    task: str,
    data: Path | None,
    questions: int | None,
    task_seed: int,
    task_config: str | None,
    pool: int,
    seed: int,
    sampling: SamplingConfig,
    batch_size: int,
    out: Path,
    resume: bool,
    overwrite: bool,
    g: float,
    rho: float,
    deep_rule: str,
    divergence: str,
    device: str,
    dtype: str,
    trust_remote_code: bool,
    blocks: str | None = None,
    final_norm_path: str | None = None,
    unembed: str | None = None,
    answers: AnswerConfig = _A,
    engine: EngineConfig = EngineConfig(),
    also_divergences: str = "",
    ray: dict[str, Any] | None = None,
    store: str | None = None,
    float16: bool = False,
) -> GenerationReport:
    from depthlens.config import DTRConfig, ReadoutConfig, degenerate_settings
    from depthlens.models.locate import locate
    from depthlens.studies.stores import check_results
    from depthlens.studies.thinkn import samples_entry, samples_format, samples_path

    also = tuple(k.strip() for k in also_divergences.split(",") if k.strip())
    readout = ReadoutConfig(divergence=divergence, also=also)  # type: ignore[arg-type]
    dtr = DTRConfig(g=g, rho=rho, deep_rule=deep_rule)  # type: ignore[arg-type]
    # Everything that needs no model is checked before one loads: --out, the model's name, the task, --resume.
    fmt = samples_format(out, store, resume, overwrite)  # type: ignore[arg-type]
    entry = samples_entry(fmt, float16)
    if ray is not None:
        from depthlens.studies.ray_score import import_ray

        if fmt == "jsonl":
            raise InputError(f"--ray writes a sharded Parquet store and {out} is a JSONL one; resume it without "
                             "--ray, or leave out --store jsonl")  # fmt: skip
        import_ray()  # the missing extra is named before anything else happens
    samples = samples_path(out, fmt)
    resuming = check_results(samples, None, resume, overwrite, fmt=fmt)
    locate(model)
    from depthlens.studies.tasks import load_task, parse_task_config
    from depthlens.studies.thinkn import MANIFEST_DEFAULTS, RESUME_EXTEND, RESUME_FREE, store_manifest

    qs = load_task(task, questions, task_seed, data, parse_task_config(task_config))
    task_info = oc.task_info(task, questions, task_seed, task_config, data)
    if resuming:  # are the settings the stored run's?
        manifest = store_manifest(model, None, qs, pool, seed, batch_size, sampling, readout, dtr, task_info,
                                  answers, engine, **entry)  # fmt: skip
        check_results(
            samples, manifest, resume, overwrite, MANIFEST_DEFAULTS, RESUME_FREE, RESUME_EXTEND, fmt
        )
    for line in degenerate_settings(readout, dtr):
        warn(line)
    args = (model, device, dtype, trust_remote_code, blocks, final_norm_path, unembed, out, qs, pool, seed,
            sampling, readout, dtr, batch_size, resume, overwrite, task_info, answers, engine, float16)  # fmt: skip
    report = _generate_here(*args, fmt) if ray is None else _generate_on_ray(*args, ray=ray)
    _say_generated(report, answers, out)
    return report


def _generate_here(
    model: str, device: str, dtype: str, trust_remote_code: bool, blocks: str | None, final_norm_path: str | None,
    unembed: str | None, out: Path, qs: list[Any], pool: int, seed: int, sampling: SamplingConfig, readout: Any,
    dtr: Any, batch_size: int, resume: bool, overwrite: bool, task_info: dict[str, Any], answers: AnswerConfig,
    engine: EngineConfig, float16: bool, fmt: Any,
) -> GenerationReport:  # fmt: skip
    """Generation in this process (the model loaded here), with a progress display."""
    from depthlens.studies.thinkn import generate_store, samples_path

    lm = load_model(model, device, dtype, trust_remote_code, blocks, final_norm_path, unembed)
    with make_progress(err_console) as progress:
        responses = progress.add_task("responses", total=None)
        tokens = progress.add_task("tokens", total=None)

        def on_start(total: int, done: int) -> None:
            writes_to(samples_path(out, fmt))
            progress.update(responses, total=total, completed=done)

        report = generate_store(
            lm,
            out,
            qs,
            pool=pool,
            seed=seed,
            sampling=sampling,
            readout=readout,
            dtr=dtr,
            batch_size=batch_size,
            resume=resume,
            overwrite=overwrite,
            task=task_info,
            answers=answers,
            engine=engine,
            store=fmt,
            float16=float16,
            on_start=on_start,
            on_batch=lambda n: progress.advance(responses, n),
            on_token=lambda n: progress.advance(tokens, n),
        )
    return report


def _generate_on_ray(
    model: str, device: str, dtype: str, trust_remote_code: bool, blocks: str | None, final_norm_path: str | None,
    unembed: str | None, out: Path, qs: list[Any], pool: int, seed: int, sampling: SamplingConfig, readout: Any,
    dtr: Any, batch_size: int, resume: bool, overwrite: bool, task_info: dict[str, Any], answers: AnswerConfig,
    engine: EngineConfig, float16: bool, ray: dict[str, Any],
) -> GenerationReport:  # fmt: skip
    """Generation on Ray actors (``ray``: workers, cpus, gpus, address) into the sharded store out/samples/."""
    from depthlens.studies.ray_generate import generate_store_ray
    from depthlens.studies.thinkn import SHARDS

    load_kwargs = actor_load_kwargs(device, dtype, trust_remote_code, blocks, final_norm_path, unembed)
    with make_progress(err_console) as progress:
        responses = progress.add_task("responses on Ray", total=None)

        def on_start(total: int, done: int) -> None:
            writes_to(out / SHARDS)
            progress.update(responses, total=total, completed=done)

        return generate_store_ray(
            model, out, qs, pool=pool, seed=seed, sampling=sampling, readout=readout, dtr=dtr,
            batch_size=batch_size, resume=resume, overwrite=overwrite, task=task_info, answers=answers,
            engine=engine, float16=float16, load_kwargs=load_kwargs, on_start=on_start,
            on_batch=lambda n: progress.advance(responses, n), **ray,
        )  # fmt: skip


def _say_generated(report: GenerationReport, answers: AnswerConfig, out: Path) -> None:
    """What a generation run wrote, on stderr."""
    for line in report.changed:
        err_console.print(f"resumed with a changed setting: {line}", highlight=False, soft_wrap=True)
    grades = ", ".join(f"{k} {v}" for k, v in sorted(report.grades.items()))
    sources = ", ".join(f"{k} {v}" for k, v in sorted(report.sources.items()))
    err_console.print(
        f"wrote {report.written} responses ({report.tokens} tokens; {grades or 'none graded'}) to {out}"
        + (f", {report.skipped} already there" if report.skipped else "")
        + (f", [red]{report.failed} failed[/] (kept as status 'failed')" if report.failed else "")
    )
    if report.written:
        err_console.print(
            f"answers by source: {sources}; {report.truncated} of {report.written} cut at --max-new-tokens "
            f"({answers.prompt_style} prompts, fallback {answers.fallback})"
        )
    if report.grades.get("unparsed"):
        err_console.print(
            f"{report.grades['unparsed']} answers Math-Verify could not parse were counted wrong"
        )


@app.command("generate", short_help="Sample responses, read out, into a resumable store.")
def generate(
    out: OutDir,
    task: Task = "reasoning_gym:basic_arithmetic",
    model: opt.Model = D["model"],
    data: Data = None,
    questions: Questions = None,
    task_seed: TaskSeed = 0,
    task_config: TaskConfig = None,
    pool: Annotated[int, typer.Option("--pool", min=1, help="Responses sampled per question.")] = 8,
    seed: Seed = 0,
    temperature: Temperature = _S.temperature,
    top_p: TopP = _S.top_p,
    max_new_tokens: MaxNew = _S.max_new_tokens,
    readout_tokens: ReadoutTokens = None,
    batch_size: GenBatch = 16,
    g: opt.G = D["g"],
    rho: opt.Rho = D["rho"],
    deep_rule: opt.DeepRuleOpt = D["deep_rule"],
    divergence: opt.DivergenceOpt = D["divergence"],
    also_divergences: opt.AlsoDivergences = "",
    prompt_style: opt.PromptStyleOpt = _A.prompt_style,
    answer_type: opt.AnswerTypeOpt = None,
    answer_fallback: opt.AnswerFallbackOpt = _A.fallback,
    device: opt.Device = "auto",
    dtype: opt.DType = "auto",
    trust_remote_code: opt.TrustRemoteCode = False,
    blocks: opt.Blocks = None,
    final_norm_path: opt.FinalNormPath = None,
    unembed: opt.Unembed = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
    backend: opt.BackendOpt = "auto",
    tensor_parallel_size: opt.TensorParallel = 1,
    gpu_memory_utilization: opt.GpuMemory = None,
    max_model_len: opt.MaxModelLen = None,
    enforce_eager: opt.EnforceEager = False,
    kv_cache_gib: opt.KvCacheGib = None,
    store_format: opt.StoreFormatOpt = None,
    float16: opt.Float16 = False,
    ray: opt.RayOpt = False,
    ray_address: opt.RayAddress = None,
    workers: opt.Workers = 1,
    cpus: opt.Cpus = 1.0,
    gpus: opt.Gpus = 0.0,
) -> None:
    """Sample responses per question into a resumable store, with each token's layer readout.

    The store feeds `depthlens thinkn --from` and `depthlens correlate` (docs/definitions.md §4–5).
    """
    answers = answer_config(prompt_style, answer_type, answer_fallback, task)
    sampling = SamplingConfig(
        temperature, top_p, max_new_tokens, _readout_tokens(readout_tokens, _S.readout_tokens)
    )
    _generate(
        model=model,
        task=task,
        data=data,
        questions=questions,
        task_seed=task_seed,
        task_config=task_config,
        pool=pool,
        seed=seed,
        sampling=sampling,
        batch_size=batch_size,
        out=out,
        resume=resume,
        overwrite=overwrite,
        g=g,
        rho=rho,
        deep_rule=deep_rule,
        divergence=divergence,
        device=device,
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        blocks=blocks,
        final_norm_path=final_norm_path,
        unembed=unembed,
        answers=answers,
        engine=engine_config(
            model,
            backend,
            dtype,
            tensor_parallel_size,
            gpu_memory_utilization,
            max_model_len,
            enforce_eager,
            kv_cache_gib,
            resumes=_samples_manifest(out) if resume else None,
        ),
        also_divergences=also_divergences,
        ray=ray_settings(ray, ray_address, workers, cpus, gpus),
        store=store_format,
        float16=float16,
    )


def _samples_manifest(out: Path) -> Path:
    """The manifest of the sample store in ``out`` (whose recorded backend a resumed ``--backend auto`` keeps)."""
    from depthlens.studies.thinkn import samples_manifest

    return samples_manifest(out)


def print_report(report: ThinkReport, store: Path | None = None) -> None:
    from depthlens.cli.paired_view import paired_table, power_line
    from depthlens.voting.answers import RULES

    info = report.info
    v = report.voting
    prefix = "full" if v.prefix is None else v.prefix
    table = Table(
        title=f"{info.manifest['model']} · {(info.manifest.get('task') or {}).get('name', '?')} · n={v.n} "
        f"η={v.eta} ℓ={prefix} · {v.trials} trials × {info.questions - len(info.excluded)} questions",
        title_justify="left",
    )
    table.add_column("method", no_wrap=True)  # never cut: the names are what --methods takes
    for column in ("accuracy %", "tokens/q", "vs Cons@n", "paper cost"):
        table.add_column(column, justify="right")
    cons = next((s for s in report.summaries if s.method == "cons@n"), None)
    for s in report.summaries:
        ratio = f"{s.cost_mean / cons.cost_mean:.0%}" if cons and cons.cost_mean else "—"
        table.add_row(
            s.method,
            f"{100 * s.accuracy_mean:.1f} ± {100 * s.accuracy_std:.1f}",
            f"{s.cost_mean:,.0f} ± {s.cost_std:,.0f}",
            ratio,
            f"{s.cost_paper_mean:,.0f}",
        )
    console.print(table)
    if report.paired:
        console.print(paired_table(report.paired))
        if (line := power_line(report.paired)) is not None:
            err_console.print(line, highlight=False)
    err_console.print(info.answers.line(), highlight=False)
    if info.answers.rules != RULES:
        err_console.print(
            f"[yellow]these answers were read by older rules ({info.answers.rules}); `depthlens regrade "
            f"{store or 'STORE'}` re-reads them under {RULES}[/]"
        )
    unanswered = {s.method: s.no_answer for s in report.summaries if s.no_answer}
    if unanswered:
        err_console.print(
            "votes with no answer (wrong), questions per trial: "
            + ", ".join(f"{m} {v:g}" for m, v in unanswered.items()),
            highlight=False,
        )
    if info.excluded:
        err_console.print(
            f"[yellow]{len(info.excluded)} question(s) left out (fewer than n usable responses):[/] "
            + ", ".join(info.excluded[:10])
        )
    if info.failed:
        err_console.print(
            f"[yellow]{len(info.failed)} response(s) failed to generate[/] (status 'failed' in the store)"
        )
    if report.ablation:
        ab = Table(title="Think@n ablation (same pool)", title_justify="left")
        ab.add_column("method", no_wrap=True)
        for column in ("ℓ_prefix", "η", "accuracy %", "cost vs Cons@n"):
            ab.add_column(column, justify="right")
        for row in report.ablation:
            ratio = row["cost_vs_cons"]
            ab.add_row(
                row["method"],
                str(row["prefix"]),
                f"{row['eta']:g}",
                f"{100 * row['accuracy_mean']:.1f} ± {100 * row['accuracy_std']:.1f}",
                f"{ratio:.0%}" if ratio is not None else "—",
            )
        console.print(ab)


@app.command("thinkn", short_help="Think@n vs Cons@n and the other voting methods.")
def thinkn(
    out: Annotated[
        Path | None, typer.Option("--out", file_okay=False, help="Store directory (created).")
    ] = None,
    from_store: FromStore = None,
    task: Task = "reasoning_gym:basic_arithmetic",
    model: opt.Model = D["model"],
    data: Data = None,
    questions: Questions = None,
    task_seed: TaskSeed = 0,
    task_config: TaskConfig = None,
    n: N = _V.n,
    pool: Pool = None,
    eta: Eta = _V.eta,
    prefix: PrefixOpt = str(_V.prefix),
    trials: Trials = _V.trials,
    methods: Methods = None,
    ablation: Ablation = False,
    seed: Seed = 0,
    temperature: Temperature = _S.temperature,
    top_p: TopP = _S.top_p,
    max_new_tokens: MaxNew = _S.max_new_tokens,
    readout_tokens: ReadoutTokens = None,
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", min=1, help="Responses sampled together (default 16; online: 4)."),
    ] = None,
    online: oc.Online = False,
    signal: oc.SignalOpt = _O.signal,
    warmup: oc.Warmup = _O.warmup,
    max_n: oc.MaxN = _O.max_n,
    consensus: oc.Consensus = _O.consensus,
    deepconf_window: oc.DeepconfWindow = _V.deepconf_window,
    sweep: oc.Sweep = False,
    g: Annotated[
        float | None,
        typer.Option("--g", callback=opt.finite, help="Settling threshold (default: the store's)."),
    ] = None,
    rho: Annotated[
        float | None,
        typer.Option("--rho", callback=opt.finite, help="Deep-regime fraction (default: the store's)."),
    ] = None,
    deep_rule: Annotated[str | None, typer.Option("--deep-rule", help="spec or paper-literal.")] = None,
    divergence: opt.DivergenceOpt = D["divergence"],
    prompt_style: opt.PromptStyleOpt = _A.prompt_style,
    answer_type: opt.AnswerTypeOpt = None,
    answer_fallback: opt.AnswerFallbackOpt = _A.fallback,
    device: opt.Device = "auto",
    dtype: opt.DType = "auto",
    trust_remote_code: opt.TrustRemoteCode = False,
    blocks: opt.Blocks = None,
    final_norm_path: opt.FinalNormPath = None,
    unembed: opt.Unembed = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
    backend: opt.BackendOpt = "auto",
    tensor_parallel_size: opt.TensorParallel = 1,
    gpu_memory_utilization: opt.GpuMemory = None,
    max_model_len: opt.MaxModelLen = None,
    enforce_eager: opt.EnforceEager = False,
    kv_cache_gib: opt.KvCacheGib = None,
    store_format: opt.StoreFormatOpt = None,
    float16: opt.Float16 = False,
    ray: opt.RayOpt = False,
    ray_address: opt.RayAddress = None,
    workers: opt.Workers = 1,
    cpus: opt.Cpus = 1.0,
    gpus: opt.Gpus = 0.0,
) -> None:
    """Think@n vs Cons@n, Mean@n, Long/Short@n, Self-Certainty@n and DeepConf: accuracy and exact cost.

    Generates a pool per question into --out (or reads --from), then votes over --trials draws of n.
    The methods are defined in docs/definitions.md §5.
    """
    from depthlens.config import DTRConfig
    from depthlens.studies.thinkn import read_manifest, summarise, summary_stem

    if (out is None) == (from_store is None):
        raise InputError("give --out DIR to generate and vote, or --from DIR to re-vote an existing store")
    store = from_store or out
    assert store is not None
    if online or sweep:
        if ray or ray_address is not None:
            raise InputError("--ray samples a pool for offline voting; run --online without --ray")
        if store_format is not None or float16:
            raise InputError(
                "--store and --float16 set the format of an offline pool; an online store is JSONL"
            )
        _online(**locals())
        return
    voting = VotingConfig(n=n, eta=eta, prefix=_prefix(prefix), trials=trials, seed=seed,
                          deepconf_window=deepconf_window)  # fmt: skip
    method_list = [m.strip() for m in methods.split(",")] if methods else None
    if method_list is not None:
        from depthlens.voting.methods import METHODS

        unknown = [m for m in method_list if m not in METHODS]
        if unknown:
            raise InputError(
                f"--methods {methods}: unknown {', '.join(unknown)}; known: {', '.join(METHODS)}"
            )
    batch_size = batch_size or 16
    if out is not None:
        window = None if ablation else voting.prefix
        sampling = SamplingConfig(temperature, top_p, max_new_tokens, _readout_tokens(readout_tokens, window))
        pool_size = pool if pool is not None else 2 * n
        _generate(
            model=model,
            task=task,
            data=data,
            questions=questions,
            task_seed=task_seed,
            task_config=task_config,
            pool=pool_size,
            seed=seed,
            sampling=sampling,
            batch_size=batch_size,
            out=out,
            resume=resume,
            overwrite=overwrite,
            g=g if g is not None else DTRConfig().g,
            rho=rho if rho is not None else DTRConfig().rho,
            deep_rule=deep_rule or DTRConfig().deep_rule,
            divergence=divergence,
            device=device,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            blocks=blocks,
            final_norm_path=final_norm_path,
            unembed=unembed,
            answers=answer_config(prompt_style, answer_type, answer_fallback, task),
            engine=engine_config(
                model,
                backend,
                dtype,
                tensor_parallel_size,
                gpu_memory_utilization,
                max_model_len,
                enforce_eager,
                kv_cache_gib,
                resumes=_samples_manifest(out) if resume else None,
            ),
            ray=ray_settings(ray, ray_address, workers, cpus, gpus),
            store=store_format,
            float16=float16,
        )
    stored = DTRConfig.from_dict(read_manifest(store)["dtr"])
    dtr = DTRConfig(
        g=stored.g if g is None else g,
        rho=stored.rho if rho is None else rho,
        deep_rule=stored.deep_rule if deep_rule is None else deep_rule,  # type: ignore[arg-type]
    )
    with err_console.status("voting"):
        report = summarise(store, voting, dtr, method_list, with_ablation=ablation, overwrite=overwrite)
    print_report(report, store)
    if report.voting.trials > 1 and report.info.manifest["pool"] == n:
        err_console.print("note: pool = n, so every trial draws the same responses (std 0); use --pool > n")
    stem = store / summary_stem(report.voting)
    err_console.print(f"summary: {stem}.json, {stem}.csv")


def _online(**given: Any) -> None:
    """``thinkn --online``: validate every setting, then run live (--out) or replay (--from)."""
    from depthlens.config import DTRConfig

    if not given["online"]:
        raise InputError("--sweep replays the online policy: pass it with --online --from DIR")
    policy = oc.online_config(
        given["signal"], given["warmup"], given["max_n"], given["consensus"], given["eta"],
        _prefix(given["prefix"]), given["deepconf_window"], given["batch_size"] or OnlineConfig().batch_size,
    )  # fmt: skip
    store = given["from_store"]
    if given["sweep"] and store is None:
        raise InputError("--sweep replays a stored pool: pass it with --online --from DIR")
    from depthlens.studies.thinkn import read_manifest

    base = DTRConfig.from_dict(read_manifest(store)["dtr"]) if store is not None else DTRConfig()
    dtr = DTRConfig(
        base.g if given["g"] is None else given["g"], base.rho if given["rho"] is None else given["rho"],
        given["deep_rule"] or base.deep_rule,  # type: ignore[arg-type]
    )  # fmt: skip
    if store is not None:
        oc.run_replay(online=policy, store=store, dtr=dtr, trials=given["trials"], seed=given["seed"],
                      sweep=given["sweep"], n=given["n"])  # fmt: skip
        return
    sampling = SamplingConfig(
        given["temperature"], given["top_p"], given["max_new_tokens"],
        _readout_tokens(given["readout_tokens"], policy.prefix),
    )  # fmt: skip
    oc.run_live(
        online=policy, out=given["out"], model=given["model"], task=given["task"], data=given["data"],
        questions=given["questions"], task_seed=given["task_seed"], task_config=given["task_config"],
        seed=given["seed"], sampling=sampling, dtr=dtr, divergence=given["divergence"], device=given["device"],
        dtype=given["dtype"], trust_remote_code=given["trust_remote_code"], resume=given["resume"],
        overwrite=given["overwrite"],
        answers=answer_config(given["prompt_style"], given["answer_type"], given["answer_fallback"], given["task"]),
        engine=engine_config(given["model"], given["backend"], given["dtype"], given["tensor_parallel_size"],
                             given["gpu_memory_utilization"], given["max_model_len"], given["enforce_eager"],
                             given["kv_cache_gib"],
                             resumes=_samples_manifest(given["out"]) if given["resume"] else None),
    )  # fmt: skip


@app.command("tasks")
def tasks() -> None:
    """List the task names --task accepts."""
    from depthlens.studies.tasks import ANSWER_TYPES, HUB_TASKS, reasoning_gym_names

    console.print("[bold]hub benchmarks[/] (need the hub, or --data FILE.jsonl): " + ", ".join(HUB_TASKS))
    console.print("[bold]reasoning-gym[/] (offline, generated; use reasoning_gym:<name>):")
    console.print(", ".join(reasoning_gym_names()), soft_wrap=True)
    console.print(
        "[bold]answer types[/] (others inferred from the reference answers; --answer-type overrides):"
    )
    by_type: dict[str, list[str]] = {}
    for family, kind in ANSWER_TYPES.items():
        by_type.setdefault(kind, []).append(family)
    for kind, families in by_type.items():
        console.print(f"  {kind}: {', '.join(families)}", soft_wrap=True)
    console.print("[bold]local[/]: any .jsonl with question, answer and optional choices per line")
