"""Print a scores store (a Parquet store directory or a JSONL file) as a table and draw one record's heatmap.

python examples/show_scores.py runs/scores [--png runs/scores-heatmap.png (the default)]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from depthlens.stores.parquet import iter_store
from depthlens.viz.heatmap import draw_divergence_heatmap


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scores", type=Path)
    parser.add_argument("--png", type=Path, help="heatmap path (default: beside the scores)")
    parser.add_argument("--record", help="id of the record to draw (default: the longest)")
    args = parser.parse_args()
    records = list(iter_store(args.scores))
    table = Table(title=f"{args.scores}")
    for column in ("id", "tokens", "DTR", "mean settling", "mean log p", "self-certainty", "neg. entropy"):
        table.add_column(column, justify="left" if column == "id" else "right")
    for r in records:
        table.add_row(
            r["id"],
            str(r["token_count"]),
            _fmt(r["dtr"]),
            _fmt(r["mean_settling_depth"], 1),
            _fmt(r["log_prob"]),
            _fmt(r["self_certainty"], 2),
            _fmt(r["neg_entropy"]),
        )
    console = Console()
    console.print(table)
    drawable = [r for r in records if r.get("divergence")]
    if not drawable:
        return
    chosen = next(
        (r for r in drawable if r["id"] == args.record), max(drawable, key=lambda r: r["token_count"])
    )
    png = args.png or args.scores.with_name(args.scores.stem + "-heatmap.png")
    draw_divergence_heatmap(chosen, png)
    console.print(f"heatmap of {chosen['id']!r}: {png}")


if __name__ == "__main__":
    main()
