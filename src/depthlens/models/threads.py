"""How many intra-op threads a run's model uses on a CPU, and how OpenMP's idle threads wait.

A sampler's step is a chain of small operations ([rows, d] products, a [rows, V] sort, the readout's blocks):
a second thread gains them little, and torch's OpenMP threads spin at every barrier between them, so on a shared
machine a 2-thread sampler burned 7.8× the CPU of a 1-thread one for the same responses (docs/performance.md,
"Threads"). Scoring reads chunks of hundreds of tokens through large products that do use every core. So a run
on a CPU samples on one thread and scores on torch's default; ``EngineConfig.threads`` (``--threads N``,
``threads=``) overrides either. On CUDA the host threads only launch kernels: one is enough.

OpenMP reads its wait policy once, when its runtime starts (at ``import torch``): ``passive_wait`` must run
before that (the CLI's entry does), and a policy the user set in the environment is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Literal

Work = Literal["sample", "score"]

WAIT_POLICY = "OMP_WAIT_POLICY"


def passive_wait() -> None:
    """Idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``) unless the environment says
    otherwise. Only takes effect when called before torch is imported."""
    os.environ.setdefault(WAIT_POLICY, "PASSIVE")


_TORCH_DEFAULT: list[int] = []  # torch's own count, read before any run of this process changed it


def threads_for(work: Work, device: str, requested: int | None = None) -> tuple[int, str]:
    """(intra-op threads, why) for ``work`` on a ``device`` type (``cpu``, ``cuda``): ``requested`` when given,
    else 1 for sampling on a CPU and on CUDA, else torch's own default (every core, or ``OMP_NUM_THREADS``)."""
    import torch

    if not _TORCH_DEFAULT:
        _TORCH_DEFAULT.append(torch.get_num_threads())
    if requested is not None:
        return requested, "as asked"
    if device != "cpu":
        return 1, "the GPU does the work"
    if work == "sample":
        return 1, "a sampling step's small operations gain nothing from more"
    return _TORCH_DEFAULT[0], "scoring's large products use every core"


def set_num_threads(n: int) -> None:
    """torch's own setter: vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op for the rest of the
    process once an in-process engine has bound its threads, which left a later hf run of the same process on the
    engine's count — and a resumed run reading out on other threads than its first part."""
    import torch

    torch._C.set_num_threads(n)


def use_threads(work: Work, device: str, requested: int | None = None) -> int:
    """Set torch's intra-op thread count for ``work`` (``threads_for``); the count set. A count past what the
    machine has is refused here too (``models.machine.check_threads``; every front's run builder refuses it
    first), so a run built by hand never starts a million OpenMP threads."""
    from depthlens.models.machine import check_threads

    check_threads(requested)
    n = threads_for(work, device, requested)[0]
    set_num_threads(n)
    return n


def threads_line(work: Work, device: str, requested: int | None = None) -> str:
    """What ``use_threads`` sets and why, and OpenMP's wait policy: a run's opening line."""
    n, why = threads_for(work, device, requested)
    policy = os.environ.get(WAIT_POLICY, "active (torch's default)").lower()
    return f"threads: {n} ({why}; --threads N to change), OpenMP wait policy {policy}"


@contextlib.contextmanager
def threads_kept() -> Iterator[None]:
    """Run a command or a Python verb, then give torch back the thread count it had before: a run's choice
    (``use_threads``) is the run's, not a lasting change to the caller's session — a notebook's own torch work, or
    the next run in the same process, which would otherwise read out on another count and round its floats
    differently. Torch not yet imported: the count it starts with (the first ``threads_for`` read it)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        torch = sys.modules.get("torch")
        if torch is not None:
            restore = before if before is not None else (_TORCH_DEFAULT[0] if _TORCH_DEFAULT else None)
            if restore is not None and torch.get_num_threads() != restore:
                set_num_threads(restore)
