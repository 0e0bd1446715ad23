"""Tables out of study rows: CSV files and Markdown, shared by every study."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Rows (dicts with the same keys) as CSV; the header is the first row's keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
    return path


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.3f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table of ``rows`` (all keys of the first row, or ``columns``)."""
    if not rows:
        return "(no rows)\n"
    columns = list(columns or rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_study(out_dir: Path, name: str, result: dict[str, Any], command: str) -> list[Path]:
    """``<name>.csv`` (rows), ``<name>.json`` (summary + command) and ``<name>.md`` (the summary table)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = result["summary"]
    paths = [write_csv(out_dir / f"{name}.csv", result["rows"])]
    (out_dir / f"{name}.json").write_text(
        json.dumps({"summary": summary, "command": command}, indent=2) + "\n"
    )
    table = markdown_table(summary if isinstance(summary, list) else [summary])
    (out_dir / f"{name}.md").write_text(f"# {name}\n\n`{command}`\n\n{table}", encoding="utf-8")
    return [*paths, out_dir / f"{name}.json", out_dir / f"{name}.md"]
