"""Watching a generation while it runs: what a server (or any caller) sees of each engine step.

``GenerationBackend.start`` / ``resume`` return whole ``Trace``s; a server also needs them as they grow — to stream
tokens, to end a response at a stop string, to stop a response where an online policy says, to give up when its
client has gone. A backend that takes a ``Watch`` calls it on the thread that steps the engine, after every step:

- ``on_step(traces)`` sees every trace of the call as it is now (tokens and per-token fields appended so far); it
  may raise (e.g. ``GenerationCancelled``) to end the whole call;
- ``ends(i, trace)`` is asked for each response still running: True ends response ``i`` now, with the tokens it
  has (finish ``stopped``); the engine generates nothing more for it.

``HFGenerator`` and the vLLM engine session (``sampling.vllm.session``) both take one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from depthlens.sampling.backend import Trace


class GenerationCancelled(Exception):
    """The caller gave up on a generation (its client disconnected, or the server is shutting down)."""


def _nothing(traces: Sequence[Trace]) -> None:
    return None


def _never(index: int, trace: Trace) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class Watch:
    """Per-step callbacks of one ``start`` / ``resume`` call (see the module docstring)."""

    on_step: Callable[[Sequence[Trace]], None] = _nothing
    ends: Callable[[int, Trace], bool] = _never
