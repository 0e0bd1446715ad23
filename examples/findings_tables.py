"""docs/findings.md §6's tables regenerated from the committed compact per-response tables alone (no model, no store):

- ``table2.csv``: per store and answer rule, every method that a compact table can vote (``studies.compact_votes``)
  as its exact expectation over all C(16, 8) draws of n = 8 from each pool (η 0.5, ℓ 50; the ties at the η cut and
  at the top of a vote broken uniformly), the 10 trials' means beside them, and the paired contrasts over
  questions — Think@n − random@n, Think@n − Cons@n, Think@n within length strata − random@n, Short@n − Cons@n, and
  (exploratory) whole-response-DTR Think@n − random@n; then per model and rule the stores pooled.
- ``correlation-*.csv``: each store's Table 1 with the rows a compact table re-derives (DTR, prefix DTR, token count
  and its reverse) computed again, now with length held fixed (``r_within_partial``, ``p_within_partial``, the
  length-matched AUC), and Benjamini–Hochberg redone over the table. The other rows (log-probability,
  self-certainty, …) need per-token values the compact table does not keep: they stay as `depthlens correlate`
  wrote them, without the length-held-fixed columns.

Self-Certainty@n and DeepConf's rows need per-token self-certainty and confidences: they are not in the regenerated
Table 2 (docs/findings.md §6.4.1 keeps their trial-based figures from the stores).

Usage (from the repository, in its venv; about a minute per store on one core):
    python examples/findings_tables.py docs/data/findings        # rewrites table2.csv and correlation-*.csv

``tests/test_compact.py`` re-derives every number of both from the same compact rows.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

from depthlens.config import CorrelationConfig, VotingConfig
from depthlens.stats.fdr import add_fdr
from depthlens.studies.compact import read_compact, table_one_from_rows
from depthlens.studies.compact_votes import pooled_rows, store_votes
from depthlens.studies.correlation import TABLE_ONE_P
from depthlens.studies.tables import write_csv

VOTING = VotingConfig(n=8, eta=0.5, rank_prefix=50, trials=10, seed=0)
"""The votes of §6.4: n = 8 drawn from each pool of 16, η 0.5, ℓ 50, 10 trials, ties uniform."""


def table_two(data: Path) -> list[dict[str, Any]]:
    """Every store's rows (strict, then final-result), then the pooled rows."""
    votes = [
        v for path in sorted(data.glob("compact-*.csv")) for v in store_votes(read_compact(path), VOTING)
    ]
    votes.sort(key=lambda v: (v.rule != "strict", v.model, v.task))
    return [v.row for v in votes] + pooled_rows(votes, VOTING.seed)


def table_one(compact: Path, written: Path) -> list[dict[str, Any]]:
    """``written`` (the store's Table 1) with the rows the compact table re-derives replaced, BH redone."""
    with written.open(encoding="utf-8") as f:
        old = list(csv.DictReader(f))
    derived = {r["metric"]: flat(r) for r in table_one_from_rows(read_compact(compact), CorrelationConfig())}
    labels = {"dtr_prefix": "DTR (JSD), first 50 tokens"}
    rows, seen = [], set()
    for row in old:
        metric = row["metric"]
        base = {k: _typed(v) for k, v in row.items() if not k.endswith("_bh")}
        rows.append({**base, **derived.get(metric, {})})
        seen.add(metric)
        if metric == "dtr" and "dtr_prefix" in derived:  # Think@n's ranking score, beside whole-response DTR
            rows.append(
                {**base, **derived["dtr_prefix"], "metric": "dtr_prefix", "label": labels["dtr_prefix"]}
            )
            seen.add("dtr_prefix")
    add_fdr(rows, TABLE_ONE_P)
    return rows


def flat(row: dict[str, Any]) -> dict[str, Any]:
    """A re-derived Table 1 row under the CSV's column names (each interval as ``_lo`` / ``_hi``)."""
    out = dict(row)
    for name in ("binned_r", "spearman", "point_biserial", "auc_length_matched"):
        out[f"{name}_lo"], out[f"{name}_hi"] = out.pop(f"{name}_ci")
    return out


def _typed(cell: str) -> Any:
    if cell == "":
        return None
    try:
        return int(cell) if cell.lstrip("-").isdigit() else float(cell)
    except ValueError:
        return cell


def main(data: Path) -> None:
    rows = table_two(data)
    write_csv(data / "table2.csv", rows)
    for r in rows:
        print(
            f"{r['model']} · {r['task']} · {r['rule']}: Think@n − random@n {100 * r['think_minus_random']:+.1f} "
            f"[{100 * r['think_minus_random_lo']:+.1f}, {100 * r['think_minus_random_hi']:+.1f}], "
            f"p {r['think_minus_random_p']:.2g}"
        )
    for compact in sorted(data.glob("compact-*.csv")):
        written = compact.with_name(compact.name.replace("compact-", "correlation-"))
        write_csv(written, table_one(compact, written))
        print(f"rewrote {written}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
