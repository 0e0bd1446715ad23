"""What a Python verb shows while it runs (docs/python.md, "Progress"): one line up front — the backend, the
responses (questions × pool), the tokens read out of each, the device and threads — then a bar per count, on
stderr. The bars are ``tqdm.auto``'s (a widget in a notebook, text in a terminal) and are fed by the events the
CLI's bars are (``GenerationEvents``, ``OnlineEvents``, the sampler's ``on_token``, each scored result): no second
count. ``progress=False``: nothing at all.
"""

from __future__ import annotations

import dataclasses
import sys
from types import TracebackType
from typing import Any

from depthlens.config import EngineConfig, SamplingConfig
from depthlens.models.threads import Work, threads_for


def readout_words(sampling: SamplingConfig, layer_top_k: int = 0) -> str:
    """How many of each response's tokens are read out at every layer (ℓ), as the opening line says it, and
    each layer's top-k where it is kept (``layer_top_k``: its memory grows with the tokens read out)."""
    readout_tokens = sampling.readout_tokens
    if readout_tokens is None or readout_tokens >= sampling.max_new_tokens:
        words = f"every token read out (readout_tokens {'all' if readout_tokens is None else readout_tokens})"
    else:
        words = f"the first {readout_tokens} tokens read out (readout_tokens)"
    return words + top_k_words(layer_top_k)


def top_k_words(layer_top_k: int) -> str:
    """``" with each layer's top-5"`` where a run keeps each layer's top-k, else nothing."""
    return f" with each layer's top-{layer_top_k}" if layer_top_k else ""


def counted(n: int, noun: str) -> str:
    """``"1 question"``, ``"2 questions"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def where_words(lm: Any, engine: EngineConfig, work: Work) -> str:
    """The device and threads a run uses (``models.threads``' choice, as the run will make it)."""
    if engine.backend == "vllm":
        return f"in a vLLM engine (tensor_parallel_size {engine.tensor_parallel_size}, dtype {engine.dtype})"
    device = lm.device.type
    threads, _ = threads_for(work, device, engine.threads)
    return f"on {lm.device}, {threads} thread{'s' if threads != 1 else ''}"


@dataclasses.dataclass
class Bar:
    """One count on the display: a tqdm bar, or nothing (progress off)."""

    shown: Any = None  # a tqdm.auto.tqdm, None when progress is off

    def start(self, total: int, done: int = 0) -> None:
        """The total once it is known, and what was already there (a resumed store)."""
        if self.shown is not None:
            self.shown.reset(total=total)
            self.shown.update(done)

    def advance(self, n: int = 1) -> None:
        if self.shown is not None:
            self.shown.update(n)


class Display:
    """A verb's opening line and bars on stderr, closed when the verb ends (however it ends); ``enabled`` False:
    nothing is printed and the bars count nothing."""

    def __init__(self, enabled: bool, line: str) -> None:
        self.enabled = enabled
        self.bars: list[Bar] = []
        if enabled:
            print(line, file=sys.stderr, flush=True)

    def say(self, line: str) -> None:
        """A slow step's line (a vLLM engine starting), on stderr unless progress is off."""
        if self.enabled:
            print(line, file=sys.stderr, flush=True)

    def bar(self, name: str, total: int | None = None, unit: str = "it") -> Bar:
        """A bar counting ``unit``s (``total`` None: a counter with its rate, no end)."""
        if not self.enabled:
            return Bar()
        from tqdm import auto  # a notebook's widget where one runs, else text (read at call time)

        shown = auto.tqdm(
            total=total, desc=name, unit=f" {unit}", position=len(self.bars), leave=True, file=sys.stderr
        )
        self.bars.append(Bar(shown))
        return self.bars[-1]

    def __enter__(self) -> Display:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for bar in reversed(self.bars):
            bar.shown.close()
