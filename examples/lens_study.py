"""docs/findings.md §8 — which lens makes DTR mean something (issue 58 item 7), from the committed study responses.

Each committed response (docs/data/findings/compact-*.csv: the question and the text) is read again by the model it
came from, its first ℓ = 50 completion tokens only, under one lens at a time — the logit lens, the tuned lens fitted
here, the Jacobian lens fitted here — and its prefix DTR (g 0.5, ρ 0.85, the study's settings) and each layer's JSD to
the final layer are kept. Then per model and lens (``depthlens.studies.compact_lens``): the median JSD by layer,
prefix DTR's within-question correlation with correctness with length held fixed, and Think@n − random@n exact over
every draw of n = 8 from each pool of 16 — each store's Think@n ranking by that lens's prefix DTR, nothing else changed.

The responses are read from their text: the text is tokenized again (the end-of-turn token added back where the
response ended on it), so a few windows differ from the generated tokens by a token or two; the logit lens's row is the
control — its prefix DTR against the one the store computed from the generated tokens (``control`` in the table).

Usage (from the repository, in its venv; resumable — each (model, lens) keeps its finished responses under WORK):
    OMP_NUM_THREADS=1 nice -n 19 python examples/lens_study.py score smollm2-135m-instruct logit logit
    … score smollm2-135m-instruct tuned tuned:/work/lenses/smollm2-135m-instruct/tuned
    … score smollm2-135m-instruct jacobian jacobian:/work/lenses/smollm2-135m-instruct/jlens.pt
    python examples/lens_study.py tables          # → docs/data/findings/lens-*.csv (tests/test_lens_study.py)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path("docs/data/findings")
WORK = Path("runs/lens-study")
PREFIX = 50  # ℓ: the study's prefix (findings §6.4)


def _windows(lm: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each response as score reads it: the chat prompt the study generated under, and the first ℓ tokens of its
    text tokenized again (the end-of-turn id added back where the response ended on it)."""
    from depthlens.evals.tasks import Question
    from depthlens.studies.score_inputs import tokenize

    eos = lm.tokenizer.eos_token_id
    out = []
    for r in rows:
        messages = Question(r["question_id"], r["question"], "").messages("paper")
        seq = tokenize(lm, {"messages": messages, "completion": r["text"]}, r["id"])
        ids = list(seq.completion_ids) + ([eos] if r["finish"] == "eos" and eos is not None else [])
        window = min(PREFIX, int(r["token_count"]))
        out.append({"id": r["id"], "prompt_ids": list(seq.prompt_ids), "completion_ids": ids[:window]})
    return out


def score(model: str, name: str, lens: str, work: Path, batch: int, tasks: list[str]) -> None:
    """Score every committed response of ``model`` (of ``tasks``, or all) under ``lens``, appending to
    WORK/model/name.jsonl."""
    import depthlens
    from depthlens.studies.compact import read_compact

    lm = depthlens.load(model)
    rows = [r for p in sorted(DATA.glob(f"compact-{model}-*.csv")) for r in read_compact(p)]
    rows = [r for r in rows if not tasks or r["task"] in tasks]
    out = work / model / f"{name}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["id"] for line in out.open()} if out.exists() else set()
    todo = _windows(lm, [r for r in rows if r["id"] not in done])
    print(f"{model} / {name}: {len(done)} done, {len(todo)} to score", flush=True)
    started = time.process_time()
    for i in range(0, len(todo), batch):
        part = todo[i : i + batch]
        table = depthlens.score(
            lm, part, tokens=True, tcb=False, lens=lens, g=0.5, rho=0.85, batch_size=batch, progress=False
        )
        with out.open("a") as f:
            for rec, row in zip(part, table.to_pylist(), strict=True):
                f.write(json.dumps(_kept(rec, row, lens)) + "\n")
        cpu = (time.process_time() - started) / (i + len(part))
        print(f"{i + len(part)}/{len(todo)} ({cpu:.2f} CPU-s a response)", flush=True)


def _kept(rec: dict[str, Any], row: dict[str, Any], lens: str) -> dict[str, Any]:
    """What the tables read of one scored response: its prefix's deep count, the tokens read, and each token's
    JSD by layer (rounded to 1e-5 bits: the medians are read to 3 digits)."""
    return {
        "id": rec["id"],
        "lens": lens,
        "tokens_read": len(row["deep"]),
        "deep": int(sum(row["deep"])),
        "dtr_prefix": row["dtr"],
        "mean_settling_depth": row["mean_settling_depth"],
        "divergence": [[round(float(v), 5) for v in layer] for layer in row["divergence"]],
    }


def tables(work: Path) -> None:
    """The committed tables: per model, each response's prefix DTR per lens and, per lens and store (task), the JSD
    quantiles by layer over the stores whose every response was read; then the study's table over every model and
    lens."""
    from depthlens.studies.compact import read_compact
    from depthlens.studies.compact_lens import LENS_TABLE, lens_table, write_rows

    for model_dir in sorted(p for p in work.iterdir() if p.is_dir()):
        model, per_response, by_layer = model_dir.name, [], []
        stores: dict[str, set[str]] = {}
        for path in sorted(DATA.glob(f"compact-{model}-*.csv")):
            for r in read_compact(path):
                stores.setdefault(r["task"], set()).add(r["id"])
        for scored in sorted(model_dir.glob("*.jsonl")):
            kept = {k["id"]: k for k in map(json.loads, scored.open())}
            for k in kept.values():
                per_response.append({k_: k[k_] for k_ in ("id", "lens", "tokens_read", "deep", "dtr_prefix")})
                per_response[-1]["lens_name"] = scored.stem
            for task, ids in stores.items():
                if ids <= kept.keys():
                    by_layer += _quantiles(scored.stem, task, [kept[i]["divergence"] for i in sorted(ids)])
        write_rows(per_response, DATA / f"lens-prefix-dtr-{model}.csv")
        write_rows(by_layer, DATA / f"lens-jsd-{model}.csv")
    write_rows(lens_table(DATA), DATA / LENS_TABLE)


def _quantiles(lens_name: str, task: str, divergences: list[list[list[float]]]) -> list[dict[str, Any]]:
    """Each layer's quartiles of JSD to the final layer over every token of ``divergences`` ([T][L] each)."""
    divergence = np.concatenate([np.asarray(d, float) for d in divergences if d])
    q = np.quantile(divergence, [0.25, 0.5, 0.75], axis=0)
    return [
        {
            "lens_name": lens_name,
            "task": task,
            "layer": layer + 1,
            "q25": q[0, layer],
            "median": q[1, layer],
            "q75": q[2, layer],
            "tokens": len(divergence),
        }
        for layer in range(divergence.shape[1])
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    s = sub.add_parser("score")
    s.add_argument("model")
    s.add_argument("name", help="the lens's name in the tables: logit, tuned, jacobian")
    s.add_argument("lens", help="as --lens takes it: logit, tuned:PATH, jacobian:PATH")
    s.add_argument("--batch", type=int, default=8)
    s.add_argument("--task", action="append", default=[], help="only this family (repeatable; default: all)")
    s.add_argument("--work", type=Path, default=WORK)
    t = sub.add_parser("tables")
    t.add_argument("--work", type=Path, default=WORK)
    args = parser.parse_args()
    if args.stage == "score":
        score(args.model, args.name, args.lens, args.work, args.batch, args.task)
    else:
        tables(args.work)


if __name__ == "__main__":
    main()
