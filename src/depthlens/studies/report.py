"""The studies of a run's sample stores, computed for ``depthlens correlate`` and ``depthlens report``: Table-1 rows,
Figure-1 bin profiles and Figure-4 sweeps per store, the response a reader is shown (Figures 2–3), and each store's
Think@n summary (Table 2, Figure 5; voted now when none was written). ``viz.report`` draws and writes them up.

A *run directory* is a store or a folder of stores (found by their manifests, at any depth).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import PREFIX_TOKENS, CorrelationConfig, DTRConfig, VotingConfig
from depthlens.errors import DepthlensError, InputError
from depthlens.metrics.dtr import deep_flags, deep_thinking_ratio, settling_depth
from depthlens.models.tokens import token_texts
from depthlens.stats.fdr import add_fdr
from depthlens.stores.files import manifest_path, read_json
from depthlens.stores.layout import MANIFEST, is_store
from depthlens.stores.lock import writer
from depthlens.stores.samples import SAMPLES, SHARDS, samples_path, stored_format
from depthlens.stores.state import stale, store_state
from depthlens.studies.comparisons import PAIRED_P
from depthlens.studies.correlation import TABLE_ONE_P, store_correlations
from depthlens.studies.paired_tables import (
    REPLAYS,
    control_rows,
    pooled_control_rows,
    pooled_rows,
    store_per_question,
    table_two_rows,
)
from depthlens.studies.stored import Store, StoredResponse, load_store
from depthlens.studies.sweeps import sweep
from depthlens.studies.tables import table_one, write_csv
from depthlens.studies.thinkn import summarise, summary_files, summary_stem


def find_stores(run_dir: str | Path) -> list[Path]:
    """Every sample store at or under ``run_dir``, sorted; InputError naming what to do when there is none."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(
            f"{run_dir} is not a directory; give a store written by `depthlens generate` or a folder of them"
        )
    jsonl = {p.parent for p in run_dir.rglob(manifest_path(Path(SAMPLES)).name)}
    sharded = {p.parent for p in run_dir.rglob(SHARDS) if is_store(p)}
    found = sorted(jsonl | sharded)
    if not found:
        bare = sorted(p for p in run_dir.rglob(SHARDS) if p.is_dir() and any(p.glob("part-*.parquet")))
        if bare:  # shards whose manifest (the commit) is gone: a damaged store, not a missing one
            raise InputError(
                f"{bare[0]}: shards without their {MANIFEST} (the store's commit): the store is damaged; "
                "restore the manifest from a copy of the store"
            )
        raise InputError(
            f"no sample store under {run_dir} (looked for {SHARDS}/ and {SAMPLES}, each with its manifest); "
            "create one with `depthlens generate --readout-tokens all`"
        )
    return found


def slug(store: Store) -> str:
    """A file-name-safe name of a store's model and task."""
    return f"{store.model}-{store.task}".replace("/", "_").replace(" ", "_").replace(":", "_")


@dataclasses.dataclass
class StoreStudy:
    """What the report shows of one store: Table-1 rows, Figure-1 profiles, sweeps, the example response's
    heatmap record (None: no fully read-out response), the Think@n summary (None: a pool too small to vote)."""

    store: Store
    rows: list[dict[str, Any]]
    profiles: dict[str, list[dict[str, float]]]
    sweeps: list[dict[str, Any]]
    example: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    table_two: list[dict[str, Any]] = dataclasses.field(
        default_factory=list
    )  # methods + online replays, paired
    per_question: dict[str, Any] | None = None  # per method, accuracy per question: pooled per model
    control: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # Think@n − random@n, stored


def study_store(
    store: Store,
    cfg: CorrelationConfig,
    dtr: DTRConfig,
    g_by_kind: dict[str, float | None] | None = None,
    with_sweeps: bool = True,
) -> StoreStudy:
    """Table-1 rows, Figure-1 profiles and sweeps of one store. A store read out only over a prefix gives DTR over
    that prefix (said in each row's note)."""
    window = store.readout_tokens
    if window is not None and (dtr.dtr_prefix_tokens is None or dtr.dtr_prefix_tokens > window):
        dtr = dataclasses.replace(dtr, dtr_prefix_tokens=window)
    rows, profiles = store_correlations(store, cfg, dtr, g_by_kind)
    if window is not None:
        for row in rows:
            if row["metric"].startswith("dtr"):
                row["note"] = (
                    row["note"] + "; " if row["note"] else ""
                ) + f"DTR over the first {dtr.dtr_prefix_tokens} tokens"
    return StoreStudy(store, rows, profiles, sweep(store, cfg, dtr) if with_sweeps else [])


def write_correlation(
    out_dir: str | Path, studies: Sequence[StoreStudy], config: dict[str, Any], command: str
) -> list[Path]:
    """correlation.csv / .json / .md (Table 1 over all stores) and sweeps.csv."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [r for s in studies for r in s.rows]
    sweeps = [r for s in studies for r in s.sweeps]
    # Each table one family (studies/inference.py); in place, so whoever prints the studies' rows sees it.
    add_fdr(rows, TABLE_ONE_P)
    add_fdr(sweeps, TABLE_ONE_P)
    paths = [write_csv(out_dir / "correlation.csv", rows)]
    (out_dir / "correlation.json").write_text(
        json.dumps({"config": config, "command": command, "rows": rows}, indent=2) + "\n"
    )
    paths.append(out_dir / "correlation.json")
    (out_dir / "correlation.md").write_text(
        f"# Correlation with accuracy\n\n`{command}`\n\n{table_one(rows)}"
    )
    paths.append(out_dir / "correlation.md")
    if sweeps:
        paths.append(write_csv(out_dir / "sweeps.csv", sweeps))
    return paths


def example_response(store: Store) -> StoredResponse | None:
    """The response a reader is shown: a correct one of median length (else any of median length)."""
    full = [r for r in store.responses if r.divergence["jsd"].shape[0] == r.token_count and r.token_count > 0]
    pick = [r for r in full if r.correct] or full
    if not pick:
        return None
    lengths = np.array([r.token_count for r in pick])
    return pick[int(np.argsort(lengths)[len(pick) // 2])]


def heatmap_record(
    response: StoredResponse, tokens: Sequence[str], dtr: DTRConfig, n_layers: int, kind: str = "jsd"
) -> dict[str, Any]:
    """A stored response as the heatmap drawers take it (the fields ``depthlens score --tokens`` writes)."""
    table = response.divergence[kind]
    settling = settling_depth(table, dtr.g)
    deep = deep_flags(settling, n_layers, dtr.rho, dtr.deep_rule)
    return {
        "id": f"{response.question_id}",
        "tokens": list(tokens)[: table.shape[0]],
        "divergence": table.tolist(),
        "settling_depth": settling.tolist(),
        "deep": deep.tolist(),
        "dtr": deep_thinking_ratio(deep),
    }


def token_labels(response: StoredResponse, tokenizer: Any | None) -> list[str]:
    """The response's tokens as strings (ids when no tokenizer is at hand)."""
    if tokenizer is not None:
        return token_texts(tokenizer, response.token_ids)
    return [f"#{i}" for i in response.token_ids]


def thinkn_summary(store: Store, voting: VotingConfig | None) -> dict[str, Any] | None:
    """The store's Think@n summary: the latest one `depthlens thinkn` wrote, else voted now (n = half the pool)."""
    written = summary_files(store.path)
    if written and voting is None:
        summary = read_json(
            written[-1],
            "summary",
            "it is derived from the store: rerun `depthlens thinkn "
            f"--from {store.path} --overwrite` with its settings",
        )
        why = stale(summary, store.path)
        if why is not None:  # shown as such on the page, never as this state's
            summary["stale"] = (
                f"{written[-1].name} is not a summary of the store as it is now: {why}; rerun "
                f"`depthlens thinkn --from {store.path} --overwrite` with its settings"
            )
        return summary
    pool = int(store.manifest.get("pool", 0))
    if pool < 2:
        return None
    window = store.readout_tokens
    ranked = PREFIX_TOKENS if window is None else min(PREFIX_TOKENS, window)  # no more than was read out
    voting = voting or VotingConfig(n=max(2, pool // 2), rank_prefix=ranked)
    try:
        summarise(store.path, voting)
    except DepthlensError:
        return None
    return read_json(store.path / f"{summary_stem(voting)}.json", "summary", "vote again")


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A store the report left out, and why (still being written, damaged): the report names it."""

    path: Path
    reason: str


@dataclasses.dataclass(frozen=True)
class ReportData:
    """Everything ``viz.report`` writes up for a run directory."""

    run_dir: Path
    studies: list[StoreStudy]
    dtr: DTRConfig
    command: str  # the command that made the report
    skipped: list[Skipped] = dataclasses.field(default_factory=list)
    table_two: list[dict[str, Any]] = dataclasses.field(
        default_factory=list
    )  # every store's, p_bh over them all
    pooled: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # per model, its stores together
    control: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # Think@n − random@n per store
    pooled_control: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # ... per model


def prepare_report(
    run_dir: str | Path,
    cfg: CorrelationConfig = CorrelationConfig(),
    dtr: DTRConfig = DTRConfig(),
    voting: VotingConfig | None = None,
    tokenizer_for: Callable[[str], Any | None] = lambda model: None,
    on_store: Callable[[str], None] = lambda label: None,
) -> ReportData:
    """Study every finished store of ``run_dir`` and write its tables (``report/correlation.*``). A store still
    being written, or one that cannot be read, is left out and named in ``ReportData.skipped`` with its reason; when
    no store is left, InputError lists them all."""
    run_dir = Path(run_dir)
    command = (
        " ".join(["depthlens", *sys.argv[1:]])
        if sys.argv and sys.argv[0].endswith("depthlens")
        else "depthlens report"
    )
    studies, skipped = [], []
    paths = find_stores(run_dir)
    for path in paths:
        who = writer(samples_path(path, stored_format(path)))
        if who is not None:  # its numbers would change under the report: report it once it is finished
            skipped.append(Skipped(path, f"still being written by {who}; report again when it has finished"))
            continue
        try:
            store = load_store(path)
            on_store(store.label)
            studies.append(_study(store, cfg, dtr, voting, tokenizer_for))
        except DepthlensError as exc:  # damaged, foreign, too small to study: the others are still reported
            if len(paths) == 1:  # the report of one store is that store's: its reader's error, as it is
                raise
            skipped.append(Skipped(path, str(exc)))
    if not studies:
        raise InputError(
            f"no store under {run_dir} could be reported: "
            + "; ".join(f"{s.path}: {s.reason}" for s in skipped)
        )
    states = {str(s.store.path): store_state(s.store.path) for s in studies}  # what the report was made from
    write_correlation(
        run_dir / "report",
        studies,
        {"correlation": cfg.to_dict(), "dtr": dtr.to_dict(), "store_states": states},
        command,
    )
    by_model: dict[str, list[Any]] = {}
    for study in studies:
        if study.per_question is not None:
            by_model.setdefault(study.store.model, []).append(study.per_question)
    table_two = [r for s in studies for r in s.table_two]
    add_fdr(table_two, PAIRED_P)  # the whole Table 2 one family (a summary's own p_bh: its methods)
    if table_two:  # beside correlation.csv: Table 2's numbers, each row naming its model, task and questions
        write_csv(run_dir / "report" / "table_two.csv", table_two)
    control = [r for s in studies for r in s.control]
    pooled, pooled_control = pooled_rows(by_model), pooled_control_rows(by_model)
    # the primary contrast (Think@n − random@n) and the pooled rows, as CSV too: every number the page shows
    for name, rows in (("control", control), ("table_two_pooled", pooled + pooled_control)):
        if rows:
            write_csv(run_dir / "report" / f"{name}.csv", rows)
    return ReportData(run_dir, studies, dtr, command, skipped, table_two, pooled, control, pooled_control)


def _study(
    store: Store,
    cfg: CorrelationConfig,
    dtr: DTRConfig,
    voting: VotingConfig | None,
    tokenizer_for: Callable[[str], Any | None],
) -> StoreStudy:
    """One store's study, example response and Think@n summary (Table 2's rows)."""
    study = study_store(store, cfg, dtr)
    example = example_response(store)
    if example is not None:
        tokens = token_labels(example, tokenizer_for(store.model))
        study.example = heatmap_record(example, tokens, dtr, store.n_layers)
    study.summary = thinkn_summary(store, voting)
    if study.summary:
        replays = [read_json(p, "online replay", "replay again") for p in sorted(store.path.glob(REPLAYS))]
        stale = " (stale)" if study.summary.get("stale") else ""  # a summary of another state of the store
        study.table_two = table_two_rows(store.label + stale, study.summary, replays)
        study.control = control_rows(store.label + stale, study.summary)
        study.per_question = store_per_question(study.summary, replays)
    return study
