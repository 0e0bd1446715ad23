"""One response (or scored record) as the page shows it: readable tokens, each token's settling depth and deep
flag, the ``[T × L]`` divergences, and the per-token values the store holds — read from its one row group.

Settling depths and deep flags come from the stored divergences with the store's g, ρ and deep rule through
``metrics.dtr`` (the functions every reader uses); a score store written with ``--tokens`` stores them, and
those are shown. Token labels are ``models.tokens.token_texts`` (``␣`` a space, ``↵`` a newline, ``⟨e2⟩`` a byte
of a character split across tokens): a score store stores them; for a sample store the tokenizer of the
manifest's model is loaded (never downloaded) in the background when the page opens.

Where a record holds each layer's top-k (``layer_top_ids`` / ``layer_top_probs``, ``--layer-top-k K``), they are
sent too, with a label for each distinct token id among them (the same ``token_texts``): the page lists a heatmap
cell's top-k and draws the logit lens (tokens × layers, each cell's top-1). A record without them says how to get
them. Where it holds the target trajectory (``layer_target_logprobs`` / ``layer_target_ranks``, ``layer_target``),
the cell's list also says the read-out token's own probability and rank at that layer.
"""

from __future__ import annotations

import base64
import math
import re
import threading
from typing import Any

import numpy as np
import torch

from depthlens.errors import DepthlensError
from depthlens.metrics.dtr import deep_flags, deep_threshold, settling_depth
from depthlens.metrics.layer_names import TARGET_LOGPROBS, TARGET_RANKS
from depthlens.view.store import CUBES, ViewStore

PER_TOKEN = ("log_prob", "entropy", "self_certainty", "confidence", "tcb", "v_eff", "margin", "perplexity")
_BYTE = re.compile(r"⟨[0-9a-f]{2}⟩")
_SPACES = set("␣↵⇥␍")
_PER_RECORD = ("token_ids", "tokens", "divergence", "settling_depth", "deep")
NO_LAYER_TOP = (
    "this record holds no layer predictions: write the store with --layer-top-k K (generate, or score --tokens; "
    "e.g. --layer-top-k 5) to keep each layer's K most probable tokens, then click a heatmap cell or open the "
    "logit lens"
)
_TARGET = (TARGET_LOGPROBS, TARGET_RANKS)  # the read-out token's own log p and rank at every layer
_HEAVY = {
    *CUBES,
    *_TARGET,
    "text",
    "token_ids",
    "prompt_ids",
    "tokens",
    "divergence",
    "settling_depth",
    "deep",
    "answer_history",
}


def token_kind(label: str) -> str:
    """How a token label reads: ``space`` (whitespace only), ``byte`` (holds part of a character), ``empty``
    (decodes to nothing) or ``text``."""
    if label == "∅":
        return "empty"
    if _BYTE.search(label):
        return "byte"
    if label and all(c in _SPACES for c in label):
        return "space"
    return "text"


class Labeller:
    """Readable labels for a sample store's token ids: its model's tokenizer, loaded once in the background."""

    def __init__(self, model: str | None) -> None:
        self.model = model
        self._tokenizer: Any = None
        self.note: str | None = None
        self.ready = threading.Event()
        self._started = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Load the tokenizer on a daemon thread, once (importing transformers takes seconds of CPU: the
        explorer starts it after the first page has been served, so that page does not wait behind it)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self.load, name="view-tokenizer", daemon=True).start()

    def load(self) -> None:
        try:
            if self.model:
                from depthlens.models.load import load_tokenizer
                from depthlens.models.locate import locate

                locate(self.model)  # a name that points nowhere fails here, without importing transformers
                self._tokenizer = load_tokenizer(self.model)
        except (DepthlensError, ImportError, OSError, ValueError, RuntimeError) as exc:
            self.note = f"({exc})"
        if self._tokenizer is None:
            self.note = (
                f"no tokenizer of {self.model or 'the model'} is available here {self.note or ''}; tokens are "
                "shown by id (install the model to see them as text)"
            )
        self.ready.set()

    def labels(self, ids: list[int]) -> list[str]:
        self.start()
        self.ready.wait(timeout=120)
        if self._tokenizer is None:
            return [f"#{i}" for i in ids]
        from depthlens.models.tokens import token_texts

        return token_texts(self._tokenizer, ids)

    def text(self, ids: list[int]) -> str | None:
        """``ids`` decoded as the model read them (special tokens and the chat template's markup kept), or None
        without a tokenizer."""
        self.start()
        self.ready.wait(timeout=120)
        if self._tokenizer is None:
            return None
        return str(self._tokenizer.decode(ids, skip_special_tokens=False))


def floats(values: Any, digits: int = 6) -> list[float | None]:
    """Per-token floats for JSON: rounded to ``digits`` (a stored float32 shows the decimals it was written
    with), non-finite ones as null."""
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    return [v if math.isfinite(v) else None for v in np.round(array, digits).tolist()]


def scalar(value: Any) -> Any:
    """A light field for JSON (a non-finite float as null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def response_detail(store: ViewStore, index: int, labeller: Labeller) -> dict[str, Any]:
    """Everything the response page draws for record ``index``."""
    if store.kind == "tcb":
        return trace_detail(store.read(index))
    # the light fields are in memory already; read only the per-token columns (a row group holds many records)
    record = {
        **store.records[index],
        **store.read(index, ["text", "prompt_ids", *_PER_RECORD, *PER_TOKEN, *CUBES, *_TARGET]),
    }
    ids = [int(i) for i in _list(record.get("token_ids"))]
    table = record.get("divergence")
    matrix = np.zeros((0, store.n_layers or 0), np.float32) if table is None else np.array(table, np.float32)
    n_layers = int(matrix.shape[1]) if matrix.ndim == 2 and matrix.shape[1] else int(store.n_layers or 0)
    dtr = store.dtr
    if "settling_depth" in record and "deep" in record:  # a score store with --tokens: as it was scored
        depth = [int(d) for d in _list(record["settling_depth"])]
        deep = [bool(d) for d in _list(record["deep"])]
    else:
        settled = settling_depth(torch.from_numpy(matrix.reshape(-1, max(n_layers, 1))), dtr.g)
        depth = settled.tolist()
        deep = deep_flags(settled, n_layers, dtr.rho, dtr.deep_rule).tolist()
    stored = "tokens" in record  # a score store keeps its labels; a sample store's come from the tokenizer
    labels = [str(t) for t in _list(record["tokens"])] if stored else labeller.labels(ids) if ids else []
    notes = [labeller.note] if labeller.note and "tokens" not in record and ids else []
    if table is None:
        notes.append("this record has no per-token divergences (a score store written without --tokens)")
    top = layer_top(record, len(depth), n_layers, labeller)
    if top is not None and labeller.note and labeller.note not in notes:  # its ids shown as #id
        notes.append(labeller.note)
    return {
        "id": str(record.get("id")),
        "kind": store.kind,
        "fields": {
            k: scalar(v) for k, v in record.items() if k not in _HEAVY and not isinstance(v, np.ndarray)
        },
        "text": record.get("text"),
        "tokens": labels,
        "token_kinds": [token_kind(t) for t in labels],
        "token_ids": ids,
        "n_layers": n_layers,
        "readout": len(depth),
        "settling_depth": depth,
        "deep": deep,
        "deep_from": deep_threshold(n_layers, dtr.rho, dtr.deep_rule) if n_layers else None,
        "g": dtr.g,
        "unit": _unit(store),
        # [R × L] row-major float32, base64: the stored values exactly, without 30 float reprs a token in JSON
        "divergence": base64.b64encode(np.ascontiguousarray(matrix, dtype="<f4").tobytes()).decode("ascii"),
        "per_token": {k: floats(record[k]) for k in PER_TOKEN if isinstance(record.get(k), np.ndarray)},
        "notes": notes,
        "prompt": _prompt(store, record, labeller),
        "layer_top": top,
        "layer_top_missing": NO_LAYER_TOP,
        "layer_target": layer_target(record, len(depth), n_layers),
    }


def layer_top(record: dict[str, Any], rows: int, n_layers: int, labeller: Labeller) -> dict[str, Any] | None:
    """Each read-out token's top-k at every layer for the page: K, the ids [R × L × K] as little-endian int32 and
    the probabilities as float32 (base64, row-major), and a label for each distinct id; None where the record
    holds none (or not one row per read-out token and layer, which the store's readers refuse)."""
    if record.get("layer_top_ids") is None or record.get("layer_top_probs") is None:
        return None
    ids, probs = np.asarray(record["layer_top_ids"]), np.asarray(record["layer_top_probs"])
    if ids.ndim != 3 or ids.shape != probs.shape or ids.shape[:2] != (rows, n_layers) or not ids.size:
        return None
    distinct = np.unique(ids).tolist()
    return {
        "k": int(ids.shape[2]),
        "ids": base64.b64encode(np.ascontiguousarray(ids, dtype="<i4").tobytes()).decode("ascii"),
        "probs": base64.b64encode(np.ascontiguousarray(probs, dtype="<f4").tobytes()).decode("ascii"),
        "texts": dict(zip(map(str, distinct), labeller.labels(distinct), strict=True)),
    }


def layer_target(record: dict[str, Any], rows: int, n_layers: int) -> dict[str, Any] | None:
    """The read-out token's own log-probability (nats) and rank (0 = most probable) at every layer for the page:
    [R × L] float32 and int32, little-endian, base64; None where the record holds none (or not [R × L])."""
    if record.get(TARGET_LOGPROBS) is None or record.get(TARGET_RANKS) is None:
        return None
    logprobs, ranks = np.asarray(record[TARGET_LOGPROBS]), np.asarray(record[TARGET_RANKS])
    if logprobs.shape != (rows, n_layers) or ranks.shape != logprobs.shape or not logprobs.size:
        return None
    return {
        "logprobs": base64.b64encode(np.ascontiguousarray(logprobs, dtype="<f4").tobytes()).decode("ascii"),
        "ranks": base64.b64encode(np.ascontiguousarray(ranks, dtype="<i4").tobytes()).decode("ascii"),
    }


def _prompt(store: ViewStore, record: dict[str, Any], labeller: Labeller) -> dict[str, Any] | None:
    """What the model was given before the response: a sample store's prompt ids as the tokenizer decodes them
    (the chat template included), else its question's text; None for a store that keeps no prompt (a score
    store holds only the scored completion)."""
    ids = [int(i) for i in _list(record.get("prompt_ids"))]
    decoded = labeller.text(ids) if ids else None
    if decoded is not None:
        return {"text": decoded, "tokens": len(ids), "source": "prompt"}
    question = store.questions.get(str(record.get("question_id")))
    if question is not None and question.text:
        return {"text": question.text, "tokens": len(ids) or None, "source": "question"}
    return None


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value.tolist() if isinstance(value, np.ndarray) else list(value)


def _unit(store: ViewStore) -> str:
    """The divergence's unit, as the readout recorded it (JSD in bits by default)."""
    readout = store.manifest.get("readout")
    kind = readout.get("divergence", "jsd") if isinstance(readout, dict) else "jsd"
    return {"jsd": "bits", "jsd-nat": "nats", "kl": "nats", "cosine": "1 − cos"}.get(str(kind), str(kind))


def trace_detail(record: dict[str, Any]) -> dict[str, Any]:
    """A ``tcb trace`` generation: each token's δ (TCB), V_eff and perplexity; tokens shaded by log δ (light:
    small, constrained) and its sharp δ drops at low perplexity marked. No layers: the study reads out none."""
    from depthlens.models.tokens import readable

    result = record.get("rows") or {}
    rows = [r for r in result.get("rows", []) if isinstance(r, dict)]
    labels = [readable(str(r.get("token", "")).encode("utf-8")) for r in rows]
    delta = np.log10(np.clip(np.asarray([r.get("tcb", np.nan) for r in rows], np.float64), 1e-30, None))
    low, high = (float(np.nanmin(delta)), float(np.nanmax(delta))) if len(delta) else (0.0, 1.0)
    shade = (delta - low) / (high - low) if high > low else np.zeros_like(delta)
    summary = result.get("summary") or {}
    return {
        "id": str(record.get("id")),
        "kind": "tcb",
        "fields": {k: scalar(v) for k, v in summary.items() if not isinstance(v, dict | list)},
        "text": summary.get("text"),
        "tokens": labels,
        "token_kinds": [token_kind(t) for t in labels],
        "token_ids": [],
        "n_layers": 0,
        "readout": 0,
        "settling_depth": [],
        "deep": [],
        "deep_from": None,
        "g": None,
        "unit": None,
        "divergence": "",
        "per_token": {k: floats([r.get(k, np.nan) for r in rows]) for k in ("tcb", "v_eff", "perplexity")},
        "shade": floats(shade, 4),
        "shade_label": f"δ (TCB), log scale: light 10^{round(low, 1) + 0.0:g}, dark 10^{round(high, 1) + 0.0:g}",
        "marked": [bool(r.get("sharp_drop")) for r in rows],
        "mark_label": "a sharp δ drop at low perplexity",
        "notes": ["a TCB trace reads out no layers: tokens are shaded by their δ, not by a settling depth"],
    }
