"""What this machine lends the process — CPUs, memory, threads — and the refusal of a count beyond it.

A count a user gives (``threads``, ``batch_size``, ``memory_mb``, …) is taken as asked, so one that the machine
cannot hold would start a million OpenMP threads or allocate past the memory until the kernel kills the process
(or, outside a container, its neighbours). Each is checked against what is read here before anything starts:

- **CPUs**: the process's CPU affinity (``os.sched_getaffinity``), lowered to a cgroup's CPU quota (``cpu.max``,
  or v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) where one is set, as a container or a job scheduler sets it.
- **Memory**: the physical memory, lowered to a cgroup's limit (``memory.max``, v1's ``memory.limit_in_bytes``)
  and to the address-space limit (``ulimit -v``) where set. The ceiling is what the process may ever hold, not
  what is free now: a count is refused when it cannot fit at all, never because the machine is busy.
- **Threads**: how many tasks the process may start (``ulimit -u``, a cgroup's ``pids.max``, the kernel's
  ``threads-max``), for a server's request threads.

Read once per process (``machine``), each with where it was read (named in every refusal), so a user reads why.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Iterator
from pathlib import Path

from depthlens.errors import InputError, named

THREADS_PER_CPU = 4
"""The most intra-op threads per CPU the process may use: past the CPUs, threads only wait on each other (and
OpenMP's spin at every barrier); a few times over leaves room for a deliberate experiment, a million is a typo."""

CGROUP = Path("/sys/fs/cgroup")
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2^63 − 1


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the process may use, each with where it was read (``"the CPU affinity"``, ``"cgroup memory.max"``)."""

    cpus: int
    cpus_from: str
    memory: int  # bytes
    memory_from: str
    tasks: int | None  # threads and processes the process may start; None: no limit found
    tasks_from: str

    @property
    def most_threads(self) -> int:
        """The most intra-op threads a run may ask for: ``THREADS_PER_CPU`` × the CPUs."""
        return THREADS_PER_CPU * self.cpus


@functools.cache
def machine() -> Machine:
    """This machine as the process sees it (read once; see the module docstring)."""
    cpus, cpus_from = _cpus()
    memory, memory_from = _memory()
    tasks, tasks_from = _tasks()
    return Machine(cpus, cpus_from, memory, memory_from, tasks, tasks_from)


def _cpus() -> tuple[int, str]:
    try:
        cpus, where = len(os.sched_getaffinity(0)), "its CPU affinity"
    except (AttributeError, OSError):  # macOS, Windows: no affinity call
        cpus, where = os.cpu_count() or 1, "os.cpu_count()"
    for quota, period, name in _cpu_quotas():
        if quota > 0 and period > 0 and math.ceil(quota / period) < cpus:
            cpus, where = math.ceil(quota / period), f"cgroup {name}"
    return max(1, cpus), where


def _cpu_quotas() -> Iterator[tuple[int, int, str]]:
    """(quota, period, file) of every cgroup CPU limit above the process (v2 ``cpu.max``, v1 CFS quota)."""
    for folder in _cgroup_dirs("cpu"):
        text = _read(folder / "cpu.max")
        if text is not None:
            quota, _, period = text.partition(" ")
            if quota.isdigit() and period.strip().isdigit():
                yield int(quota), int(period), "cpu.max"
        quota_v1, period_v1 = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
        if quota_v1 and period_v1 and quota_v1.lstrip("-").isdigit() and period_v1.isdigit():
            yield int(quota_v1), int(period_v1), "cpu.cfs_quota_us"


def _memory() -> tuple[int, str]:
    try:
        memory, where = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "its physical memory"
    except (
        AttributeError,
        ValueError,
        OSError,
    ):  # no sysconf: the limits below, or a guess that refuses little
        memory, where = _UNLIMITED, "no memory size readable"
    for folder in _cgroup_dirs("memory"):
        for name in ("memory.max", "memory.limit_in_bytes"):
            text = _read(folder / name)
            if text is not None and text.isdigit() and int(text) < min(memory, _UNLIMITED):
                memory, where = int(text), f"cgroup {name}"
    limit = _rlimit("RLIMIT_AS")
    if limit is not None and limit < memory:
        memory, where = limit, "ulimit -v"
    return memory, where


def _tasks() -> tuple[int | None, str]:
    tasks, where = _rlimit("RLIMIT_NPROC"), "ulimit -u"
    for folder in _cgroup_dirs("pids"):
        text = _read(folder / "pids.max")
        if text is not None and text.isdigit() and (tasks is None or int(text) < tasks):
            tasks, where = int(text), "cgroup pids.max"
    text = _read(Path("/proc/sys/kernel/threads-max"))
    if text is not None and text.isdigit() and (tasks is None or int(text) < tasks):
        tasks, where = int(text), "kernel threads-max"
    return tasks, where if tasks is not None else "no limit found"


def _rlimit(name: str) -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft = resource.getrlimit(getattr(resource, name))[0]
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def _cgroup_dirs(controller: str) -> Iterator[Path]:
    """The cgroup folders of ``controller`` holding the process, from its own up to the root (a limit anywhere on
    the way applies); in a container the process's path may not exist under its mount, whose root is its own."""
    text = _read(Path("/proc/self/cgroup"))
    for line in (text or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            base = CGROUP
        elif controller in controllers.split(","):
            base = CGROUP / controllers
            if not base.is_dir():
                base = CGROUP / controller
        else:
            continue
        parts = Path(path).parts[1:]
        for depth in range(len(parts), -1, -1):
            folder = base.joinpath(*parts[:depth])
            if folder.is_dir():
                yield folder


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def gib(size: float) -> str:
    """A byte count as a person reads it: ``23.5 GiB``, ``512 MiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{int(size)} bytes"


def check_threads(threads: int | None, setting: str = "threads") -> None:
    """``threads`` (None: chosen for the work) is at most ``Machine.most_threads``, or refused naming the
    machine's CPUs — before any thread is started."""
    here = machine()
    if threads is not None and threads > here.most_threads:
        raise InputError(
            setting=setting,
            value=threads,
            requirement=f"must be at most {here.most_threads} ({THREADS_PER_CPU} × the {here.cpus} CPU"
            f"{'s' if here.cpus != 1 else ''} this process may use, from {here.cpus_from}): threads past the CPUs "
            "only wait on each other",
        )


@dataclasses.dataclass(frozen=True)
class Need:
    """Memory a setting makes a run hold at once: ``per`` bytes for each of the ``count`` units the setting
    (= ``value``) makes (None: ``value`` units; a batch larger than its pool samples the pool), plus ``fixed``
    bytes whatever it is; ``what`` says what they are (``"16 responses sampled together, …"``)."""

    setting: str
    value: int
    per: int
    what: str
    fixed: int = 0
    count: int | None = None

    @property
    def size(self) -> int:
        return (self.value if self.count is None else self.count) * self.per + self.fixed


def check_memory(need: Need) -> None:
    """Refuse ``need`` where it cannot fit in the memory the process may use, naming the setting, what it needs
    and the largest value that fits."""
    here = machine()
    if need.size <= here.memory:
        return
    most = (here.memory - need.fixed) // need.per if need.per else 0
    fix = (
        f"use {named(need.setting, most)} or less"
        if most >= 1
        else "no value of it fits: lower the others, or use a machine with more memory"
    )
    raise InputError(
        setting=need.setting,
        value=need.value,
        requirement=f"needs {gib(need.size)} at once ({need.what}), and this process may use "
        f"{gib(here.memory)} (from {here.memory_from}); {fix}",
    )
