"""Issue 48's Table 2 rows, one per store and answer rule, from the Think@n summaries `thinkn --from` wrote
(docs/findings.md §6.4): Pass@1, Cons@n, Think@n, random@n, the primary contrast Think@n − random@n and the paper's
Think@n − Cons@n (each with its question-resampled 95 % interval and sign-flip p), tie and no-answer shares.

Usage (after `bash examples/findings_study.sh OUT vote` and `… OUT fallback`):
    python examples/findings_tables.py OUT docs/data/findings/table2.csv    # reads OUT and OUT-fallback

Prints the rows as Markdown and writes them as CSV; nothing is recomputed (the summaries hold every number).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

SUMMARY = "thinkn-n8-eta0.5-l50.json"


def _interval(row: dict[str, Any]) -> str:
    return f"{100 * row['diff']:+.1f} [{100 * row['diff_lo']:+.1f}, {100 * row['diff_hi']:+.1f}]"


def summary_row(path: Path, rule: str) -> dict[str, Any]:
    summary = json.loads(path.read_text())
    methods = {m["method"]: m for m in summary["methods"]}
    think, cons, rand = methods["think@n"], methods["cons@n"], methods["random@n"]
    control = summary["control"]
    trials = summary["voting"]["trials"]
    questions = summary["task"]["questions"]
    draws = trials * think["questions"]
    return {
        "model": summary["model"],
        "task": summary["task"]["name"].split(":")[-1],
        "questions": think["questions"],
        "questions_asked": questions,
        "responses": summary["responses"],
        "rule": rule,
        "tie_break": summary["voting"]["tie_break"],
        "pass1": summary["grades"]["correct"] / summary["responses"],
        "unanswered": summary["grades"].get("no_answer", 0) / summary["responses"],
        "cons": cons["accuracy_mean"],
        "think": think["accuracy_mean"],
        "random": rand["accuracy_mean"],
        "think_minus_random": control["diff"],
        "think_minus_random_lo": control["diff_lo"],
        "think_minus_random_hi": control["diff_hi"],
        "think_minus_random_p": control["p"],
        "think_minus_cons": think["diff"],
        "think_minus_cons_lo": think["diff_lo"],
        "think_minus_cons_hi": think["diff_hi"],
        "think_minus_cons_p": think["p"],
        "ties_cons": cons["tie_draws"] / draws,
        "ties_think": think["tie_draws"] / draws,
        "ties_random": rand["tie_draws"] / draws,
        "no_answer_cons": cons["no_answer"],
        "no_answer_think": think["no_answer"],
        "no_answer_random": rand["no_answer"],
        "think_cost_vs_cons": think["cost_vs_cons"],
        "_think_random": _interval(control),
        "_think_cons": _interval(think),
    }


def main(out: Path, csv_path: Path) -> None:
    rows = []
    for run, rule in ((out, "strict"), (Path(f"{out}-fallback"), "final-result")):
        rows += [summary_row(p, rule) for p in sorted(run.glob(f"*/*/{SUMMARY}"))]
    print(
        "| model · task | rule | Pass@1 | Cons@n | Think@n | random@n | **Think@n − random@n** [95 %], p "
        "| Think@n − Cons@n [95 %], p | ties Cons / Think / random | no answer / trial Cons / Think / random |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} · {r['task']} ({r['questions']} q) | {r['rule']} | {100 * r['pass1']:.1f} "
            f"| {100 * r['cons']:.1f} | {100 * r['think']:.1f} | {100 * r['random']:.1f} "
            f"| {r['_think_random']}, p {r['think_minus_random_p']:.2g} | {r['_think_cons']}, p "
            f"{r['think_minus_cons_p']:.2g} | {100 * r['ties_cons']:.0f} / {100 * r['ties_think']:.0f} / "
            f"{100 * r['ties_random']:.0f} % | {r['no_answer_cons']:.2g} / {r['no_answer_think']:.2g} / "
            f"{r['no_answer_random']:.2g} |"
        )
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    fields = [k for k in rows[0] if not k.startswith("_")] if rows else []
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {csv_path}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
