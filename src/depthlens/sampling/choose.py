"""Which generation engine a run gets: ``--backend hf | vllm | auto``, and building it (vllm imported only when
chosen, so ``depthlens --help`` and the core install never need it).

``auto`` picks the backend expected to finish the job first: a pure function of the job (responses, tokens each,
how many run together, how many tokens are read out) and of constants measured on this project's reference CPU
(docs/performance.md, "Choosing the backend"). The vLLM engine generates faster once started, but its start
(weights, and a compiled graph from vLLM's cache) costs tens of seconds that the transformers sampler does not
pay: where the job is small the start dominates and hf finishes first; past the break-even vLLM does. On a CUDA
machine vLLM is chosen whenever it can load the model (its batching is not the CPU's; not measured here). A model
vLLM cannot load as given — a ``.gguf`` file — is never sent to it.
"""

from __future__ import annotations

import bisect
import dataclasses
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from depthlens.config import Backend, EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.errors import ConfigError, named
from depthlens.metrics.layer_quantities import stats_need_hf
from depthlens.models.threads import use_threads
from depthlens.sampling.backend import GenerationBackend
from depthlens.sampling.hf import HFGenerator
from depthlens.sampling.vllm.backend import VLLM_MISSING


def vllm_available() -> bool:
    """Whether the vllm extra is installed (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


AUTO_ENV = "DEPTHLENS_BACKEND"  # what ``--backend auto`` means on a machine, when set (hf or vllm)


def resolve_backend(
    name: str, recorded: str | None = None, model: str = "", job: Job | None = None
) -> Backend:
    """``auto`` → the backend ``recorded`` by the run being resumed, else ``$DEPTHLENS_BACKEND``, else the one
    expected to finish ``job`` first (``pick_backend``: hf for small jobs, for a job of unknown size, for a model
    vLLM cannot load such as a ``.gguf`` file, and where the extra is missing; vllm past the measured break-even,
    and on CUDA); ``vllm`` needs the extra.
    """
    if name == "auto":
        name = (
            recorded
            or os.environ.get(AUTO_ENV)
            or pick_backend(model, job, vllm_available(), torch.cuda.is_available())
        )
    if name not in ("hf", "vllm"):
        raise ConfigError(f"{named('backend')} {name!r} is not one of auto, hf, vllm")
    if name == "vllm" and not vllm_available():
        raise ConfigError(VLLM_MISSING)
    return "vllm" if name == "vllm" else "hf"


def make_backend(
    lm: Any,
    engine: EngineConfig,
    sampling: SamplingConfig = SamplingConfig(),
    readout: ReadoutConfig = ReadoutConfig(),
    on_token: Callable[[int], None] = lambda n: None,
    job: Any = None,
    progress: Callable[[str], None] | None = None,
    layer_stats: Mapping[str, Any] | None = None,
) -> GenerationBackend:
    """The generation backend ``engine.backend`` names; vllm is imported only when chosen.

    ``lm``: a ``LoadedModel`` (hf), or for vllm a ``models.info.ModelInfo`` (tokenizer and config only: the engine
    reads the layers out itself; a ``LoadedModel`` works too, only its tokenizer and config are used). ``job``:
    the ``sampling.vllm.engine.JobSize`` the engine's KV cache is sized for; ``progress``: where the engine's
    start is told (None: ``say``, on stderr); ``layer_stats``: a caller's statistics of each layer's log-probabilities
    (hf only: a function cannot travel into the engine's worker).
    """
    stats_need_hf(layer_stats, engine.backend)
    if engine.backend == "vllm":
        resolve_backend("vllm")  # the one-line install hint where the extra is missing
        from depthlens.sampling.vllm.generator import EngineGenerator

        told = say if progress is None else progress
        return EngineGenerator(lm, sampling, readout, engine, on_token=on_token, job=job, progress=told)
    use_threads("sample", lm.device.type, engine.threads)
    return HFGenerator(lm, sampling, readout, on_token=on_token, layer_stats=layer_stats)


def say(line: str) -> None:
    """A slow step's line on stderr (the vLLM engine's start), for people watching a run."""
    print(line, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Job:
    """What a run generates: ``responses`` of up to ``max_new_tokens`` each, ``concurrent`` at a time, the first
    ``readout_tokens`` of each read out at every layer (None: all)."""

    responses: int
    max_new_tokens: int
    concurrent: int
    readout_tokens: int | None = None

    @property
    def tokens(self) -> int:
        return self.responses * self.max_new_tokens

    @property
    def read_tokens(self) -> int:
        window = (
            self.max_new_tokens
            if self.readout_tokens is None
            else min(self.readout_tokens, self.max_new_tokens)
        )
        return self.responses * window


@dataclasses.dataclass(frozen=True)
class Costs:
    """Seconds a backend spends, measured on SmolLM2-135M (2-core CPU; docs/performance.md).

    Attributes:
        start_s: load (hf) or engine start with a warm compile cache (vllm), before the first token.
        tokens_per_s: generation throughput (no readout) by concurrent responses, as (n, tokens/s) pairs.
        read_s: seconds per read-out token (every layer's lens and divergences).
    """

    start_s: float
    tokens_per_s: tuple[tuple[int, float], ...]
    read_s: float

    def rate(self, concurrent: int) -> float:
        """tokens/s at ``concurrent`` responses: log-linear between the measured n, flat beyond them."""
        ns = [n for n, _ in self.tokens_per_s]
        rates = [r for _, r in self.tokens_per_s]
        if concurrent <= ns[0]:
            return rates[0] * concurrent / ns[0]  # fewer rows per step: fewer tokens per step
        if concurrent >= ns[-1]:
            return rates[-1]
        k = bisect.bisect_right(ns, concurrent)
        w = (math.log(concurrent) - math.log(ns[k - 1])) / (math.log(ns[k]) - math.log(ns[k - 1]))
        return rates[k - 1] + w * (rates[k] - rates[k - 1])

    def seconds(self, job: Job) -> float:
        """Expected wall time of ``job``."""
        return self.start_s + job.tokens / self.rate(max(1, job.concurrent)) + job.read_tokens * self.read_s


# Measured with benchmarks/backend_choice.py (docs/performance.md, "Choosing the backend"); hf float32, vLLM
# bfloat16 (both backends' defaults on a CPU).
HF = Costs(start_s=2.6, tokens_per_s=((8, 83.5), (16, 113.1), (48, 167.8)), read_s=0.0125)
VLLM = Costs(start_s=31.0, tokens_per_s=((8, 188.3), (16, 273.9), (48, 379.7)), read_s=0.0068)


def is_gguf(model: str) -> bool:
    return Path(model).expanduser().suffix == ".gguf"


def pick_backend(
    model: str, job: Job | None, vllm_installed: bool, cuda: bool, hf: Costs = HF, vllm: Costs = VLLM
) -> Backend:
    """The backend that finishes ``job`` first (hf where vLLM is missing or cannot load ``model``; vllm on CUDA;
    without a job, hf — a job of unknown size is no reason to pay the engine's start)."""
    if not vllm_installed or is_gguf(model):
        return "hf"
    if cuda:
        return "vllm"
    if job is None:
        return "hf"
    return "vllm" if vllm.seconds(job) < hf.seconds(job) else "hf"


def break_even_tokens(concurrent: int, read_share: float = 0.0, hf: Costs = HF, vllm: Costs = VLLM) -> float:
    """Generated tokens at which both backends take equally long (``read_share``: read-out tokens per generated
    token), for the docs; inf where vLLM never catches up."""
    saved = 1 / hf.rate(concurrent) - 1 / vllm.rate(concurrent) + read_share * (hf.read_s - vllm.read_s)
    return (vllm.start_s - hf.start_s) / saved if saved > 0 else math.inf


def server_backend(flag: str, model: str) -> tuple[str, str]:
    """A server's backend for ``--backend flag`` and why, as a clause. ``auto`` is not the job-size rule of
    ``generate`` (a server's work has no end: the engine's start is paid once, and only vllm batches many clients'
    requests): ``$DEPTHLENS_BACKEND`` where set, else vllm where the extra is installed and can load ``model``,
    else hf. The name is checked later (``resolve_backend``)."""
    if flag != "auto":
        return flag, f"as asked: {named('backend')} {flag}"
    if os.environ.get(AUTO_ENV):
        return os.environ[AUTO_ENV], f"{named('backend')} auto, as ${AUTO_ENV} says"
    if is_gguf(model):
        return "hf", f"{named('backend')} auto: vLLM cannot load a .gguf file"
    if not vllm_available():
        return "hf", f"{named('backend')} auto: the vllm extra is not installed"
    return (
        "vllm",
        f"{named('backend')} auto: the vllm extra is installed, and one vLLM engine batches every client",
    )


# What each engine costs to start, as measured for SmolLM2-135M on this project's 2-core CPU (``VLLM`` / ``HF``
# above; docs/performance.md, "Engine start"), and the ~5 min one server start took there, shared and compiling.
VLLM_START = (
    f"the vLLM engine takes ~{VLLM.start_s:.0f} s to start with its compile cache warm and minutes when it compiles "
    "afresh (first start, another dtype or length: 287 s once on a shared 2-core CPU, SmolLM2-135M)"
)
HF_START = (
    f"transformers loads in seconds (~{HF.start_s:.0f} s for SmolLM2-135M) and serves one request at a time"
)


def server_backend_line(backend: str, why: str) -> str:
    """The line a server prints before it starts: which engine, why, and what that costs, with the other choice."""
    if backend == "vllm":
        return (
            f"engine: vllm ({why}); {VLLM_START} — {named('backend')} hf starts in seconds "
            "(one request at a time)"
        )
    other = (
        f"; {named('backend')} vllm batches many clients' requests at a start of tens of seconds to minutes"
        if vllm_available()
        else ""
    )
    return f"engine: hf ({why}); {HF_START}{other}"
