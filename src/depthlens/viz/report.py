"""The report of a run's stores, drawn and written up (``depthlens correlate``, ``depthlens report``): every figure
of each store (Figures 1–5) and one Markdown and HTML page. Everything shown is computed by ``studies.report``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import CorrelationConfig, DTRConfig, VotingConfig
from depthlens.evals.grading import AnswerSummary
from depthlens.metrics.dtr import deep_threshold
from depthlens.models.catalogue import CATALOGUE
from depthlens.models.precision import Precision, weights_quantisation
from depthlens.studies.correlation import METRICS
from depthlens.studies.report import ReportData, StoreStudy, prepare_report, slug
from depthlens.studies.stored import Store
from depthlens.studies.tables import table_one
from depthlens.viz.cost import draw_accuracy_cost, table_two_markdown
from depthlens.viz.heatmap import draw_divergence_heatmap, write_heatmap_html
from depthlens.viz.study import draw_metric_bins, draw_sweeps, draw_token_settling

LABELS = {m.name: m.label for m in METRICS}


def draw_study(study: StoreStudy, out_dir: str | Path, dtr: DTRConfig) -> dict[str, Path]:
    """Every figure of one store's study that its data allow: Figure 1 (bins), 4 (sweeps), 2 and 3 (the example
    response), 5 (accuracy vs cost from its Think@n summary)."""
    out_dir = Path(out_dir)
    store, name = study.store, slug(study.store)
    figures: dict[str, Path] = {}
    if any(study.profiles.values()):
        figures["bins"] = draw_metric_bins(
            study.profiles,
            LABELS,
            out_dir / f"fig1-bins-{name}.png",
            title=f"{store.label}: accuracy by metric bin",
        )
    if study.sweeps:
        figures["sweeps"] = draw_sweeps(
            study.sweeps, out_dir / f"fig4-sweeps-{name}.png", title=f"{store.label}: DTR sensitivity"
        )
    if study.example is not None:
        figures.update(draw_token_figures(study.example, out_dir, name, dtr, store.n_layers))
    if study.summary:
        v = study.summary["voting"]
        figures["cost"] = draw_accuracy_cost(
            study.table_two or study.summary["methods"],
            out_dir / f"fig5-cost-{name}.png",
            title=f"{store.label}: n = {v['n']}, {v['trials']} trials",
        )
    return figures


def draw_token_figures(
    record: dict[str, Any], out_dir: str | Path, name: str, dtr: DTRConfig, n_layers: int
) -> dict[str, Path]:
    """Figure 2 (PNG and interactive HTML) and Figure 3 for the record's most deeply settling token."""
    out_dir = Path(out_dir)
    draw_divergence_heatmap(record, out_dir / f"fig2-heatmap-{name}.png")
    figures = {
        "heatmap": out_dir / f"fig2-heatmap-{name}.png",
        "heatmap_html": write_heatmap_html(record, out_dir / f"fig2-heatmap-{name}.html"),
    }
    settling = np.asarray(record["settling_depth"])
    # The paper's Figure 3 shows a deep-thinking token that settles before the very last layer; else the deepest.
    inside = np.flatnonzero(np.asarray(record["deep"]) & (settling < n_layers))
    t = int(inside[np.argmax(settling[inside])]) if inside.size else int(np.argmax(settling))
    figures["token"] = draw_token_settling(
        record["divergence"][t],
        dtr.g,
        deep_threshold(n_layers, dtr.rho, dtr.deep_rule),
        out_dir / f"fig3-token-{name}.png",
        token=record["tokens"][t] if t < len(record["tokens"]) else str(t),
    )
    return figures


def build_report(
    run_dir: str | Path,
    cfg: CorrelationConfig = CorrelationConfig(),
    dtr: DTRConfig = DTRConfig(),
    voting: VotingConfig | None = None,
    tokenizer_for: Callable[[str], Any | None] = lambda model: None,
    on_store: Callable[[str], None] = lambda label: None,
) -> Path:
    """``depthlens report``: the run's studies (``studies.report.prepare_report``), then ``write_report``."""
    run_dir = Path(run_dir)
    return write_report(prepare_report(run_dir, cfg, dtr, voting, tokenizer_for, on_store))


def write_report(data: ReportData) -> Path:
    """Draw every store's figures and write ``run_dir/report/report.md`` and ``report.html``."""
    out = data.run_dir / "report"
    stores = [s.store for s in data.studies]
    sections, commands = [], []
    for study in data.studies:
        figures = draw_study(study, out, data.dtr)
        if study.summary:
            commands.append(study.summary.get("command", ""))
            commands += [r.get("command", "") for r in study.table_two if r.get("command")]
        sections.append(_store_section(study, figures, out))
    rows = [r for s in data.studies for r in s.rows]
    lines = [
        f"# depthlens report: {data.run_dir}",
        "",
        "## How this was made",
        "",
        "```",
        *sorted({s.manifest.get("command", "?") for s in stores}),
        *sorted({c for c in commands if c and c != data.command and "thinkn" in c}),
        data.command,
        "```",
        "",
        "## Correlation with accuracy (Table 1)",
        "",
        table_one(rows),
    ]
    if data.table_two:
        lines += table_two_markdown(data.table_two, data.pooled, data.control, data.pooled_control)
    lines += [*sections, *_skipped(data), _limits(stores)]
    text = "\n".join(lines) + "\n"
    md = out / "report.md"
    md.write_text(text, encoding="utf-8")
    _write_html(text, out / "report.html")
    return md


def _store_section(study: StoreStudy, figures: dict[str, Path], out: Path) -> str:
    store, summary = study.store, study.summary
    f = {k: v.relative_to(out).as_posix() for k, v in figures.items()}
    lines = [
        f"## {store.label}",
        "",
        f"Store `{store.path}`: {len(store.responses)} responses to "
        f"{len(store.questions())} questions, accuracy {100 * store.accuracy:.0f} %"
        + (f", {store.failed} failed" if store.failed else "")
        + ".",
        "",
        _model_line(store.model, store.manifest.get("precision")),
        "",
    ]
    if summary and summary.get("stale"):
        lines += [f"**Stale Think@n summary**: {summary['stale']}.", ""]
    if (
        summary and "answers" in summary
    ):  # how the accuracies above read their answers (docs/definitions.md §5)
        lines += [f"How its answers were read: {AnswerSummary(**summary['answers']).line()}.", ""]
    if "bins" in f:
        lines += [
            "**Figure 1** — accuracy per within-question quantile bin of each metric (bins 1 → 5: lowest → "
            "highest metric).",
            "",
            f"![bins]({f['bins']})",
            "",
        ]
    if "heatmap" in f:
        lines += [
            "**Figure 2** — one response's divergence to the final layer, token × layer; dots mark where each "
            f"token settles (blue: deep-thinking). [Interactive version]({f['heatmap_html']}).",
            "",
            f"![heatmap]({f['heatmap']})",
            "",
            "**Figure 3** — the token of that response that settles deepest: divergence, its cumulative "
            "minimum, the threshold g and the deep regime.",
            "",
            f"![token]({f['token']})",
            "",
        ]
    if "sweeps" in f:
        lines += [
            "**Figure 4** — DTR's sensitivity to g, ρ, ℓ_prefix, the divergence kind and the deep rule "
            "(KL and cosine at thresholds that flag as many deep tokens as JSD).",
            "",
            f"![sweeps]({f['sweeps']})",
            "",
        ]
    lines += _vote_lines(summary)
    if "cost" in f and summary:
        v = summary["voting"]
        lines += [
            f"**Figure 5** — accuracy vs tokens per question (n = {v['n']}, η = {v['eta']}, ℓ_prefix = "
            f"{v['prefix']}, {v['trials']} trials).",
            "",
            f"![cost]({f['cost']})",
            "",
        ]
    return "\n".join(lines)


def _vote_lines(summary: dict[str, Any] | None) -> list[str]:
    """What the store's Table 2 rows average over and how its ties were scored (``thinkn``'s notes), as a list."""
    if not summary or not summary.get("methods"):
        return []
    from depthlens.studies.thinkn import stored_voting, vote_notes
    from depthlens.voting.trials import MethodSummary

    known = {f.name for f in dataclasses.fields(MethodSummary)}
    rows = [MethodSummary(**{k: v for k, v in m.items() if k in known}) for m in summary["methods"]]
    notes = vote_notes(rows, stored_voting(summary["voting"]))
    return ["Its vote (Table 2):", "", *(f"- {line}" for line in notes), ""] if notes else []


def _model_line(model: str, precision: Precision | None) -> str:
    """The model and the precision it was read at, as the store's manifest records it (docs/definitions.md)."""
    if precision:
        return (
            f"Model `{model}`: weights {precision.get('weights', '?')}, forward pass in "
            f"{precision.get('compute_dtype', '?')}."
        )
    weights = f"weights {weights_quantisation(model)}; " if model in CATALOGUE else ""
    return f"Model `{model}`: {weights}precision not recorded (a store written before depthlens recorded it)."


def _skipped(data: ReportData) -> list[str]:
    """The stores left out of this report, each with its reason (the report covers the others)."""
    if not data.skipped:
        return []
    return [
        "## Stores not in this report",
        "",
        *(f"- `{s.path}`: {s.reason}" for s in data.skipped),
        "",
    ]


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
        "img{max-width:100%}code,pre{background:#f5f5f5}"
        # a command line wraps inside its box instead of running past the page
        "pre{padding:.5em;white-space:pre-wrap;overflow-wrap:anywhere}"
        "</style></head><body>" + body + "</body></html>\n",
        encoding="utf-8",
    )
    return path
