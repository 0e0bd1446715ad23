"""A sample store's records against each other and against their store (issue 51): the checks ``stores.validate``
cannot make one value at a time.

A record's values are checked for their types (a count is a whole number, not ``"16"``; ``correct`` is true or
false), then for agreeing with each other — ``token_count`` is the number of ``token_ids`` and of every per-token
value, the id is ``question#sample``, the ``deep`` flags are the settling depths at or past the deep layer, ``dtr``
is the flags' share — and with the store: the question is one of the manifest's, the sample index is below its
pool, every text encodable as UTF-8 (a lone surrogate is not). Token ids against the vocabulary the manifest
records (``vocab_rows``) and each layer's top-k against itself are ``stores.meaning``'s (every kind of store).
``read_responses`` runs ``record_problem`` on every record, so every reader,
``depthlens check`` included, refuses the same records. ``wrong_fields`` checks the manifest fields readers rely on.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard

import numpy as np

from depthlens.config import DTRConfig
from depthlens.errors import DepthlensError
from depthlens.metrics import layer_names as names

VOCAB = "vocab_rows"
"""The manifest field holding the model's vocabulary rows: every stored token id is below it (``stores.meaning``)."""

# Ratios and means are stored as computed, rounded to 5 decimals, or as float16 (spacing ~5e-4 below 1): a
# difference past this is damage.
_TOLERANCE = 1e-3


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def unencodable(value: object, field: str = "") -> str | None:
    """The field (dotted path) of the first text in ``value`` that UTF-8 cannot encode (a lone surrogate such as
    ``"\\ud800"``, which JSON can spell but no file or HTTP body can carry), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return field or "text"
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list) and not _numbers(value):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if isinstance(item, (str, dict, list)):
            found = unencodable(item, f"{field}.{key}" if field else str(key))
            if found:
                return found
    return None


def _numbers(values: list[Any]) -> bool:
    """A list of numbers or of rows of numbers (token ids, per-token values, divergence rows): no text in it. A
    record's lists hold one kind each, so the first item says."""
    first = values[0] if values else 0
    if isinstance(first, list):
        first = first[0] if first else 0
    return isinstance(first, (int, float)) or first is None


_escaping: contextvars.ContextVar[bool] = contextvars.ContextVar("escaping_text", default=False)


@contextlib.contextmanager
def escaping_text() -> Iterator[None]:
    """Within: a stored text UTF-8 cannot encode is no fault (``depthlens export`` reads so: it writes such a text
    as JSON escapes, ``\\ud800``, which every JSON reader turns back into the same text)."""
    token = _escaping.set(True)
    try:
        yield
    finally:
        _escaping.reset(token)


def text_problem(record: dict[str, Any]) -> str | None:
    """A stored text no file can be written with, named by its field (none while ``escaping_text``)."""
    field = None if _escaping.get() else unencodable(record)
    if field is None:
        return None
    return (
        f"{field} holds a lone surrogate (text UTF-8 cannot encode, e.g. \\ud800): it was edited outside "
        "depthlens (`depthlens export` writes the store with it escaped, as JSON \\ud800)"
    )


def identity_problem(record: dict[str, Any], manifest: dict[str, Any]) -> str | None:
    """A record's id, question, sample index and seed against each other and the store's questions and pool."""
    rid, qid, sample = record.get("id"), record.get("question_id"), record.get("sample")
    if not isinstance(rid, str) or not isinstance(qid, str) or not _whole(sample):
        return f"id {rid!r}, question_id {qid!r}, sample {sample!r}: not text, text and a whole number"
    if record.get("status") not in ("ok", "failed"):
        return f"status {record.get('status')!r}, not 'ok' or 'failed'"
    questions = manifest.get("questions", [])
    if qid not in questions:
        return (
            f"question_id {qid!r} is none of the store's {len(questions)} questions (its manifest lists them)"
        )
    pool = manifest.get("pool")
    if _whole(pool) and not 0 <= sample < pool:
        return f"sample {sample} is outside the store's pool of {pool} (0..{pool - 1})"
    mismatch = id_problem(record)
    if mismatch:
        return mismatch
    seed = record.get("seed")
    if seed is not None and not (_whole(seed) and seed >= 0):
        return f"seed {seed!r}, not a whole number ≥ 0"
    return None


def id_problem(record: dict[str, Any]) -> str | None:
    """A record's id against its own question_id and sample (``question#sample``), where those are of their types:
    checked before ids are compared across records, so an edited id is named where it is, not as a repeat."""
    rid, qid, sample = record.get("id"), record.get("question_id"), record.get("sample")
    if isinstance(rid, str) and isinstance(qid, str) and _whole(sample) and rid != f"{qid}#{sample}":
        return f"id {rid!r} disagrees with question_id {qid!r} and sample {sample} (it should be '{qid}#{sample}')"
    return None


def _length(value: object) -> int | None:
    return len(value) if isinstance(value, list) else None


def tokens_problem(record: dict[str, Any], manifest: dict[str, Any]) -> str | None:
    """A usable record's token count, token ids and per-token values against each other and the vocabulary."""
    from depthlens.sampling.backend import PER_TOKEN

    count = record.get("token_count")
    if not _whole(count):
        return f"token_count {count!r}, not a whole number"
    ids = record.get("token_ids")
    if isinstance(ids, list) and len(ids) != count:
        return f"token_count {count} for {_length(ids)} token_ids"
    for field in PER_TOKEN:
        n = _length(record.get(field))
        if field in record and n != count:
            return f"{field} holds {n} values for token_count {count}"
    correct = record.get("correct")
    if not isinstance(correct, bool) and correct is not None:
        return f"correct {correct!r}, not true or false"
    return None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _differs(stored: object, derived: float | None) -> bool:
    if derived is None:  # no read-out tokens: no ratio
        return stored is not None
    if not isinstance(stored, (int, float)) or isinstance(stored, bool):
        return True
    return not math.isclose(float(stored), derived, abs_tol=_TOLERANCE)


def depth_problem(record: dict[str, Any], manifest: dict[str, Any]) -> str | None:
    """The depth a record carries against itself: one settling depth and one flag per read-out token, each flag
    the settling depth at or past the deep layer (``metrics.dtr.deep_threshold`` with the manifest's ``dtr``),
    ``dtr`` / ``dtr_prefix`` the flags' share, ``mean_settling_depth`` the depths' mean. A store from before
    records carried depth has none of these (nothing to compare)."""
    settling, deep, rows = record.get("settling_depth"), record.get("deep"), record.get("divergence")
    if not isinstance(settling, list) or not isinstance(deep, list):
        return None
    if (isinstance(rows, list) and len(settling) != len(rows)) or len(deep) != len(settling):
        return (
            f"{len(settling)} settling depths and {len(deep)} deep flags for {_length(rows)} divergence rows"
        )
    if not all(isinstance(flag, bool) for flag in deep) or not all(_whole(c) for c in settling):
        return "deep flags that are not true/false, or settling depths that are not whole numbers"
    dtr, n_layers = manifest.get("dtr"), manifest.get("n_layers")
    if isinstance(dtr, dict) and _whole(n_layers) and isinstance(dtr.get("rho"), (int, float)):
        from depthlens.metrics.dtr import deep_threshold

        first = deep_threshold(n_layers, float(dtr["rho"]), dtr.get("deep_rule", "spec"))
        for t, (c, flag) in enumerate(zip(settling, deep, strict=True)):
            if flag != (c >= first):
                return (
                    f"token {t}: deep is {str(flag).lower()} for settling depth {c}, but the deep layer is {first} "
                    f"(flags are settling depth ≥ {first})"
                )
    depth = manifest.get("depth")
    prefix = depth.get("prefix") if isinstance(depth, dict) else None
    derived = {
        "dtr": _mean([float(f) for f in deep]),
        "dtr_prefix": _mean([float(f) for f in (deep[:prefix] if _whole(prefix) else deep)]),
        "mean_settling_depth": _mean([float(c) for c in settling]),
    }
    for field, value in derived.items():
        if field in record and _differs(record[field], value):
            return f"{field} {record[field]!r} disagrees with its flags and depths (they give {value!r})"
    return None


def layer_top_problem(record: dict[str, Any], manifest: dict[str, Any]) -> str | None:
    """A store that kept each layer's top-k (its manifest's ``readout.layer_top_k``) holds ``layer_top_ids`` and
    ``layer_top_probs`` in every usable record whose divergence rows were read; a store that asked for none holds
    none. Their shape and values — [T][L][K], K distinct ids below the vocabulary, probabilities descending and
    summing to at most 1 — are ``stores.meaning``'s, checked alike in every kind of store."""
    ids, probs = record.get("layer_top_ids"), record.get("layer_top_probs")
    readout = manifest.get("readout")
    k = readout.get("layer_top_k", 0) if isinstance(readout, dict) else 0
    if ids is None and probs is None:  # missing only where the rows they go with were read (not a light read)
        read = "divergence" in record and record.get("token_count")
        return f"no layer_top_ids for layer_top_k {k}" if k and read else None
    if ids is None or probs is None:
        held, lacking = (
            ("layer_top_probs", "layer_top_ids") if ids is None else ("layer_top_ids", "layer_top_probs")
        )
        return f"{held} without {lacking}"
    return None


def expected_per_layer(manifest: dict[str, Any]) -> list[str]:
    """The per-layer fields every record of a store holds, from its manifest's ``readout`` (``layer_target``,
    ``track``, ``layer_entropy``) and ``layer_stats`` (``metrics.layer_quantities``)."""
    readout = manifest.get("readout")
    readout = readout if isinstance(readout, dict) else {}
    fields = []
    if readout.get("layer_target"):
        fields += [names.TARGET_LOGPROBS, names.TARGET_RANKS]
    if readout.get("track"):
        fields += [names.TRACK_LOGPROBS, names.TRACK_RANKS]
    if readout.get("layer_entropy"):
        fields.append(names.ENTROPY)
    stats = manifest.get("layer_stats")
    return fields + [names.STAT_PREFIX + str(n) for n in (stats if isinstance(stats, dict) else {})]


def per_layer_problem(record: dict[str, Any], manifest: dict[str, Any]) -> str | None:
    """The per-layer quantities against the store: each field its manifest asks for present, with one row per
    read-out token (as the divergence rows), and the tracked ids below ``vocab_rows``. Their values and row shapes
    are ``stores.validate``'s ranges (``per_layer_bounds``), checked on every read of either store kind."""
    rows = record.get("divergence")
    read = isinstance(rows, list) and len(rows) > 0  # a light read, or no read-out token, holds no rows
    for field in expected_per_layer(manifest):
        value = record.get(field)
        if value is None:
            if read:
                return f"no {field}, which the manifest's readout asks of every record"
            continue
        held = len(value) if isinstance(value, (list, np.ndarray)) else None
        if isinstance(rows, list) and held != len(rows):
            return f"{field} holds {held} rows for {len(rows)} read-out tokens (its divergence rows)"
    readout = manifest.get("readout")
    readout = readout if isinstance(readout, dict) else {}
    track, vocab = readout.get("track"), manifest.get(VOCAB)
    if isinstance(track, list) and _whole(vocab):
        past = [i for i in track if not (_whole(i) and 0 <= i < vocab)]
        if past:
            return f"the manifest's readout.track holds {past[0]!r}, not a token id below the vocabulary of {vocab}"
    return None


def record_problem(record: dict[str, Any], manifest: dict[str, Any]) -> str | None:
    """What is wrong with one record of a sample store beyond its ranges (see the module), or None."""
    problem = text_problem(record) or identity_problem(record, manifest)
    if problem is None and record.get("status") == "ok":
        problem = (
            tokens_problem(record, manifest)
            or depth_problem(record, manifest)
            or layer_top_problem(record, manifest)
            or per_layer_problem(record, manifest)
        )
    return problem


def wrong_fields(manifest: dict[str, Any]) -> list[str]:
    """The fields of a sample store's manifest that readers rely on and that are missing or of the wrong type
    (a DTR setting out of its range named as the manifest's field, e.g. ``dtr.g nan``, not as ``--g``)."""
    kinds = {"n_layers": int, "questions": list, "pool": int, "dtr": dict, "model": str}
    wrong = [k for k, kind in kinds.items() if not isinstance(manifest.get(k), kind)]
    if "questions" not in wrong and not all(isinstance(q, str) for q in manifest["questions"]):
        wrong.append("questions")  # question ids key the pools: strings only
    readout = manifest.get("readout", {})
    also = readout.get("also", []) if isinstance(readout, dict) else None
    if (
        not isinstance(readout, dict)
        or not isinstance(readout.get("divergence", ""), str)
        or not (isinstance(also, list) and all(isinstance(k, str) for k in also))
    ):
        wrong.append("readout")
    if "dtr" not in wrong:
        try:  # named as the manifest's field, not as the option (--g) that sets it on a command line
            DTRConfig.from_dict(manifest["dtr"])
        except (DepthlensError, TypeError, ValueError) as exc:
            wrong.append(_dtr_fault(manifest["dtr"], str(exc)))
    return wrong


def _dtr_fault(dtr: dict[str, Any], said: str) -> str:
    """The manifest's ``dtr`` field a DTRConfig refused, as ``dtr.g nan (must be …)``."""
    found = re.search(r"DTRConfig\.(\w+)", said)
    reason = re.search(r": (must [^(;]*)", said)
    if found is None:
        return "dtr"
    key = found.group(1)
    return f"dtr.{key} {dtr.get(key)!r}" + (f" ({reason.group(1).strip()})" if reason else "")
