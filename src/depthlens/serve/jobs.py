"""Running one request on a request thread: plain sampling, Think@n or the online policy, per prompt.

Think@n is ``studies.thinkn.think_at_n_live`` and the online policy ``voting.online.run_policy`` over
``studies.online.generate_batch`` — the code ``depthlens thinkn`` runs — on the request's own ``ServeBackend``;
answers are read by ``evals.answers`` (``extract_answer``, ``vote_key``). This module only wires them to the
request and records what each sample did.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from depthlens.config import OnlineConfig, VotingConfig
from depthlens.evals.answers import extract_answer, vote_key
from depthlens.sampling.backend import Paused, Trace
from depthlens.sampling.live import Watch
from depthlens.serve.depth import summary
from depthlens.serve.engines import Engine, ServeBackend, read_with
from depthlens.serve.job import Job
from depthlens.serve.stream import GroupStream, Push
from depthlens.serve.text import final_text
from depthlens.studies.generate import sample_seed
from depthlens.studies.online import generate_batch, rounded_response
from depthlens.studies.thinkn import response_from_trace, think_at_n_live
from depthlens.voting.online import SIGNALS, OnlineOutcome, run_policy, stop_point

FINISH_REASONS = {"eos": "stop", "stopped": "stop", "length": "length", "paused": "length"}


@dataclasses.dataclass
class Choice:
    index: int
    trace: Trace
    text: str
    finish_reason: str
    depthlens: dict[str, Any]
    top: list[list[tuple[int, float]]]


@dataclasses.dataclass
class Outcome:
    choices: list[Choice]
    prompt_tokens: int
    completion_tokens: int
    readout_tokens: int = 0  # tokens read out at every layer, over every sample (rejected ones included)


@dataclasses.dataclass
class _Context:
    engine: Engine
    job: Job
    tokenizer: Any
    cancel: threading.Event | None
    push: Push | None
    generated: int = 0
    readout: int = 0

    def backend(self, logprobs: int = 0) -> ServeBackend:
        return self.engine.backend(self.job.sampling, logprobs, self.cancel, self.job.depth.asked)

    def stream(self, first: int, push: Push | None, backend: ServeBackend) -> GroupStream:
        job = self.job
        readout = (self.engine.n_layers, job.depth.dtr) if job.depth.tokens else None
        logprobs = (job.logprobs, backend.top_logprobs) if job.logprobs is not None else None
        return GroupStream(self.tokenizer, job.stop, self.cancel, push, first, readout, logprobs)

    def describe(self, trace: Trace) -> dict[str, Any]:
        window = self.job.depth.online.window if self.job.depth.online else VotingConfig().deepconf_window
        depth = self.job.depth
        return summary(trace, self.engine.n_layers, depth.dtr, window, depth.tokens, self.tokenizer)

    def answer(self, trace: Trace) -> tuple[str | None, str | None]:
        """(the answer the trace states, its vote key), by the request's answer rules."""
        text = final_text(self.tokenizer, trace.token_ids, self.job.stop)
        found = extract_answer(text, self.job.depth.answers, finished=trace.finish in ("eos", "stopped"))
        return (found.text, vote_key(found.text)) if found else (None, None)

    def choice(self, index: int, trace: Trace, backend: ServeBackend, extra: dict[str, Any]) -> Choice:
        text = final_text(self.tokenizer, trace.token_ids, self.job.stop)
        reason = FINISH_REASONS.get(trace.finish, "stop")
        depth = {**read_with(self.engine), **self.describe(trace), **extra}
        return Choice(index, trace, text, reason, depth, backend.top_logprobs(trace))


def run_job(
    engine: Engine, job: Job, tokenizer: Any, cancel: threading.Event | None = None, push: Push | None = None
) -> Outcome:
    """Every prompt of ``job`` in turn; ``push`` gets the stream's events (``serve.stream``)."""
    ctx = _Context(engine, job, tokenizer, cancel, push)
    choices: list[Choice] = []
    for p, prompt in enumerate(job.prompts):
        if job.depth.think is not None:
            choices.append(_think(ctx, p, list(prompt)))
        elif job.depth.online is not None:
            choices.append(_online(ctx, p, list(prompt)))
        else:
            choices.extend(_sample(ctx, p, list(prompt)))
        if job.voted and push is not None:  # a vote is known only at the end: its text comes whole
            voted = choices[-1]
            push(
                {
                    "type": "delta",
                    "index": voted.index,
                    "text": voted.text,
                    "tokens": None,
                    "readout": None,
                    "logprobs": None,
                }
            )
            _push_end(push, voted)
    return Outcome(choices, sum(len(p) for p in job.prompts), ctx.generated, ctx.readout)


def _push_end(push: Push, choice: Choice) -> None:
    push(
        {
            "type": "end",
            "index": choice.index,
            "finish_reason": choice.finish_reason,
            "depthlens": choice.depthlens,
        }
    )


def _seeds(job: Job, p: int, indices: Sequence[int]) -> list[int]:
    return [sample_seed(job.seed, str(p), i) for i in indices]


def _sample(ctx: _Context, p: int, prompt: list[int]) -> list[Choice]:
    job = ctx.job
    backend = ctx.backend(job.logprobs or 0)
    stream = ctx.stream(p * job.n, ctx.push, backend)
    backend.watch = Watch(stream.on_step, stream.ends)
    try:
        traces = backend.start(prompt, _seeds(job, p, range(job.n))).traces
    finally:
        ctx.generated += backend.generated()
    stream.close(traces)
    ctx.readout += sum(len(t.divergence) for t in traces)
    choices = [ctx.choice(p * job.n + i, t, backend, {}) for i, t in enumerate(traces)]
    if ctx.push is not None:
        for choice in choices:
            _push_end(ctx.push, choice)
    return choices


class _Recorded:
    """A backend that remembers which responses were resumed (Think@n's kept ones)."""

    def __init__(self, inner: ServeBackend) -> None:
        self.inner = inner
        self.n_layers = inner.n_layers
        self.kept: list[int] = []

    def start(self, prompt_ids: Sequence[int], seeds: Sequence[int], stop_after: int | None = None) -> Paused:
        return self.inner.start(prompt_ids, seeds, stop_after)

    def resume(self, paused: Paused, keep: Sequence[int]) -> list[Trace]:
        self.kept = sorted(keep)
        return self.inner.resume(paused, keep)


def _think(ctx: _Context, p: int, prompt: list[int]) -> Choice:
    job, voting = ctx.job, ctx.job.depth.think
    assert voting is not None
    backend = ctx.backend()
    stream = ctx.stream(0, None, backend)
    backend.watch = Watch(stream.on_step, stream.ends)
    recorded = _Recorded(backend)
    answers: dict[int, tuple[str | None, str | None]] = {}

    def answer_key(trace: Trace) -> str | None:
        answers[id(trace)] = ctx.answer(trace)
        return answers[id(trace)][1]

    seeds = _seeds(job, p, range(voting.n))
    try:
        answer, traces, _ = think_at_n_live(recorded, prompt, seeds, voting, job.depth.dtr, answer_key)
    finally:
        ctx.generated += backend.generated()
    kept = set(recorded.kept)
    ctx.readout += sum(len(t.divergence) for t in traces)
    # stopped: rejected at ℓ while the engine still ran it; a rejected sample that had ended by itself (EOS, max
    # tokens or a stop string before ℓ) was not stopped and saved nothing
    stopped = [
        i for i, t in enumerate(traces) if i not in kept and t.finish == "paused" and backend.aborted(t)
    ]
    voters = [i for i in sorted(kept) if answers.get(id(traces[i]), (None, None))[1] == answer]
    chosen = voters[0] if voters else min(kept, default=0)
    samples = [
        _think_sample(ctx, backend, i, t, answers.get(id(t), (None, None)), (i in kept, i in stopped))
        for i, t in enumerate(traces)
    ]
    ended = [len(t) for t in traces if t.finish != "paused"]  # ran to their own end (kept or not)
    saved = _saved(ended, [backend.engine_tokens(traces[i]) for i in stopped], 0)
    think = {
        "n": voting.n,
        "eta": voting.eta,
        "prefix": voting.rank_prefix,
        "answer": answer,
        "voted": chosen,
        "kept": sorted(kept),
        "stopped": len(stopped),
        "tokens": backend.generated(),
        "tokens_saved": saved,
        "samples": samples,
    }
    return ctx.choice(p, traces[chosen], backend, {"think": think})


def _think_sample(
    ctx: _Context,
    backend: ServeBackend,
    i: int,
    t: Trace,
    answered: tuple[str | None, str | None],
    fate: tuple[bool, bool],
) -> dict[str, Any]:
    """Think@n's sample ``i`` as the response reports it: its prefix DTR, whether it was kept and whether the
    engine stopped it at ℓ (``fate``), its answer, the tokens of its trace and those the engine generated for
    it, OpenAI's finish reason and its text."""
    job, voting = ctx.job, ctx.job.depth.think
    assert voting is not None
    text, key = answered
    return {
        "index": i,
        "seed": t.seed,
        "prefix_dtr": response_from_trace(t, backend.n_layers, job.depth.dtr).prefix_dtr(voting.rank_prefix),
        "kept": fate[0],
        "stopped": fate[1],
        "answer": text,
        "vote_key": key,
        "tokens": len(t),
        "generated": backend.engine_tokens(t),
        # OpenAI's reasons only: a sample cut at ℓ has none (``kept`` / ``stopped`` say why it ended)
        "finish_reason": None if t.finish == "paused" else FINISH_REASONS.get(t.finish, "stop"),
        "text": final_text(ctx.tokenizer, t.token_ids, job.stop),
    }


def _saved(finished: Sequence[int], stopped: Sequence[int], unstarted: int) -> int:
    """Tokens not generated, estimated: each stopped sample (``stopped``: the tokens the engine generated for it)
    would have run to the mean length of those that ran to their end (``finished``), and each sample never
    started as long. A sample that ended by itself is in ``finished``, never in ``stopped``."""
    if not finished:
        return 0
    mean = sum(finished) / len(finished)
    return round(sum(max(0.0, mean - n) for n in stopped) + unstarted * mean)


def _online(ctx: _Context, p: int, prompt: list[int]) -> Choice:
    job, cfg = ctx.job, ctx.job.depth.online
    assert cfg is not None
    backend = ctx.backend()
    dtr, n_layers = job.depth.dtr, backend.n_layers
    seen: dict[int, tuple[Trace, str | None, str | None]] = {}

    def sample(indices: Sequence[int], tau: float | None) -> list[Any]:
        stream = ctx.stream(0, None, backend)
        per_token = tau is not None and not SIGNALS[cfg.signal].decides_at_prefix

        def ends(i: int, trace: Trace) -> bool:
            if stream.ends(i, trace):
                return True
            if not per_token or tau is None:  # per_token: τ is set and the signal is read per token
                return False
            return stop_point(rounded_response(trace, n_layers, dtr), tau, cfg) is not None

        backend.watch = Watch(stream.on_step, ends)
        traces, stops = generate_batch(backend, prompt, _seeds(job, p, indices), tau, cfg, dtr)
        out = []
        for i, trace, stop in zip(indices, traces, stops, strict=True):
            text, key = ctx.answer(trace) if stop is None else (None, None)
            seen[i] = (trace, text, key)
            out.append(dataclasses.replace(rounded_response(trace, n_layers, dtr), key=key))
        return out

    try:
        outcome = run_policy(cfg, sample)
    finally:
        ctx.generated += backend.generated()
    decisions: list[dict[str, Any]] = [d.to_dict() for d in outcome.decisions]
    ctx.readout += sum(len(trace.divergence) for trace, _, _ in seen.values())
    for d in decisions:
        trace, text, key = seen[d["index"]]
        d.update(
            seed=trace.seed,
            answer=text,
            vote_key=key,
            generated=backend.engine_tokens(trace),
            text=final_text(ctx.tokenizer, trace.token_ids, job.stop),
        )
    chosen, online = _online_entry(cfg, outcome, decisions, seen, backend)
    return ctx.choice(p, seen[chosen][0], backend, {"online": online})


def _online_entry(
    cfg: OnlineConfig,
    outcome: OnlineOutcome,
    decisions: list[dict[str, Any]],
    seen: dict[int, tuple[Trace, str | None, str | None]],
    backend: ServeBackend,
) -> tuple[int, dict[str, Any]]:
    """The sample an online run answers with (the first voter for the answer) and the response's ``online``
    entry: the policy's settings and decisions, what was stopped and the tokens that saved."""
    voters = [d["index"] for d in decisions if d["votes"] and d["key"] == outcome.answer]
    chosen = voters[0] if voters else min(d["index"] for d in decisions if d["votes"])
    # stopped: the policy stopped it and the engine was still running it (one that ended by itself saved nothing)
    for d in decisions:
        d["aborted"] = d["stopped_at"] is not None and backend.aborted(seen[d["index"]][0])
    finished = [d["tokens"] for d in decisions if not d["aborted"]]
    stopped = [d["generated"] for d in decisions if d["aborted"]]
    online = {
        **{k: v for k, v in cfg.to_dict().items()},
        "threshold": outcome.threshold,
        "stop": outcome.stop,
        "answer": outcome.answer,
        "voted": chosen,
        "started": outcome.started,
        "stopped": len(stopped),
        "tokens": backend.generated(),
        "tokens_saved": _saved(finished, stopped, cfg.max_n - outcome.started),
        "samples": decisions,
    }
    return chosen, online
