"""Build ``answers_real.jsonl`` from sample stores written by ``depthlens generate`` (see answers_real.md).

Each row is one real response: the task and question it answered, how it was prompted, its text and finish,
and the answer, source and grade it must get. The expected values were written by this script from the
extractor of the day and then read by hand against each text; rows where the reading disagreed were corrected
(see answers_real.md). Run: ``python tests/data/make_answers_real.py STORE... > tests/data/answers_real.jsonl``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from depthlens.config import AnswerConfig
from depthlens.evals.grading import grade, store_answers
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.samples import SAMPLES, read_manifest
from depthlens.studies.regrade import rebuild_questions


def rows(store: Path) -> list[dict[str, object]]:
    manifest = read_manifest(store)
    style = store_answers(manifest)[0].prompt_style
    questions = rebuild_questions(store, manifest)
    task = manifest["task"]
    data = Path(task["data"]).name if task.get("data") else None
    out = []
    for r in iter_jsonl(store / SAMPLES):
        if r.get("status") != "ok":
            continue
        q = questions[r["question_id"]]
        g = grade(q, r["text"], r["finish"], AnswerConfig(prompt_style=style))
        out.append(
            {
                "id": f"{store.name}/{r['id']}",
                "model": manifest["model"],
                "task": task["name"],
                "task_seed": task.get("task_seed", 0),
                "data": data,
                "question_id": r["question_id"],
                "answer_type": q.extraction().answer_type,
                "prompt_style": style,
                "reference": q.answer,
                "finish": r["finish"],
                "n_tokens": r["n_tokens"],
                "text": r["text"],
                "answer": g.answer,
                "answer_source": g.source or "none",
                "grade": g.status,
            }
        )
    return out


if __name__ == "__main__":
    for path in sys.argv[1:]:
        for row in rows(Path(path)):
            print(json.dumps(row, ensure_ascii=False))
