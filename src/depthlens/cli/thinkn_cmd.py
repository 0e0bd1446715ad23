"""``depthlens thinkn``: Think@n vs Cons@n and the other voting methods — sampling a pool first (``--out``, as
``depthlens generate``), or re-voting a stored one (``--from``); ``--online`` runs or replays online Think@n
(``cli.online_runs``). The table it prints is ``cli.thinkn_view``'s."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from depthlens.cli import groups, runs, specs
from depthlens.cli import online_runs as live
from depthlens.cli import options as opt
from depthlens.cli.app import app, err_console
from depthlens.cli.thinkn_view import vote
from depthlens.config import (
    GenerateRun,
    OnlineConfig,
    ReadoutConfig,
    StoreSpec,
    TaskSpec,
    VotingConfig,
)
from depthlens.errors import InputError
from depthlens.studies.runs import check_window, generate_run, online_run


@dataclasses.dataclass(frozen=True)
class Given:
    """What ``thinkn`` was given, by group: how a new pool is sampled, and the stored depth settings."""

    task: groups.Task
    model: groups.Model
    arch: groups.Arch
    sampling: groups.Sampling
    answers: groups.Answers
    vllm: groups.Vllm
    ray: groups.Ray
    stored: groups.Stored
    store: StoreSpec
    task_spec: TaskSpec  # built first: the task's own errors before torch loads
    backend: str
    readout_tokens: str | None
    batch_size: int | None

    def new_pool(self, window: int | None, per_question: int, at_once: int) -> runs.NewPool:
        """How a new pool is sampled, ``window`` tokens of each response read out unless --readout-tokens says."""
        sampling = self.sampling.config(specs.readout_tokens(self.readout_tokens, window))
        job = specs.job_size(self.task.questions, per_question, at_once, sampling)  # what auto picks for
        chosen = specs.engine_backend(self.backend, self.model.model, runs.resumed_manifest(self.store), job)
        readout = specs.readout_config(
            self.stored.divergence or ReadoutConfig.divergence, lens=self.stored.lens or ReadoutConfig.lens
        )
        answers = self.answers.config()
        return runs.NewPool(
            self.model.spec(self.arch), answers, sampling, self.vllm.engine(chosen, self.model), readout
        )


@app.command("thinkn", short_help="Think@n vs Cons@n and the other voting methods.")
@groups.grouped
def thinkn(
    *,
    out: opt.OptionalOutDir = None,
    from_store: opt.FromStore = None,
    task: groups.Task,
    model: groups.Model,
    vote_on: groups.Vote,
    sampling: groups.Sampling,
    readout_tokens: opt.ThinknReadoutTokens = None,
    batch_size: opt.ThinknBatch = None,
    policy: groups.Live,
    stored: groups.Stored,
    answers: groups.Answers,
    arch: groups.Arch,
    store: groups.Store,
    backend: opt.BackendOpt = "auto",
    vllm: groups.Vllm,
    verify: opt.Verify = False,
    ray: groups.Ray,
) -> None:
    """Think@n vs Cons@n, Mean@n, Long/Short@n, Self-Certainty@n and DeepConf: accuracy and exact cost.

    Generates a pool per question into --out (or reads --from), then votes over --trials draws of n.
    The methods are defined in docs/definitions.md §5.
    """
    target = from_store or out
    if target is None or (out is not None and from_store is not None):
        raise InputError("give --out DIR to generate and vote, or --from DIR to re-vote an existing store")
    spec = store.spec(target)
    task_spec = task.spec()  # first: the task's own errors before torch loads
    given = Given(
        task,
        model,
        arch,
        sampling,
        answers,
        vllm,
        ray,
        stored,
        spec,
        task_spec,
        backend,
        readout_tokens,
        batch_size,
    )
    from depthlens.stores.parquet import verifying
    from depthlens.stores.samples import picking

    # --store picks one of two stores to read
    with picking(store.store_format if from_store is not None else None), verifying(verify):
        if from_store is not None:
            honoured(from_store, stored.divergence, stored.lens)
        n = vote_on.n if vote_on.n is not None else default_n(from_store)
        if policy.online or policy.sweep:
            _online(given, policy, vote_on, n, from_store is not None)
        else:
            _offline(given, vote_on, n, out is not None)


def _offline(given: Given, vote_on: groups.Vote, n: int, sample: bool) -> None:
    """Think@n and its peers over the store's pools, sampling them first (``sample``: ``--out``)."""
    from depthlens.cli.paired_view import method_list

    voting = VotingConfig(
        n,
        vote_on.eta,
        specs.prefix(vote_on.prefix),
        vote_on.trials,
        vote_on.seed,
        vote_on.deepconf_window,
        vote_on.tie_break,  # type: ignore[arg-type]  # --tie-break's text: VotingConfig checks it
    )
    chosen = method_list(vote_on.methods)
    store = given.store
    if sample:
        size = vote_on.pool if vote_on.pool is not None else 2 * n
        if size < n:  # every question would be left out of the vote: knowable before sampling
            raise InputError(
                f"--n {n}: more than --pool {size} responses per question; use --pool {n} or more"
            )
        at_once = given.batch_size or GenerateRun.batch_size
        new = given.new_pool(None if vote_on.ablation else voting.rank_prefix, size, at_once)
        check_window(new.sampling, voting)  # before the task is read or anything sampled
        built = generate_run(
            store=store,
            task=given.task_spec,
            pool=size,
            seed=vote_on.seed,
            batch_size=at_once,
            dtr=given.stored.dtr(None),
            **new.run_settings(),
        )
        runs.run_generation(new.model, built, given.ray.config())
    every = vote_on.methods is not None  # a list, or `all`: each method on its own line
    vote(store.out, voting, given.stored.dtr(store.out), chosen, vote_on.ablation, store.overwrite, every)


def _online(given: Given, policy: groups.Live, vote_on: groups.Vote, n: int, stored: bool) -> None:
    """``thinkn --online``: replay the policy over a stored pool (``stored``: ``--from``), or run it live."""
    from depthlens.studies.resolve import online_policy

    if given.ray.on:
        raise InputError("--ray samples a pool for offline voting; run --online without --ray")
    if (given.store.format is not None and not stored) or given.store.float16:
        raise InputError("--store and --float16 set the format of an offline pool; an online store is JSONL")
    if not policy.online:
        raise InputError("--sweep replays the online policy: pass it with --online --from DIR")
    online: OnlineConfig = online_policy(
        specs.prefix(vote_on.prefix),
        signal=policy.signal,
        warmup=policy.warmup,
        max_n=policy.max_n,
        consensus=policy.consensus,
        keep=vote_on.eta,
        window=vote_on.deepconf_window,
        batch_size=given.batch_size or OnlineConfig.batch_size,
    )
    dtr = given.stored.dtr(given.store.out if stored else None)
    if stored:
        live.run_replay(
            online, given.store.out, dtr, live.Replay(vote_on.trials, vote_on.seed, policy.sweep, n)
        )
        return
    if policy.sweep:
        raise InputError("--sweep replays a stored pool: pass it with --online --from DIR")
    new = given.new_pool(online.decision_prefix, online.max_n, online.batch_size)
    built = online_run(
        store=given.store,
        task=given.task_spec,
        policy=online,
        seed=vote_on.seed,
        dtr=dtr,
        **new.run_settings(),
    )
    live.run_live(new.model, built)


def default_n(store: Path | None) -> int:
    """n when ``--n`` is not given (``studies.resolve.voting_n``: a stored pool's size where smaller, said)."""
    from depthlens.studies.resolve import voting_n

    pool = None
    if store is not None:
        from depthlens.stores.samples import read_manifest

        pool = int(read_manifest(store)["pool"])
    n, lowered = voting_n(None, pool)
    if lowered:
        err_console.print(
            f"n = {pool}: the pool in {store} holds {pool} responses per question, fewer than the default "
            f"{VotingConfig.n}; --n chooses another",
            highlight=False,
        )
    return n


def honoured(store: Path, divergence: str | None, lens: str | None = None) -> None:
    """An option a stored pool cannot honour is an error naming what the store holds
    (``studies.resolve.check_stored_readout``)."""
    from depthlens.stores.samples import read_manifest
    from depthlens.studies.resolve import check_stored_readout

    check_stored_readout(read_manifest(store), str(store), lens=lens, divergence=divergence)
