"""Per sample store: accuracy under today's answer rules (as stored) and under the pre-rules extraction
(``depthlens-answers-1``: the last box, else the last number of any text, cut-off text included), on the same
responses. Reproduces the counts of docs/findings.md §4.1. The old extraction is read from git history.

Usage: python examples/compare_answer_rules.py runs/study     (run from the repository, in its venv)
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

from depthlens.evals.answers import answers_equivalent
from depthlens.stores.samples import iter_samples
from depthlens.studies.report import find_stores

OLD_RULES = "592f272^:src/depthlens/voting/answers.py"  # the commit before the answer rules


def old_extraction() -> types.ModuleType:
    repo = Path(__file__).resolve().parent
    source = subprocess.run(
        ["git", "show", OLD_RULES], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType("old_answers")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(source, OLD_RULES, "exec"), module.__dict__)  # our own code, from our own history
    return module


def main(root: Path) -> None:
    old = old_extraction()
    for store in find_stores(root):  # JSONL or sharded Parquet sample stores
        rows = [json.loads(line) for line in (store / "questions.jsonl").open()]
        references = {r["id"]: r["answer"] for r in rows}
        old_right = new_right = dropped = dropped_right = truncated = 0
        sources: Counter[str] = Counter()
        responses = list(iter_samples(store))
        for r in responses:
            new_right += bool(r["correct"])
            truncated += r["finish"] == "length"
            sources[r["answer_source"]] += 1
            answer = old.extract_answer(r["text"])
            right = (
                answer is not None and answers_equivalent(answer.text, references[r["question_id"]]) is True
            )
            old_right += right
            if answer is not None and r["answer"] is None:
                dropped += 1
                dropped_right += right
        n = len(responses)
        print(
            f"{store.parent.name} · {store.name}: {n} responses, {sum(r['token_count'] for r in responses)} tokens, "
            f"{truncated} truncated; accuracy old rule {100 * old_right / n:.1f} %, now {100 * new_right / n:.1f} %; "
            f"{dropped} old-rule answers now unanswered ({dropped_right} of them graded right); "
            f"sources {dict(sources)}"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/study"))
