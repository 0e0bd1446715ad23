"""The ``Watch`` a request puts on its engine calls (``sampling.live``): cancel when the client has gone, end a
sample at a stop string, and — for a stream — turn each step's new tokens into events.

It runs on the thread that steps the engine, so every event is a copy (plain lists), never a view of a trace
that is still growing. An event is one of:

- ``{"type": "delta", "index": choice, "text": str, "tokens": {...} | None, "readout": {...} | None,
  "logprobs": [...] | None}`` — the new text, and with ``depthlens.tokens`` the new tokens' final-layer values
  (``tokens.offset`` = the first token's position) and the new read-out rows (``readout.offset``; with
  ``depthlens.layer_top_k``, their ``layer_top_*`` too, with ``layer_target`` / ``track`` / ``layer_entropy`` their
  ``layer_target_*`` / ``layer_track_*`` / ``layer_entropy``);
- ``{"type": "end", "index": choice, "finish_reason": str, "depthlens": {...}}`` (pushed by ``jobs``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from depthlens.config import DTRConfig
from depthlens.sampling.backend import Trace
from depthlens.sampling.live import GenerationCancelled
from depthlens.serve.depth import layer_top, layer_values, readout_columns, token_columns
from depthlens.serve.text import TextStream

Push = Callable[[dict[str, Any]], None]
TopLogprobs = Callable[[Trace], list[list[tuple[int, float]]]]


class GroupStream:
    """Per-step view of one group of samples (the choices ``first``, ``first + 1``, …)."""

    def __init__(
        self,
        tokenizer: Any,
        stop: Sequence[str],
        cancel: threading.Event | None,
        push: Push | None = None,
        first: int = 0,
        readout: tuple[int, DTRConfig] | None = None,
        logprobs: tuple[int, TopLogprobs] | None = None,
    ) -> None:
        """``readout``: (L, dtr) to send per-token values; ``logprobs``: (k, the backend's top-k lookup) to send
        log-probabilities."""
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.cancel = cancel
        self.push = push
        self.first = first
        self.readout = readout
        self.logprobs = logprobs
        self.texts: dict[int, TextStream] = {}
        self.sent: dict[int, tuple[int, int]] = {}  # trace index → (tokens, rows) sent

    def text(self, i: int) -> TextStream:
        if i not in self.texts:
            self.texts[i] = TextStream(self.tokenizer, self.stop)
        return self.texts[i]

    def on_step(self, traces: Sequence[Trace]) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise GenerationCancelled()
        if self.push is None and not self.stop:
            return
        for i, trace in enumerate(traces):
            tokens, rows = self.sent.get(i, (0, 0))
            if len(trace) == tokens and len(trace.divergence) == rows:
                continue
            piece = self.text(i).feed(trace.token_ids) if len(trace) > tokens else ""
            if self.push is not None:
                self._send(i, trace, piece, tokens, rows)
            self.sent[i] = (len(trace), len(trace.divergence))

    def ends(self, i: int, trace: Trace) -> bool:
        return i in self.texts and self.texts[i].stopped

    def close(self, traces: Sequence[Trace]) -> None:
        """The last of each trace (text held back, rows read out after its last token) once it has ended."""
        for i, trace in enumerate(traces):
            tokens, rows = self.sent.get(i, (0, 0))
            piece = self.text(i).feed(trace.token_ids, final=True)
            if self.push is not None and (piece or len(trace) > tokens or len(trace.divergence) > rows):
                self._send(i, trace, piece, tokens, rows)
            self.sent[i] = (len(trace), len(trace.divergence))

    def _send(self, i: int, trace: Trace, piece: str, tokens: int, rows: int) -> None:
        assert self.push is not None
        event: dict[str, Any] = {
            "type": "delta",
            "index": self.first + i,
            "text": piece,
            "tokens": None,
            "readout": None,
            "logprobs": None,
        }
        if self.readout is not None:
            n_layers, dtr = self.readout
            if len(trace) > tokens:
                columns = token_columns(trace, tokens, len(trace), self.tokenizer)
                event["tokens"] = {"offset": tokens, **columns}
            if len(trace.divergence) > rows:
                new = trace.divergence[rows:]
                columns = readout_columns(new, n_layers, dtr)
                asked = {**layer_top(trace, self.tokenizer, rows), **layer_values(trace, rows)}
                event["readout"] = {"offset": rows, **columns, **asked}
        if self.logprobs is not None and len(trace) > tokens:
            k, tops = self.logprobs
            top = tops(trace)
            event["logprobs"] = [
                (trace.token_ids[j], trace.log_prob[j], top[j] if k and j < len(top) else [])
                for j in range(tokens, len(trace))
            ]
        if piece or any(event[k] is not None for k in ("tokens", "readout", "logprobs")):
            self.push(event)  # not a chunk of nothing (an end-of-turn token decodes to no text)
