"""What a Python verb shows while it runs (docs/python.md, "Progress"): one line up front — the backend, the
responses (questions × pool), the tokens read out of each, the device and threads — then a count per quantity, on
stderr: ``tqdm.auto``'s bars on a terminal or in a notebook (a widget there, text here), or plain lines where
stderr is a log or a pipe (``Lines``: one per item, or every 5 %, and at least every half minute — no cursor
escapes), as the command line's displays do too (``cli.progress``). The counts are fed by the events the CLI's are
(``GenerationEvents``, ``OnlineEvents``, the sampler's ``on_token``, each scored result): no second count.
``progress=False``: nothing at all.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

from depthlens.config import EngineConfig, SamplingConfig
from depthlens.models.threads import Work, threads_for

Progress = bool | Literal["bars", "lines"]
"""A verb's ``progress``: True — bars on a terminal or in a notebook, plain lines otherwise —, ``"bars"``,
``"lines"``, or False (nothing)."""


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
class _Count:
    """One quantity a ``Lines`` display counts."""

    name: str
    total: int | None
    done: int = 0
    unit: str = ""

    def words(self) -> str:
        if self.total is None:
            return f"{self.name} {self.done:,}"
        share = f" ({100 * self.done / self.total:.0f} %)" if self.total else ""
        return f"{self.name} {self.done:,}/{self.total:,}{share}"


class Lines:
    """Progress as plain lines, for a log or a pipe: one line per item of the first count with a total (up to 20
    of them), else one every 5 %, and at least one every ``every_s`` seconds while anything moves; the last one
    when it closes. Takes the calls of a rich ``Progress`` the command line makes (``add_task``, ``update``,
    ``advance``), so the CLI's displays turn into it where stderr is no terminal (``cli.progress``)."""

    def __init__(self, write: Callable[[str], None], every_s: float = 30.0) -> None:
        self.write, self.every_s = write, every_s
        self.counts: list[_Count] = []
        self.started = self.said_at = time.monotonic()
        self.said_done: int | None = None
        self.moved = False

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        self.counts.append(_Count(description, None if total is None else int(total)))
        return len(self.counts) - 1

    def update(
        self,
        task: int,
        *,
        total: float | None = None,
        completed: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        **_: Any,
    ) -> None:
        count = self.counts[task]
        count.total = int(total) if total is not None else count.total
        count.done = int(completed) if completed is not None else count.done
        count.name = description or count.name
        if advance:
            self.advance(task, advance)

    def advance(self, task: int, advance: float = 1) -> None:
        self.counts[task].done += int(advance)
        self.moved = True
        if self._due():
            self._say()

    def _due(self) -> bool:
        main = next((c for c in self.counts if c.total), None)
        said = self.said_done or 0
        if main is not None and main.total and main.done != said:
            step = 1 if main.total <= 20 else math.ceil(main.total / 20)
            if main.done // step != said // step or main.done == main.total:
                return True
        return time.monotonic() - self.said_at >= self.every_s

    def _say(self) -> None:
        main = next((c for c in self.counts if c.total), None)
        self.said_done = main.done if main is not None else None
        self.said_at, self.moved = time.monotonic(), False
        elapsed = time.monotonic() - self.started
        self.write(", ".join(c.words() for c in self.counts) + f"; {elapsed:.0f} s")

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """The last line, where anything moved since the one before."""
        if self.moved:
            self._say()


def interactive() -> bool:
    """Whether bars can be drawn: stderr is a terminal, or a notebook's kernel runs this (its widget)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and "IPKernelApp" in getattr(shell, "config", {}):
        return True
    return sys.stderr.isatty()


@dataclasses.dataclass
class Bar:
    """One count on the display: a tqdm bar, a count of plain ``Lines``, or nothing (progress off)."""

    shown: Any = None  # a tqdm.auto.tqdm; None when progress is off or shown as lines
    lines: Lines | None = None
    task: int = 0

    def start(self, total: int, done: int = 0) -> None:
        """The total once it is known, and what was already there (a resumed store)."""
        if self.shown is not None:
            self.shown.reset(total=total)
            self.shown.update(done)
        if self.lines is not None:
            self.lines.update(self.task, total=total, completed=done)

    def advance(self, n: int = 1) -> None:
        if self.shown is not None:
            self.shown.update(n)
        if self.lines is not None:
            self.lines.advance(self.task, n)


class Display:
    """A verb's opening line and counts on stderr, closed when the verb ends (however it ends): ``tqdm.auto`` bars
    or plain ``Lines`` (``progress``: ``Progress``); False: nothing is printed and the bars count nothing."""

    def __init__(self, progress: Progress, line: str) -> None:
        self.enabled = progress is not False
        self.as_lines = progress == "lines" or (progress is True and not interactive())
        self.bars: list[Bar] = []
        self.lines = Lines(self.say) if self.enabled and self.as_lines else None
        self.say(line)

    def say(self, line: str) -> None:
        """A line on stderr (the opening one, a slow step's — a vLLM engine starting), unless progress is off."""
        if self.enabled:
            print(line, file=sys.stderr, flush=True)

    def bar(self, name: str, total: int | None = None, unit: str = "it") -> Bar:
        """A count of ``unit``s (``total`` None: a counter with its rate, no end)."""
        if not self.enabled:
            return Bar()
        if self.lines is not None:
            return Bar(lines=self.lines, task=self.lines.add_task(name, total))
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
        if self.lines is not None:
            self.lines.close()
