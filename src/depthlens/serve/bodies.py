"""Response bodies and stream chunks exactly as the OpenAI API shapes them, each choice with its ``depthlens``
object beside (a client that ignores it sees a plain OpenAI response)."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from typing import Any

from depthlens.models.tokens import token_bytes
from depthlens.serve.engines import Engine, read_with
from depthlens.serve.job import Job
from depthlens.serve.jobs import Choice, Outcome

LogprobRows = Sequence[tuple[int, float, Sequence[tuple[int, float]]]]  # (token id, log p, top-k (id, log p))


@dataclasses.dataclass(frozen=True)
class Envelope:
    """What every body and chunk of one response shares."""

    id: str
    created: int
    model: str
    chat: bool

    @classmethod
    def new(cls, model: str, chat: bool) -> Envelope:
        prefix = "chatcmpl" if chat else "cmpl"
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model, chat)

    def head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def request_depthlens(job: Job, engine: Engine) -> dict[str, Any]:
    """The response-level ``depthlens`` object: the settings every choice's values were computed with — the
    engine's dtype among them (a bfloat16 engine's depths differ from ``depthlens score``'s float32 ones by a few
    layers on some tokens)."""
    dtr = job.depth.dtr
    return {
        "backend": engine.name,
        **read_with(engine),
        "n_layers": engine.n_layers,
        "seed": job.seed,
        "g": dtr.g,
        "rho": dtr.rho,
        "deep_rule": dtr.deep_rule,
        "prefix": dtr.dtr_prefix_tokens,
        "readout_tokens": "all" if job.sampling.readout_tokens is None else job.sampling.readout_tokens,
        "answer_type": job.depth.answers.answer_type,
    }


def usage(outcome: Outcome) -> dict[str, int]:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }


def logprobs(tokenizer: Any, rows: LogprobRows, chat: bool, with_top: bool, start: int = 0) -> dict[str, Any]:
    """``logprobs`` of a choice (or of a chunk's tokens): chat's ``content`` list (each token's text and the
    bytes it stands for), or completions' columns."""
    ids = sorted({token for token, _, top in rows for token in (token, *(t for t, _ in top))})
    raw = dict(zip(ids, token_bytes(tokenizer, ids), strict=True)) if tokenizer is not None else {}

    def text(token: int) -> str:
        return raw[token].decode("utf-8", errors="replace") if token in raw else ""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        return {"token": text(token), "logprob": logprob, "bytes": list(raw.get(token, b""))}

    if chat:
        return {
            "content": [{**entry(t, p), "top_logprobs": [entry(u, q) for u, q in top]} for t, p, top in rows]
        }
    tokens = [text(token) for token, _, _ in rows]
    offsets, at = [], start
    for piece in tokens:
        offsets.append(at)
        at += len(piece)
    return {
        "tokens": tokens,
        "token_logprobs": [p for _, p, _ in rows],
        "top_logprobs": [{text(t): p for t, p in top} for _, _, top in rows] if with_top else None,
        "text_offset": offsets,
    }


def _choice_logprobs(tokenizer: Any, job: Job, choice: Choice) -> dict[str, Any] | None:
    if job.logprobs is None:
        return None
    trace, top = choice.trace, choice.top
    rows = [
        (t, p, top[j] if j < len(top) else [])
        for j, (t, p) in enumerate(zip(trace.token_ids, trace.log_prob, strict=True))
    ]
    return logprobs(tokenizer, rows, job.chat, job.logprobs > 0)


def response_body(env: Envelope, job: Job, outcome: Outcome, tokenizer: Any, top: dict[str, Any]) -> dict:
    """The whole response of a request that does not stream."""
    choices = []
    for choice in outcome.choices:
        body: dict[str, Any] = {"index": choice.index}
        if env.chat:
            body["message"] = {"role": "assistant", "content": choice.text}
        else:
            body["text"] = choice.text
        body.update(
            logprobs=_choice_logprobs(tokenizer, job, choice),
            finish_reason=choice.finish_reason,
            depthlens=choice.depthlens,
        )
        choices.append(body)
    return {
        **env.head(False),
        "choices": choices,
        "usage": usage(outcome),
        "system_fingerprint": None,
        "depthlens": top,
    }


def chunk(env: Envelope, event: dict[str, Any], tokenizer: Any, job: Job, first: bool) -> dict[str, Any]:
    """One stream chunk from a ``serve.stream`` event (``first``: the choice's first chunk, which names the
    role in chat)."""
    choice: dict[str, Any] = {"index": event["index"]}
    if event["type"] == "end":
        if env.chat:
            choice["delta"] = {"role": "assistant", "content": ""} if first else {}
        else:
            choice["text"] = ""
        choice.update(logprobs=None, finish_reason=event["finish_reason"], depthlens=event["depthlens"])
        return {**env.head(True), "choices": [choice]}
    if env.chat:  # no content key for a chunk of no text (it carries depthlens values only)
        text = {"content": event["text"]} if event["text"] or first else {}
        choice["delta"] = {"role": "assistant", **text} if first else text
    else:
        choice["text"] = event["text"]
    rows = event.get("logprobs")
    with_top = bool(job.logprobs)
    choice["logprobs"] = logprobs(tokenizer, rows, env.chat, with_top) if rows else None
    choice["finish_reason"] = None
    extra = {k: event[k] for k in ("tokens", "readout") if event.get(k) is not None}
    if extra:
        choice["depthlens"] = extra
    return {**env.head(True), "choices": [choice]}


def usage_chunk(env: Envelope, outcome: Outcome) -> dict[str, Any]:
    return {**env.head(True), "choices": [], "usage": usage(outcome)}
