"""Many callers on one vLLM engine: one thread steps it for all of them (continuous batching).

``EngineSession`` owns an ``LLMEngine`` and a thread that steps it. Callers (a server's request threads) submit
*groups* — the n responses of one prompt, one engine request each (``n=1``, the response's own seed, token-id
prompt, prefix caching) — and wait; the engine batches every running request of every group at each step. After
each step the thread moves the new tokens, vLLM's raw log p (``logprobs``), the distribution scores recorded by
the ``TokenScores`` logits processor (``sampling.vllm.scores``) and the divergence rows the engine's worker read
out of the same forward pass (``sampling.vllm.depth.EngineDepth``: one copy of the weights) into each response's
``Trace``, then calls the group's ``Watch`` (stream, stop strings, per-token policy stops).

Two phases without re-submission, as ``EngineGenerator`` runs them (docs/architecture.md): a group with
``pause_at`` = ℓ shows each trace only up to ℓ tokens; once every response has ℓ tokens (or has ended) the group
is *paused*, its caller is woken, and the stepping thread waits (``decision_timeout``) for the caller's decision
before it steps again — so the rejected responses are aborted in the engine at exactly ℓ tokens and the kept ones
go on with their random streams never restarted. A caller slower than the timeout costs its rejected responses a
few tokens (counted in ``generated``), never a wrong trace.

``SessionBackend`` (``sampling.vllm.requests``) is the ``GenerationBackend`` a caller uses on top of a session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from depthlens.errors import InputError
from depthlens.sampling.backend import Finish, Trace
from depthlens.sampling.live import GenerationCancelled
from depthlens.sampling.vllm.depth import EngineDepth
from depthlens.sampling.vllm.engine import EngineError, readout_capture, sampling_params
from depthlens.sampling.vllm.groups import Group, GroupSpec, Sample, complete, extend, rows_done

_TAGS = itertools.count()  # engine request ids unique in this process


class EngineSession:
    """One ``LLMEngine`` stepped by one thread for every group submitted to it (see the module docstring)."""

    def __init__(
        self,
        engine: Any,
        depth: EngineDepth,
        end_ids: Sequence[int],
        n_layers: int,
        decision_timeout: float = 5.0,
    ) -> None:
        from depthlens.sampling.vllm import scores as vllm_scores

        if not vllm_scores.registered(engine):
            raise EngineError(
                "this vLLM engine has no depthlens TokenScores logits processor (VLLM_USE_V2_MODEL_RUNNER is set?); "
                "start it with sampling.vllm.engine.start_engine and the V1 model runner"
            )
        if readout_capture(engine) is None:
            raise EngineError(
                "this vLLM engine was started without depthlens's in-engine readout; start it with "
                "sampling.vllm.engine.start_engine"
            )
        self.engine = engine
        self.depth = depth
        self.end_ids = sorted(end_ids)
        self.n_layers = n_layers
        self.decision_timeout = decision_timeout
        self.max_model_len = int(engine.model_config.max_model_len)
        self.cond = threading.Condition()
        self._inbox: list[Callable[[], None]] = []
        self._samples: dict[str, tuple[Group, int]] = {}
        self._groups: list[Group] = []
        self._closing = False
        self.failed: BaseException | None = None
        self.stats = {"steps": 0, "generated": 0, "aborted": 0, "groups": 0}
        import torch

        # the stepping thread runs on the intra-op count the engine was started with: a new thread starts on
        # OpenMP's default, and vLLM's CPU attention refuses metadata built for another count ("thread_num 2 vs. 1")
        self._threads = int(getattr(engine, "depthlens_threads", torch.get_num_threads()))
        self._thread = threading.Thread(target=self._loop, name="depthlens-vllm-engine", daemon=True)
        self._thread.start()

    # ---- called from callers' threads -------------------------------------------------------------------------

    def submit(self, spec: GroupSpec) -> Group:
        """Queue a group's requests on the engine; returns at once (``wait`` on it)."""
        budget = spec.sampling.max_new_tokens
        if len(spec.prompt) + budget > self.max_model_len:
            raise InputError(
                f"prompt + max tokens: {len(spec.prompt) + budget} tokens exceed the engine's context of "
                f"{self.max_model_len}; shorten the prompt or lower max_tokens"
            )
        samples = [Sample(f"depthlens-serve-{next(_TAGS)}", Trace(seed=int(s))) for s in spec.seeds]
        group = Group(spec, samples)
        with self.cond:
            if self.failed is not None or self._closing:
                raise EngineError(f"the vLLM engine is not running ({self.failed or 'shutting down'})")
            self._inbox.append(lambda: self._add(group))
            self.cond.notify_all()
        return group

    def decide(self, group: Group, keep: set[int]) -> None:
        """Phase two of a paused group: the responses at ``keep`` go on, the others are aborted now."""
        with self.cond:
            group.keep = set(keep)
            self._inbox.append(lambda: self._apply_decision(group))
            self.cond.notify_all()

    def cancel(self, group: Group, error: BaseException | None = None) -> None:
        """Abort every running request of ``group``; its waiters get ``error`` (``GenerationCancelled``)."""
        with self.cond:
            group.cancelled = True
            self._inbox.append(lambda: self._fail(group, error or GenerationCancelled()))
            self.cond.notify_all()

    def wait(self, group: Group, until: Callable[[], bool], cancel: threading.Event | None = None) -> None:
        """Block until ``until()`` holds (checked under the session's lock), cancelling the group if ``cancel``
        is set meanwhile; raises the group's error."""
        with self.cond:
            # a failed engine ends every wait: a group still queued when it broke was never added to be failed
            while not (until() or group.error is not None or group.done or self.failed is not None):
                if cancel is not None and cancel.is_set():
                    group.cancelled = True
                    self._inbox.append(lambda: self._fail(group, GenerationCancelled()))
                    self.cond.notify_all()
                    cancel = None  # asked once; the failure wakes us
                self.cond.wait(timeout=0.1)
            error = group.error or (self.failed if not (group.done or until()) else None)
        if error is not None:
            raise error

    def running(self) -> int:
        """Engine requests still running (for a server's health line)."""
        with self.cond:
            return sum(s.running and not s.ended for g in self._groups for s in g.samples)

    def close(self, timeout: float = 30.0, stop_engine: bool = True) -> None:
        """Abort whatever still runs, stop the stepping thread and (``stop_engine``) the engine — whose shutdown
        takes vLLM's process-wide state with it; False where the engine is its starter's to stop."""
        with self.cond:
            self._closing = True
            for group in list(self._groups):
                self._inbox.append(
                    functools.partial(self._fail, group, GenerationCancelled("the server shut down"))
                )
            self.cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():  # a step that never returns: its waiters would wait for it forever
            with self.cond:
                for group in self._groups:
                    if group.error is None and not group.done:
                        group.error = GenerationCancelled("the vLLM engine did not stop within the shutdown")
                self.cond.notify_all()
        if not stop_engine:
            return
        with contextlib.suppress(Exception):  # the engine core of an in-process engine; nothing to lose here
            self.engine.engine_core.shutdown()

    # ---- the stepping thread ----------------------------------------------------------------------------------

    def _loop(self) -> None:
        from depthlens.models.threads import set_num_threads

        set_num_threads(self._threads)
        while True:
            with self.cond:
                while not self._inbox and not self._groups and not self._closing:
                    self.cond.wait()
                if self._closing and not self._inbox and not self._groups:
                    return
                commands, self._inbox = self._inbox, []
            try:
                for command in commands:
                    command()
                if not self._groups:
                    continue
                if not self.engine.has_unfinished_requests():
                    self._settle(list(self._groups))
                    with self.cond:  # nothing to step: sleep until a caller asks for something
                        if not self._inbox:
                            self.cond.wait(timeout=0.05)
                    continue
                outputs = self.engine.step()
                self.stats["steps"] += 1
                touched = self._absorb(outputs)
                self._settle(touched)
            except Exception as exc:  # the engine itself failed: nothing it runs can finish
                self._broken(exc)
                return

    def _params(self, group: Group, seed: int, tag: str) -> Any:
        cfg = group.spec.sampling
        per_layer = dataclasses.asdict(group.spec.per_layer) if group.spec.per_layer is not None else {}
        readout = self.depth.request_args(tag, cfg.readout_tokens, group.spec.layer_top_k, **per_layer)
        return sampling_params(cfg, seed, tag, self.end_ids, readout, logprobs=group.spec.logprobs)

    def _add(self, group: Group) -> None:
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=group.spec.prompt)
        try:
            for sample in group.samples:
                params = self._params(group, sample.trace.seed, sample.tag)
                self.engine.add_request(sample.tag, prompt, params)
                self._samples[sample.tag] = (group, group.samples.index(sample))
        except Exception as exc:  # a request vLLM refuses (a token id outside its vocabulary, ...)
            self._groups.append(group)
            self._fail(group, InputError(f"vLLM refused the request: {' '.join(str(exc).split())[:300]}"))
            return
        self._groups.append(group)
        self.stats["groups"] += 1

    def _absorb(self, outputs: Sequence[Any]) -> list[Group]:
        """Move one step's outputs into the samples; returns the groups that got any."""
        touched: dict[int, Group] = {}
        for output in outputs:
            found = self._samples.get(output.request_id)
            if found is None:
                continue
            group, i = found
            sample = group.samples[i]
            if sample.stopped:
                continue
            completion = output.outputs[0]
            new = list(completion.token_ids)
            sample.tokens.extend(new)
            self.stats["generated"] += len(new)
            k = group.spec.logprobs
            for step, token in zip(completion.logprobs or [], new, strict=True):
                sample.log_prob.append(step[token].logprob)
                if k:
                    ranked = sorted(
                        (lp.rank, t, lp.logprob) for t, lp in step.items() if lp.rank and lp.rank <= k
                    )
                    sample.top.append([(t, p) for _, t, p in ranked])
            if output.finished:
                sample.engine_finish = completion.finish_reason or "stop"
            touched[id(group)] = group
        return list(touched.values())

    def _settle(self, groups: Sequence[Group]) -> None:
        """Scores and rows for the groups' new tokens, their traces, watches, pauses and ends."""
        from depthlens.sampling.vllm import scores as vllm_scores

        live = [g for g in groups if not g.done]
        running = [s for g in live for s in g.samples if not s.ended]
        if running:
            for tag, scores in vllm_scores.drain(self.engine, [s.tag for s in running]).items():
                group, i = self._samples[tag]
                group.samples[i].scores.update(scores)
            self._take(running)
        paused = []
        for group in (g for g in live if not g.done):
            try:
                if self._publish(group):
                    paused.append(group)
            except Exception as exc:  # a watch that raised (a cancelled client) or a missing score
                self._fail(group, exc)
        if paused:
            with self.cond:
                self.cond.notify_all()
                decided = [lambda g=g: g.keep is not None or g.done or g.cancelled for g in paused]
                self.cond.wait_for(lambda: all(d() for d in decided), self.decision_timeout)

    def _take(self, samples: Sequence[Sample]) -> None:
        """The rows the worker read out for ``samples`` since the last step; a request whose rows cannot be used
        (non-finite states, ...) fails its own group only."""
        rows, failed = self.depth.take(self.engine, {s.tag: len(s.rows) for s in samples})
        for tag, new in rows.items():
            group, i = self._samples[tag]
            sample = group.samples[i]
            sample.rows.extend(new.rows)
            sample.top_ids.extend(new.top_ids)
            sample.top_probs.extend(new.top_probs)
            for name, values in new.values.items():
                sample.values.setdefault(name, []).extend(values)
        for tag, error in failed.items():
            found = self._samples.get(tag)  # None once an earlier request of its group failed it
            if found is not None:
                self._fail(found[0], error)

    def _publish(self, group: Group) -> bool:
        """Extend the group's traces with what is complete; run its watch; mark ends, the pause and the end.
        Returns True when the group has just paused (the caller's decision is due)."""
        window = group.spec.sampling.readout_tokens
        limit = group.limit()
        changed = False
        for s in (s for s in group.samples if not s.ended):
            changed |= extend(s, limit, window, self.depth.kinds)
        if changed:
            group.spec.watch.on_step(group.traces)
            for i, s in enumerate(group.samples):
                if s.running and len(s.trace) and group.spec.watch.ends(i, s.trace):
                    self._stop(s, "stopped")
        for s in group.samples:
            if not s.ended and complete(s, window):
                s.ended = True
        just_paused = False
        if limit is not None and not group.paused:
            reached = all(s.ended or (len(s.trace) >= limit and rows_done(s, window)) for s in group.samples)
            if reached:
                group.paused = just_paused = True
        if all(s.ended for s in group.samples) and limit is None:
            self._finish(group)
        return just_paused

    def _stop(self, sample: Sample, finish: Finish) -> None:
        if sample.running:
            self.engine.abort_request([sample.tag])
            self.stats["aborted"] += 1
            sample.aborted = True
        sample.stopped = True
        sample.trace.finish = finish

    def _apply_decision(self, group: Group) -> None:
        if group.done:
            return
        keep = group.keep or set()
        for i, s in enumerate(group.samples):
            if i not in keep and not s.ended:
                self._stop(s, "paused")  # rejected at ℓ: its trace keeps the prefix, as HFGenerator leaves it
                s.ended = True
        self._settle([group])

    def _finish(self, group: Group) -> None:
        with self.cond:
            group.done = True
            self._groups = [g for g in self._groups if g is not group]
            for s in group.samples:
                self._samples.pop(s.tag, None)
            self.cond.notify_all()
        self.depth.release(self.engine, [s.tag for s in group.samples])  # rows past a stop, or past ℓ

    def _fail(self, group: Group, error: BaseException) -> None:
        if group.done:
            return
        for s in group.samples:
            if s.running:
                self._stop(s, s.trace.finish)
            s.ended = True
        group.error = error
        self._finish(group)

    def _broken(self, exc: Exception) -> None:
        error = EngineError(
            f"the vLLM engine failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        )
        with self.cond:
            self.failed = error
            for group in list(self._groups):
                group.error = error
                group.done = True
            self._groups = []
            self.cond.notify_all()
