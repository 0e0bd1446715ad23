"""``depthlens thinkn``: Think@n vs Cons@n and the other voting methods — sampling a pool first (``--out``, as
``depthlens generate``), or re-voting a stored one (``--from``); ``--online`` runs or replays online Think@n."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from depthlens.cli import online_cmd as oc
from depthlens.cli import options as opt
from depthlens.cli import specs
from depthlens.cli.app import app, console, err_console
from depthlens.cli.generate_cmd import resumed_manifest, run_generation
from depthlens.config import (
    AnswerConfig,
    DTRConfig,
    EngineConfig,
    GenerateRun,
    ModelSpec,
    OnlineConfig,
    OnlineRun,
    RayConfig,
    ReadoutConfig,
    SamplingConfig,
    StoreSpec,
    TaskSpec,
    VotingConfig,
)
from depthlens.errors import InputError
from depthlens.models.catalogue import DEFAULT_MODEL

if TYPE_CHECKING:
    from depthlens.studies.thinkn import ThinkReport


def dtr_for(store: Path | None, g: float | None, rho: float | None, deep_rule: str | None) -> DTRConfig:
    """The DTR settings of a vote: the store's own (a new store: the defaults), each overridden where given."""
    from depthlens.stores.samples import read_manifest

    base = DTRConfig.from_dict(read_manifest(store)["dtr"]) if store is not None else DTRConfig()
    return DTRConfig(
        base.g if g is None else g,
        base.rho if rho is None else rho,
        base.deep_rule if deep_rule is None else deep_rule,
    )  # type: ignore[arg-type]


def vote(
    store: Path,
    voting: VotingConfig,
    dtr: DTRConfig,
    methods: list[str] | None,
    ablation: bool,
    overwrite: bool,
    every: bool = False,
) -> None:
    """Vote over the store's pools, print the table (DeepConf folded unless ``every``) and where the summary
    went."""
    from depthlens.studies.thinkn import summarise, summary_stem

    with err_console.status("voting"):
        report = summarise(store, voting, dtr, methods, with_ablation=ablation, overwrite=overwrite)
    print_report(report, store, every)
    if report.voting.trials > 1 and report.info.manifest["pool"] == voting.n:
        err_console.print(
            "note: pool = n, so every trial draws the same responses (draw s.d. 0); use --pool > n"
        )
    stem = store / summary_stem(report.voting)
    err_console.print(f"summary: {stem}.json, {stem}.csv")


def print_report(report: ThinkReport, store: Path | None = None, every: bool = False) -> None:
    """The table ``thinkn`` prints: accuracy, tokens per question, cost against Cons@n, per method — the paper's
    methods first, DeepConf's variants one line per filter (their range over the trace scores) unless ``every``."""
    from depthlens.cli.paired_view import folded, span

    info = report.info
    v = report.voting
    prefix = "full" if v.prefix is None else v.prefix
    table = Table(
        title=f"{info.manifest['model']} · {(info.manifest.get('task') or {}).get('name', '?')} · n={v.n} "
        f"η={v.eta} ℓ={prefix} · {v.trials} trials × {info.questions - len(info.excluded)} questions",
        title_justify="left",
    )
    table.add_column("method", no_wrap=True)  # never cut: the names are what --methods takes
    # ± is the draw s.d.: the spread of re-draws from one pool, not an error bar (the paired table has those)
    for column in ("accuracy % ± draw s.d.", "tokens/q ± draw s.d.", "vs Cons@n", "paper cost"):
        table.add_column(column, justify="right")
    cons = next((s for s in report.summaries if s.method == "cons@n"), None)
    plain, groups = folded(report.summaries, lambda s: s.method)
    if every:
        plain, groups = plain + [s for rows in groups.values() for s in rows], {}
    for s in plain:
        ratio = f"{s.cost_mean / cons.cost_mean:.0%}" if cons and cons.cost_mean else "—"
        table.add_row(
            s.method,
            f"{100 * s.accuracy_mean:.1f} ± {100 * s.accuracy_std:.1f}",
            f"{s.cost_mean:,.0f} ± {s.cost_std:,.0f}",
            ratio,
            f"{s.cost_paper_mean:,.0f}",
        )
    for group, rows in groups.items():
        ratios = [s.cost_mean / cons.cost_mean for s in rows] if cons and cons.cost_mean else []
        table.add_row(
            f"{group}-*@n ({len(rows)})",
            span([100 * s.accuracy_mean for s in rows], ".1f"),
            span([s.cost_mean for s in rows], ",.0f"),
            span([100 * r for r in ratios], ".0f") + "%" if ratios else "—",
            span([s.cost_paper_mean for s in rows], ",.0f"),
        )
    console.print(table)
    if groups:
        err_console.print(
            f"DeepConf: {sum(len(r) for r in groups.values())} variants folded into {len(groups)} lines (the range "
            "over their trace scores); --methods all shows each, as the summary CSV holds them",
            highlight=False,
        )
    if report.paired:
        from depthlens.cli.paired_view import paired_table, verdict_line

        paired = folded(report.paired, lambda c: c.method)[0] if groups else report.paired
        console.print(paired_table(paired, report.control))
        for line in (verdict_line(report.paired), verdict_line([report.control] if report.control else [])):
            if line is not None:
                err_console.print(line, highlight=False)
    _print_notes(report, store)
    if report.ablation:
        _print_ablation(report.ablation)


def _print_notes(report: ThinkReport, store: Path | None) -> None:
    """How the answers were read, and what was left out of the vote."""
    from depthlens.evals.answers import RULES

    info = report.info
    err_console.print(info.answers.line(), highlight=False)
    if info.answers.rules != RULES:
        err_console.print(
            f"[yellow]these answers were read by older rules ({info.answers.rules}); `depthlens regrade "
            f"{store or 'STORE'}` re-reads them under {RULES}[/]"
        )
    from depthlens.studies.thinkn import vote_notes

    for line in vote_notes(report.summaries, report.voting):
        err_console.print(line, highlight=False)
    if info.excluded:
        err_console.print(
            f"[yellow]{len(info.excluded)} question(s) left out (fewer than n usable responses):[/] "
            + ", ".join(info.excluded[:10])
        )
    if info.failed:
        err_console.print(
            f"[yellow]{len(info.failed)} response(s) failed to generate[/] (status 'failed' in the store)"
        )


def _print_ablation(rows: list[dict[str, Any]]) -> None:
    if rows:
        ab = Table(title="Think@n ablation (same pool)", title_justify="left")
        ab.add_column("method", no_wrap=True)
        for column in ("ℓ_prefix", "η", "accuracy % ± draw s.d.", "cost vs Cons@n"):
            ab.add_column(column, justify="right")
        for row in rows:
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
    out: opt.OptionalOutDir = None,
    from_store: opt.FromStore = None,
    task: opt.Task = TaskSpec.name,
    model: opt.Model = DEFAULT_MODEL,
    data: opt.Data = None,
    questions: opt.Questions = TaskSpec.questions,
    task_seed: opt.TaskSeed = TaskSpec.task_seed,
    task_config: opt.TaskConfig = TaskSpec.task_config,
    n: opt.ThinknN = None,
    pool: opt.ThinknPool = None,
    eta: opt.Eta = VotingConfig.eta,
    prefix: opt.PrefixOpt = str(VotingConfig.prefix),
    trials: opt.Trials = VotingConfig.trials,
    methods: opt.Methods = None,
    ablation: opt.Ablation = False,
    seed: opt.Seed = VotingConfig.seed,
    temperature: opt.Temperature = SamplingConfig.temperature,
    top_p: opt.TopP = SamplingConfig.top_p,
    top_k: opt.TopKSampling = SamplingConfig.top_k,
    min_p: opt.MinP = SamplingConfig.min_p,
    max_new_tokens: opt.MaxNew = SamplingConfig.max_new_tokens,
    readout_tokens: opt.ThinknReadoutTokens = None,
    batch_size: opt.ThinknBatch = None,
    online: opt.Online = False,
    signal: opt.SignalOpt = OnlineConfig.signal,
    warmup: opt.Warmup = OnlineConfig.warmup,
    max_n: opt.MaxN = OnlineConfig.max_n,
    consensus: opt.Consensus = OnlineConfig.consensus,
    deepconf_window: opt.DeepconfWindow = VotingConfig.deepconf_window,
    tie_break: opt.TieBreakOpt = VotingConfig.tie_break,
    sweep: opt.Sweep = False,
    g: opt.StoreG = None,
    rho: opt.StoreRho = None,
    deep_rule: opt.StoreDeepRule = None,
    divergence: opt.StoreDivergence = None,
    lens: opt.StoreLens = None,
    prompt_style: opt.PromptStyleOpt = AnswerConfig.prompt_style,
    answer_type: opt.AnswerTypeOpt = AnswerConfig.answer_type,
    answer_fallback: opt.AnswerFallbackOpt = AnswerConfig.fallback,
    device: opt.Device = ModelSpec.device,
    dtype: opt.DType = ModelSpec.dtype,
    trust_remote_code: opt.TrustRemoteCode = ModelSpec.trust_remote_code,
    blocks: opt.Blocks = None,
    final_norm_path: opt.FinalNormPath = None,
    unembed: opt.Unembed = None,
    resume: opt.Resume = StoreSpec.resume,
    overwrite: opt.Overwrite = StoreSpec.overwrite,
    backend: opt.BackendOpt = "auto",
    tensor_parallel_size: opt.TensorParallel = EngineConfig.tensor_parallel_size,
    gpu_memory_utilization: opt.GpuMemory = EngineConfig.gpu_memory_utilization,
    max_model_len: opt.MaxModelLen = EngineConfig.max_model_len,
    enforce_eager: opt.EnforceEager = EngineConfig.enforce_eager,
    kv_cache_gib: opt.KvCacheGib = EngineConfig.kv_cache_gib,
    float32_lens: opt.Float32Lens = EngineConfig.float32_lens,
    threads: opt.Threads = EngineConfig.threads,
    store_format: opt.StoreFormatOpt = StoreSpec.format,
    verify: opt.Verify = False,
    float16: opt.Float16 = StoreSpec.float16,
    ray: opt.RayOpt = False,
    ray_address: opt.RayAddress = RayConfig.address,
    workers: opt.Workers = RayConfig.workers,
    cpus: opt.Cpus = RayConfig.cpus,
    gpus: opt.Gpus = RayConfig.gpus,
) -> None:
    """Think@n vs Cons@n, Mean@n, Long/Short@n, Self-Certainty@n and DeepConf: accuracy and exact cost.

    Generates a pool per question into --out (or reads --from), then votes over --trials draws of n.
    The methods are defined in docs/definitions.md §5.
    """
    options = dict(locals())  # the model's and the engine's, read by name (specs.model_and_engine)
    if (out is None) == (from_store is None):
        raise InputError("give --out DIR to generate and vote, or --from DIR to re-vote an existing store")
    store = StoreSpec(from_store or out, resume, overwrite, store_format, float16)  # type: ignore[arg-type]
    task_spec = specs.task_spec(task, questions, task_seed, task_config, data)
    new_lens = lens or ReadoutConfig.lens

    def sampled(window: int | None, per_question: int, at_once: int) -> Sampled:  # built only where one is
        window = specs.readout_tokens(readout_tokens, window)
        sampling = SamplingConfig(temperature, top_p, max_new_tokens, window, top_k=top_k, min_p=min_p)
        job = specs.job_size(questions, per_question, at_once, sampling)  # what auto picks the backend for
        chosen = specs.engine_backend(backend, model, resumed_manifest(store), job)
        model_spec, engine = specs.model_and_engine(options, chosen)
        return Sampled(
            model_spec,
            specs.answer_config(prompt_style, answer_type, answer_fallback, task),
            sampling,
            engine,
            specs.readout_config(divergence or ReadoutConfig.divergence, lens=new_lens),
        )

    from depthlens.stores.parquet import verifying
    from depthlens.stores.samples import picking

    with (
        picking(store_format if from_store is not None else None),
        verifying(verify),
    ):  # --store picks one of two stores to read
        if from_store is not None:
            honoured(from_store, divergence, lens)
        n = n if n is not None else default_n(from_store)
        if online or sweep:
            if ray or ray_address is not None:
                raise InputError("--ray samples a pool for offline voting; run --online without --ray")
            if (store_format is not None and from_store is None) or float16:
                raise InputError(
                    "--store and --float16 set the format of an offline pool; an online store is JSONL"
                )
            if not online:
                raise InputError("--sweep replays the online policy: pass it with --online --from DIR")
            policy = oc.online_config(
                signal,
                warmup,
                max_n,
                consensus,
                eta,
                specs.prefix(prefix),
                deepconf_window,
                batch_size or OnlineConfig.batch_size,
            )
            live = lambda: sampled(policy.prefix, policy.max_n, policy.batch_size)  # noqa: E731
            _online(
                store,
                policy,
                dtr_for(from_store, g, rho, deep_rule),
                oc.Replay(trials, seed, sweep, n),
                live,
                task_spec,
                from_store is not None,
            )
            return
        voting = VotingConfig(n, eta, specs.prefix(prefix), trials, seed, deepconf_window, tie_break)  # type: ignore[arg-type]
        from depthlens.cli.paired_view import method_list

        chosen = method_list(methods)
        if out is not None:
            size = pool if pool is not None else 2 * n
            if size < n:  # every question would be left out of the vote: knowable before sampling
                raise InputError(
                    f"--n {n}: more than --pool {size} responses per question; use --pool {n} or more"
                )
            at_once = batch_size or GenerateRun.batch_size
            new = sampled(None if ablation else voting.prefix, size, at_once)
            run = GenerateRun(
                store,
                size,
                seed,
                at_once,
                new.sampling,
                new.readout,
                dtr_for(None, g, rho, deep_rule),
                new.answers,
                new.engine,
                task_spec,
            )
            run_generation(new.model, run, specs.ray_config(ray, ray_address, workers, cpus, gpus))
        every = methods is not None  # a list, or `all`: each method on its own line
        vote(store.out, voting, dtr_for(store.out, g, rho, deep_rule), chosen, ablation, overwrite, every)


def default_n(store: Path | None) -> int:
    """n when ``--n`` is not given: ``VotingConfig.n``, or a stored pool's size where that is smaller (said)."""
    if store is None:
        return VotingConfig.n
    from depthlens.stores.samples import read_manifest

    pool = int(read_manifest(store)["pool"])
    if pool >= VotingConfig.n:
        return VotingConfig.n
    err_console.print(
        f"n = {pool}: the pool in {store} holds {pool} responses per question, fewer than the default "
        f"{VotingConfig.n}; --n chooses another",
        highlight=False,
    )
    return pool


def honoured(store: Path, divergence: str | None, lens: str | None = None) -> None:
    """An option a stored pool cannot honour is an error naming what the store holds: Think@n votes on the
    divergence the store was generated with, read through the lens it was generated with."""
    from depthlens.readout.tuned import same_lens
    from depthlens.stores.samples import kinds_line, read_manifest, stored_kinds

    manifest = read_manifest(store)
    stored_lens = (manifest.get("readout") or {}).get("lens", ReadoutConfig.lens)
    if lens is not None and not same_lens(lens, stored_lens):
        raise InputError(
            f"--lens {lens}: {store} was read out through --lens {stored_lens}, and Think@n votes on what it "
            f"holds; leave out --lens, or generate a store with --lens {lens}"
        )
    if divergence is not None and divergence != stored_kinds(manifest)[0]:
        raise InputError(
            f"--divergence {divergence}: {store} holds {kinds_line(manifest)} divergences and votes on "
            f"{stored_kinds(manifest)[0]}; leave out --divergence, or generate a store with --divergence {divergence}"
        )


@dataclasses.dataclass(frozen=True)
class Sampled:
    """How a new pool is sampled: the model, the answer rules, sampling, the engine, the readout."""

    model: ModelSpec
    answers: AnswerConfig
    sampling: SamplingConfig
    engine: EngineConfig
    readout: ReadoutConfig


def _online(
    store: StoreSpec,
    policy: OnlineConfig,
    dtr: DTRConfig,
    replay: oc.Replay,
    sampled: Callable[[], Sampled],
    task: TaskSpec,
    stored: bool,
) -> None:
    """``thinkn --online``: replay the policy over a stored pool (``stored``: ``--from``), or run it live."""
    if stored:
        oc.run_replay(policy, store.out, dtr, replay)
        return
    if replay.sweep:
        raise InputError("--sweep replays a stored pool: pass it with --online --from DIR")
    new = sampled()
    run = OnlineRun(store, policy, replay.seed, new.sampling, new.readout, dtr, new.answers, new.engine, task)
    oc.run_live(new.model, run)
