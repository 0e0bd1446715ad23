"""docs/findings.md §8: which lens makes DTR mean something — the study's table from committed files alone.

Inputs (docs/data/findings/): the compact per-response tables of §6 (``compact-*.csv``: question, answer, grade,
length) and, per model, each response's prefix DTR read again under each lens (``lens-prefix-dtr-<model>.csv``,
written by ``examples/lens_study.py``: the lens, the tokens of the window read and how many were deep). Per model,
lens and store (and the model's stores pooled), the compact rows with their ``dtr_prefix`` replaced by the lens's
are voted and correlated by §6's own code (``compact_votes``, ``compact.table_one_from_rows``), nothing else changed:

- Think@n − random@n, exact over every draw of n = 8 from each pool (η 0.5, ℓ 50, ties uniform), its 95 % interval
  and p over questions;
- prefix DTR's within-question correlation with correctness, raw and with length and the cap's cut held fixed, and
  the length-matched AUC;
- the control (the logit lens): how often the re-read prefix DTR equals the store's own, and their correlation.

A window whose text tokenized again to another length than the store's (``tokens_read`` ≠ min(ℓ, token_count): a
re-tokenization, a token or two) keeps its lens's share of deep tokens, carried to the store's window as a whole
count (rounded); the table counts them (``windows_retokenized``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import PREFIX_TOKENS, CorrelationConfig, VotingConfig
from depthlens.errors import InputError
from depthlens.studies.compact import read_compact, table_one_from_rows
from depthlens.studies.compact_votes import pooled_rows, store_votes
from depthlens.studies.tables import write_csv

LENS_TABLE = "lens-table.csv"
VOTING = VotingConfig(n=8, eta=0.5, rank_prefix=PREFIX_TOKENS, trials=10, seed=0)
"""§6.4's votes: n = 8 from each pool of 16, η 0.5, ℓ 50, ties uniform (10 trials beside the exact expectation)."""
LENS_ORDER = ("logit", "tuned", "jacobian")
CORRELATION = ("r_within", "p_within_perm", "r_within_partial", "p_within_partial", "auc_length_matched")
CONTRAST = (
    "think",
    "random",
    "cons",
    "cut_ties_think",
    "think_minus_random",
    "think_minus_random_lo",
    "think_minus_random_hi",
)


def read_lens_rows(path: Path) -> list[dict[str, Any]]:
    """A ``lens-prefix-dtr-<model>.csv``, typed."""
    with path.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["tokens_read"], r["deep"], r["dtr_prefix"] = (
            int(r["tokens_read"]),
            int(r["deep"]),
            float(r["dtr_prefix"]),
        )
    return rows


def with_lens(
    compact: Sequence[dict[str, Any]], scored: dict[str, dict[str, Any]], prefix: int = PREFIX_TOKENS
) -> tuple[list[dict[str, Any]], int]:
    """``compact``'s rows with ``dtr_prefix`` (and ``dtr``: only the prefix was read) the lens's, and the number of
    windows carried to the store's window length. Every row must have been scored."""
    out, carried = [], 0
    for row in compact:
        s = scored.get(row["id"])
        if s is None:
            raise InputError(
                f"{row['id']}: not scored under this lens; score it (examples/lens_study.py score)"
            )
        window = min(prefix, int(row["token_count"]))
        deep = s["deep"]
        if s["tokens_read"] != window:
            carried += 1
            deep = round(deep * window / s["tokens_read"]) if s["tokens_read"] else 0
        value = deep / window if window else math.nan
        out.append({**row, "dtr_prefix": value, "dtr": value})
    return out, carried


def _scored_stores(
    compact: Sequence[dict[str, Any]], scored: dict[str, dict[str, Any]]
) -> list[list[dict[str, Any]]]:
    """The model's stores (one task each) whose every response was scored under the lens, in table order."""
    stores: dict[str, list[dict[str, Any]]] = {}
    for row in compact:
        stores.setdefault(row["task"], []).append(row)
    return [rows for rows in stores.values() if all(r["id"] in scored for r in rows)]


def _correlation(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    (row,) = table_one_from_rows(rows, CorrelationConfig(), metrics=("dtr_prefix",))
    lo, hi = row["auc_length_matched_ci"]
    return {**{k: row[k] for k in CORRELATION}, "auc_length_matched_lo": lo, "auc_length_matched_hi": hi}


def _control(stores: Sequence[Sequence[dict[str, Any]]], lensed: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The re-read prefix DTR against the store's own (the logit lens's row: the re-tokenization's cost)."""
    stored = np.array([r["dtr_prefix"] for rows in stores for r in rows], float)
    again = np.array([r["dtr_prefix"] for r in lensed], float)
    return {
        "control_equal": float(np.mean(np.abs(stored - again) < 1e-6)),
        "control_r": float(np.corrcoef(stored, again)[0, 1]),
    }


def model_rows(
    compact: Sequence[dict[str, Any]], lens_rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One model's rows: per lens, each fully scored store and (more than one) the stores pooled."""
    out = []
    names = sorted({r["lens_name"] for r in lens_rows}, key=_lens_order)
    for name in names:
        scored = {r["id"]: r for r in lens_rows if r["lens_name"] == name}
        lens = next(r["lens"] for r in lens_rows if r["lens_name"] == name)
        stores = _scored_stores(compact, scored)
        lensed = [with_lens(rows, scored) for rows in stores]
        votes = [v for rows, _ in lensed for v in store_votes(rows, VOTING, rules=("correct",))]
        for store, (rows, carried), vote in zip(stores, lensed, votes, strict=True):
            out.append(_row(name, lens, vote.row, rows, carried))
            if name == "logit":
                out[-1].update(_control([store], rows))
        if len(votes) > 1:
            (pooled,) = pooled_rows(votes, VOTING.seed)
            every = [{**r, "task": "pooled"} for rows, _ in lensed for r in rows]
            out.append(_row(name, lens, pooled, every, sum(c for _, c in lensed)))
            if name == "logit":
                out[-1].update(_control(stores, every))
    return out


def _lens_order(name: str) -> tuple[int, str]:
    return (LENS_ORDER.index(name) if name in LENS_ORDER else len(LENS_ORDER), name)


def _row(
    name: str, lens: str, vote: dict[str, Any], rows: Sequence[dict[str, Any]], carried: int
) -> dict[str, Any]:
    return {
        "model": vote["model"],
        "task": vote["task"],
        "lens_name": name,
        "lens": lens,
        "questions": vote["questions"],
        "responses": vote["responses"],
        "windows_retokenized": carried,
        "dtr_prefix_mean": float(np.mean([r["dtr_prefix"] for r in rows])),
        **{k: vote.get(k) for k in CONTRAST},
        "think_minus_random_p": vote.get("think_minus_random_p"),
        **_correlation(rows),
    }


def lens_table(data: Path) -> list[dict[str, Any]]:
    """The study's table from the files under ``data`` (every model with a ``lens-prefix-dtr-*.csv``)."""
    out = []
    for path in sorted(data.glob("lens-prefix-dtr-*.csv")):
        model = path.stem.removeprefix("lens-prefix-dtr-")
        compact = [r for p in sorted(data.glob(f"compact-{model}-*.csv")) for r in read_compact(p)]
        out += model_rows(compact, read_lens_rows(path))
    return out


def write_rows(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Rows as CSV (floats to 6 significant digits: what the tables are read to)."""
    return write_csv(path, [{k: _cell(v) for k, v in r.items()} for r in rows])


def _cell(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value
