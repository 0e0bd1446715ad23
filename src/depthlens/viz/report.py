"""The studies of sample stores, drawn and written up: ``depthlens correlate`` and ``depthlens report``.

Computation comes from ``studies`` (correlation, sweeps, Think@n voting); this module only draws figures and
writes files. A *run directory* is a store or a folder of stores (found by their manifests, at any depth).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import CorrelationConfig, DTRConfig, VotingConfig
from depthlens.errors import DepthlensError, InputError
from depthlens.metrics.dtr import deep_flags, deep_thinking_ratio, deep_threshold, settling_depth
from depthlens.models.tokens import token_texts
from depthlens.studies.correlation import (
    METRICS,
    Store,
    StoredResponse,
    load_store,
    store_correlations,
    sweep,
    table_one,
)
from depthlens.studies.inference import PAIRED_FIELDS, add_fdr
from depthlens.studies.paired_tables import REPLAYS, pooled_rows, store_per_question, table_two_rows
from depthlens.studies.parquet_store import MANIFEST
from depthlens.studies.records import manifest_path, read_json
from depthlens.studies.store_answers import AnswerSummary
from depthlens.studies.tables import write_csv
from depthlens.studies.thinkn import SAMPLES, SHARDS, summarise, summary_files, summary_stem
from depthlens.viz.cost import draw_accuracy_cost, table_two_markdown
from depthlens.viz.heatmap import draw_divergence_heatmap, write_heatmap_html
from depthlens.viz.study import draw_metric_bins, draw_sweeps, draw_token_settling

LABELS = {m.name: m.label for m in METRICS}


def find_stores(run_dir: Path) -> list[Path]:
    """Every sample store at or under ``run_dir``, sorted; InputError naming what to do when there is none."""
    if not run_dir.is_dir():
        raise InputError(
            f"{run_dir} is not a directory; give a store written by `depthlens generate` or a folder of them"
        )
    jsonl = {p.parent for p in run_dir.rglob(manifest_path(Path(SAMPLES)).name)}
    sharded = {p.parent.parent for p in run_dir.rglob(f"{SHARDS}/{MANIFEST}")}  # `generate --ray` stores
    found = sorted(jsonl | sharded)
    if not found:
        raise InputError(
            f"no sample store under {run_dir} (looked for {SAMPLES} with its manifest); "
            "create one with `depthlens generate --readout-tokens all`"
        )
    return found


def _slug(store: Store) -> str:
    return f"{store.model}-{store.task}".replace("/", "_").replace(" ", "_").replace(":", "_")


@dataclasses.dataclass
class StoreStudy:
    store: Store
    rows: list[dict[str, Any]]
    sweeps: list[dict[str, Any]]
    figures: dict[str, Path]


def study_store(
    store: Store,
    out_dir: Path,
    cfg: CorrelationConfig,
    dtr: DTRConfig,
    g_by_kind: dict[str, float | None] | None = None,
    with_sweeps: bool = True,
) -> StoreStudy:
    """Table-1 rows, sweeps and Figures 1 and 4 of one store.

    A store read out only over a prefix gives DTR over that prefix (said in each row's note).
    """
    window = store.readout_tokens
    if window is not None and (dtr.prefix is None or dtr.prefix > window):
        dtr = dataclasses.replace(dtr, prefix=window)
    rows, profiles = store_correlations(store, cfg, dtr, g_by_kind)
    if window is not None:
        for row in rows:
            if row["metric"].startswith("dtr"):
                row["note"] = (
                    row["note"] + "; " if row["note"] else ""
                ) + f"DTR over the first {dtr.prefix} tokens"
    figures: dict[str, Path] = {}
    slug = _slug(store)
    if any(profiles.values()):
        figures["bins"] = draw_metric_bins(
            profiles,
            LABELS,
            out_dir / f"fig1-bins-{slug}.png",
            title=f"{store.label}: accuracy by metric bin",
        )
    sweeps: list[dict[str, Any]] = []
    if with_sweeps:
        sweeps = sweep(store, cfg, dtr)
        figures["sweeps"] = draw_sweeps(
            sweeps, out_dir / f"fig4-sweeps-{slug}.png", title=f"{store.label}: DTR sensitivity"
        )
    return StoreStudy(store, rows, sweeps, figures)


def write_correlation(
    out_dir: Path, studies: Sequence[StoreStudy], config: dict[str, Any], command: str
) -> list[Path]:
    """correlation.csv / .json / .md (Table 1 over all stores) and sweeps.csv."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [r for s in studies for r in s.rows]
    sweeps = [r for s in studies for r in s.sweeps]
    # Each table one family (studies/inference.py); in place, so whoever prints the studies' rows sees it.
    add_fdr(rows)
    add_fdr(sweeps)
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


# ---------------------------------------------------------------------------------------------------------
# Figures 2 and 3 from a stored response.


def example_response(store: Store) -> StoredResponse | None:
    """The response a reader is shown: a correct one of median length (else any of median length)."""
    full = [r for r in store.responses if r.divergence["jsd"].shape[0] == r.n_tokens and r.n_tokens > 0]
    pick = [r for r in full if r.correct] or full
    if not pick:
        return None
    lengths = np.array([r.n_tokens for r in pick])
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


def draw_token_figures(
    record: dict[str, Any], out_dir: Path, slug: str, dtr: DTRConfig, n_layers: int
) -> dict[str, Path]:
    """Figure 2 (PNG and interactive HTML) and Figure 3 for the record's most deeply settling token."""
    figures = {
        "heatmap": draw_divergence_heatmap(record, out_dir / f"fig2-heatmap-{slug}.png"),
        "heatmap_html": write_heatmap_html(record, out_dir / f"fig2-heatmap-{slug}.html"),
    }
    settling = np.asarray(record["settling_depth"])
    # The paper's Figure 3 shows a deep-thinking token that settles before the very last layer; else the deepest.
    inside = np.flatnonzero(np.asarray(record["deep"]) & (settling < n_layers))
    t = int(inside[np.argmax(settling[inside])]) if inside.size else int(np.argmax(settling))
    figures["token"] = draw_token_settling(
        record["divergence"][t],
        dtr.g,
        deep_threshold(n_layers, dtr.rho, dtr.deep_rule),
        out_dir / f"fig3-token-{slug}.png",
        token=record["tokens"][t] if t < len(record["tokens"]) else str(t),
    )
    return figures


# ---------------------------------------------------------------------------------------------------------
# The report page.


def _thinkn(store: Store, voting: VotingConfig | None) -> dict[str, Any] | None:
    """The store's Think@n summary: the latest one `depthlens thinkn` wrote, else voted now (n = half the pool)."""
    written = summary_files(store.path)
    if written and voting is None:
        return read_json(
            written[-1], "summary", "delete it, or rerun `depthlens thinkn --from` with --overwrite"
        )
    pool = int(store.manifest.get("pool", 0))
    if pool < 2:
        return None
    window = store.readout_tokens
    prefix = 50 if window is None else min(50, window)
    voting = voting or VotingConfig(n=max(2, pool // 2), prefix=prefix)
    try:
        summarise(store.path, voting)
    except DepthlensError:
        return None
    return read_json(store.path / f"{summary_stem(voting)}.json", "summary", "vote again")


def build_report(
    run_dir: Path,
    cfg: CorrelationConfig = CorrelationConfig(),
    dtr: DTRConfig = DTRConfig(),
    voting: VotingConfig | None = None,
    tokenizer_for: Callable[[str], Any | None] = lambda model: None,
    on_store: Callable[[str], None] = lambda label: None,
) -> Path:
    """Write ``run_dir/report/report.md`` and ``report.html`` with every table and figure of the run."""
    stores = [load_store(p) for p in find_stores(run_dir)]
    out = run_dir / "report"
    command = (
        " ".join(["depthlens", *sys.argv[1:]])
        if sys.argv and sys.argv[0].endswith("depthlens")
        else "depthlens report"
    )
    studies, sections, thinkn_rows, commands = [], [], [], []
    by_model: dict[str, list[dict[str, Any]]] = {}  # per model, each store's per-question accuracies
    for store in stores:
        on_store(store.label)
        study = study_store(store, out, cfg, dtr)
        studies.append(study)
        example = example_response(store)
        if example is not None:
            tokens = token_labels(example, tokenizer_for(store.model))
            record = heatmap_record(example, tokens, dtr, store.n_layers)
            study.figures.update(draw_token_figures(record, out, _slug(store), dtr, store.n_layers))
        summary = _thinkn(store, voting)
        if summary:
            commands.append(summary.get("command", ""))
            replays = [
                read_json(p, "online replay", "replay again") for p in sorted(store.path.glob(REPLAYS))
            ]
            commands += [r.get("command", "") for r in replays]
            rows = table_two_rows(store.label, summary, replays)
            thinkn_rows.extend(rows)
            if (per_q := store_per_question(summary, replays)) is not None:
                by_model.setdefault(store.model, []).append(per_q)
            study.figures["cost"] = draw_accuracy_cost(
                rows,
                out / f"fig5-cost-{_slug(store)}.png",
                title=f"{store.label}: n = {summary['voting']['n']}, {summary['voting']['trials']} trials",
            )
        sections.append(_store_section(study, summary, out))
    write_correlation(out, studies, {"correlation": cfg.to_dict(), "dtr": dtr.to_dict()}, command)
    rows = [r for s in studies for r in s.rows]
    lines = [
        f"# depthlens report: {run_dir}",
        "",
        "## How this was made",
        "",
        "```",
        *sorted({s.manifest.get("command", "?") for s in stores}),
        *sorted({c for c in commands if c and c != command and "thinkn" in c}),
        command,
        "```",
        "",
        "## Correlation with accuracy (Table 1)",
        "",
        table_one(rows),
    ]
    if thinkn_rows:
        add_fdr(
            thinkn_rows, PAIRED_FIELDS
        )  # the whole Table 2 one family (a summary's own p_bh: its methods)
        lines += table_two_markdown(thinkn_rows, pooled_rows(by_model))
    lines += [*sections, _limits(stores)]
    text = "\n".join(lines) + "\n"
    md = out / "report.md"
    md.write_text(text, encoding="utf-8")
    _write_html(text, out / "report.html")
    return md


def _store_section(study: StoreStudy, summary: dict[str, Any] | None, out: Path) -> str:
    store = study.store
    f = {k: v.relative_to(out).as_posix() for k, v in study.figures.items()}
    lines = [f"## {store.label}", "", f"Store `{store.path}`: {len(store.responses)} responses to "
             f"{len(store.questions())} questions, accuracy {100 * store.accuracy:.0f} %"
             + (f", {store.failed} failed" if store.failed else "") + ".", ""]  # fmt: skip
    if (
        summary and "answers" in summary
    ):  # how the accuracies above read their answers (docs/definitions.md §5)
        lines += [f"How its answers were read: {AnswerSummary(**summary['answers']).line()}.", ""]
    if "heatmap" in f:
        lines += ["**Figure 2** — one response's divergence to the final layer, token × layer; dots mark where each "
                  f"token settles (blue: deep-thinking). [Interactive version]({f['heatmap_html']}).", "",
                  f"![heatmap]({f['heatmap']})", "",
                  "**Figure 3** — the token of that response that settles deepest: divergence, its cumulative "
                  "minimum, the threshold g and the deep regime.", "", f"![token]({f['token']})", ""]  # fmt: skip
    if "bins" in f:
        lines += ["**Figure 1** — accuracy per within-question quantile bin of each metric (bins 1 → 5: lowest → "
                  "highest metric).", "", f"![bins]({f['bins']})", ""]  # fmt: skip
    if "sweeps" in f:
        lines += ["**Figure 4** — DTR's sensitivity to g, ρ, ℓ_prefix, the divergence kind and the deep rule "
                  "(KL and cosine at thresholds that flag as many deep tokens as JSD).", "",
                  f"![sweeps]({f['sweeps']})", ""]  # fmt: skip
    if "cost" in f and summary:
        v = summary["voting"]
        lines += [f"**Figure 5** — accuracy vs tokens per question (n = {v['n']}, η = {v['eta']}, ℓ_prefix = "
                  f"{v['prefix']}, {v['trials']} trials).", "", f"![cost]({f['cost']})", ""]  # fmt: skip
    return "\n".join(lines)


def _limits(stores: Sequence[Store]) -> str:
    small = [s.label for s in stores if len(s.responses) < 200]
    text = [
        "## Reading this report",
        "",
        "- Binned r follows the paper (definitions.md §4) and flatters: five bins per question swing r widely; the "
        "unbinned point-biserial r and Spearman ρ with question-bootstrap 95 % intervals are the honest numbers.",
        "- Questions where every response is right (or every one wrong) carry no binned r; `q` counts those that do.",
    ]
    if small:
        text.append(
            f"- Small samples ({', '.join(small)}): intervals are wide; read the signs, not the digits."
        )
    return "\n".join(text) + "\n"


def _write_html(markdown: str, path: Path) -> Path:
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)
    path.write_text(
        '<!doctype html><html><head><meta charset="utf-8"><title>depthlens report</title><style>'
        "body{font:14px system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px}"
        "img{max-width:100%}code,pre{background:#f5f5f5}</style></head><body>" + body + "</body></html>\n",
        encoding="utf-8",
    )
    return path
