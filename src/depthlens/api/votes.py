"""``depthlens.think_at_n``: Think@n and its peers over a pool — ``generate``'s table, a DataFrame made from it, or a
sample store's path — voted as ``depthlens thinkn --from`` votes it, nothing written. Its table is the summary
CSV's rows, then the study's primary contrast — Think@n against random@n, its control — as one more row, and it
carries the notes ``thinkn`` prints under its table (``depthlens.notes(table)``; ``df.attrs["notes"]``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from depthlens.api.keywords import this_call, verb
from depthlens.api.progress import Display, Progress
from depthlens.api.tables import Table, carrying, table_manifest
from depthlens.config import DeepRule, DTRConfig, TieBreak, VotingConfig
from depthlens.studies import resolve


@verb
def think_at_n(
    pool: Table | str | Path,
    *,
    methods: Sequence[str] | None = None,
    n: int | None = None,
    lens: str | None = None,
    progress: Progress = True,
    eta: float = 0.5,
    prefix: int | None = 50,
    trials: int = 10,
    seed: int = 0,
    deepconf_window: int = 2048,
    tie_break: TieBreak = "uniform",
    g: float | None = None,
    rho: float | None = None,
    deep_rule: DeepRule | None = None,
    settle: str | None = None,
) -> Table:
    """Think@n and its peers over ``pool`` (``generate``'s table, a DataFrame of it, or a sample store's path), as
    ``thinkn --from`` votes it: one row per method, the summary CSV's columns, then Think@n − random@n (its
    control). ``n`` None: 16, or the smallest usable pool where that is smaller; the DTR settings None: the
    pool's own; ``lens``: the one the pool was read through (another is refused). Its notes: ``depthlens.notes``."""
    voting_given, dtr_given = this_call().settings(VotingConfig, DTRConfig)
    manifest, records, where = _pool(pool)
    resolve.check_stored_readout(manifest, where, lens=lens)
    dtr = resolve.stored_dtr(manifest, dtr_given, "the pool")
    usable = Counter(str(r["question_id"]) for _, r in records if r.get("status") != "failed")
    chosen, lowered = resolve.voting_n(n, min(usable.values(), default=None))
    voting = VotingConfig(n=chosen, **voting_given)
    return _vote(manifest, records, where, voting, dtr, methods, progress, (lowered, usable))


def _pool(pool: Any) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]], str]:
    """The pool's manifest, its records as (where, record), and how errors name it."""
    from depthlens.studies.pool_table import store_records

    if isinstance(pool, (str, Path)):
        from depthlens.stores.samples import read_manifest, read_responses

        return read_manifest(Path(pool)), list(read_responses(Path(pool))), str(pool)
    if hasattr(pool, "columns") and hasattr(pool, "iloc"):  # a DataFrame (depthlens.to_pandas's, filtered …)
        from depthlens.stores.arrow import from_pandas

        pool = from_pandas(pool)
    manifest = table_manifest(pool)
    return manifest, list(store_records(pool.to_pylist())), "the pool table"


def _vote(
    manifest: dict[str, Any],
    records: list[tuple[str, dict[str, Any]]],
    where: str,
    voting: VotingConfig,
    dtr: DTRConfig,
    methods: Sequence[str] | None,
    progress: Progress,
    sizes: tuple[bool, Counter[str]],
) -> Table:
    from depthlens.studies import thinkn

    pools, info = thinkn.pools_from_records(manifest, records, dtr, voting.n)
    line = (
        f"depthlens.think_at_n: {len(pools)} questions' pools, {voting.trials} trials of n = {voting.n} each, "
        f"{len(methods) if methods is not None else 'all'} methods (no model runs: the pool's stored readout)"
    )
    with Display(progress, line) as display:
        trials = display.bar("trials", voting.trials, "trials")
        report = thinkn.vote_pools(pools, info, voting, dtr, methods, where=where, on_trial=trials.advance)
    rows = thinkn.summary_rows(report)
    control = thinkn.control_row(report.control)
    said = notes_of(report, sizes, control is not None)
    if progress is not False:
        display.say("\n".join(said))
    about = {"voting": voting.to_dict(), "dtr": dtr.to_dict(), "notes": said}
    return carrying([*rows, *([control] if control else [])], about)


def notes_of(report: Any, sizes: tuple[bool, Counter[str]], with_control: bool) -> list[str]:
    """What ``thinkn`` says under its table, as a vote's table carries it: how the answers were read, what was
    left out, why a spread is 0, what the last row is."""
    from depthlens.evals.answers import RULES
    from depthlens.studies.thinkn import vote_notes

    lowered, usable = sizes
    voting, info = report.voting, report.info
    said = [info.answers.line()]
    if info.answers.rules != RULES:
        said.append(
            f"these answers were read by older rules ({info.answers.rules}); `depthlens regrade STORE` re-reads "
            f"them under {RULES}"
        )
    if lowered:
        said.append(
            f"n = {voting.n}: the pool holds {voting.n} usable responses per question at most, fewer than the "
            f"default {VotingConfig.n}; n= chooses another"
        )
    said += vote_notes(report.summaries, voting)
    if info.excluded:
        said.append(
            f"{len(info.excluded)} question(s) left out (fewer than n usable responses): "
            + ", ".join(info.excluded[:10])
        )
    if voting.trials > 1 and usable and set(usable.values()) == {voting.n}:
        said.append(
            f"pool = n = {voting.n}: every trial draws each question's whole pool, so accuracy_std and cost_std "
            f"are 0.0 (the trials cannot differ); a pool larger than n gives draws a spread"
        )
    said.append(
        "accuracy_std, cost_std: the spread of re-draws from one pool over the trials, not an error bar; "
        "accuracy_lo / accuracy_hi: the 95 % interval over questions; diff … p: the paired test against vs"
    )
    if not with_control and any(s.method == "think@n" for s in report.summaries):
        said.append(
            "think@n was voted without random@n, its control (a vote over a random η·n of the same draw): add "
            "'random@n' to methods for the study's primary contrast"
        )
    if with_control:
        said.append(
            "the last row is the study's primary contrast: think@n against random@n, its control (the same "
            "questions; diff, its interval and p over questions)"
        )
    return said
