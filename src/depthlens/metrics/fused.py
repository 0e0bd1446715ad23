"""One layer's readout as a single compiled kernel: normed state → logits → log-softmax → divergence to the
final layer, without the eager path's dozen passes over [tokens, V] tensors.

Eager PyTorch runs each elementwise step (exp, log, products, sums) as its own pass over the vocabulary, so on
a CPU the divergence costs about twice the unembedding product it follows; compiled (torch.compile / Inductor,
Triton on CUDA) the steps fuse into the matmul's epilogue and a reduction, and the readout runs at the
matmul's pace (docs/performance.md). The math is ``metrics.divergence``'s own, compiled; cosine needs no logits
and stays eager.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable

import torch

from depthlens.config import Compile, Divergence
from depthlens.metrics.divergence import layer_divergence
from depthlens.readout.lens import LogitLens

FUSABLE: tuple[Divergence, ...] = ("jsd", "jsd-nat", "kl")

LayerStep = Callable[
    [torch.Tensor, torch.Tensor], torch.Tensor
]  # (normed [k, d], final log-probs [k, V]) → [k]

# Per lens and kind: the guarded compiled step (compiled once, reused for every chunk of every call).
_CACHE: weakref.WeakKeyDictionary[LogitLens, dict[str, LayerStep]] = weakref.WeakKeyDictionary()


def use_compiled(setting: Compile, device: torch.device) -> bool:
    """Whether ``ReadoutConfig.compile`` asks for the compiled kernel on ``device``."""
    return setting == "on" or (setting == "auto" and device.type == "cuda")


def _step(lens: LogitLens, kind: Divergence) -> LayerStep:
    def step(normed: torch.Tensor, final_logprobs: torch.Tensor) -> torch.Tensor:
        logq = torch.log_softmax(lens.logits_from_normed(normed), dim=-1)
        return layer_divergence(kind, final_logprobs, logq)  # the eager path's own formula, traced and fused

    return step


def compiled_step(lens: LogitLens, kind: Divergence) -> LayerStep | None:
    """The compiled per-layer step for ``kind`` (None for cosine, which needs no logits)."""
    if kind not in FUSABLE:
        return None
    steps = _CACHE.setdefault(lens, {})
    if kind not in steps:
        eager = _step(lens, kind)
        steps[kind] = _guarded(torch.compile(eager, dynamic=True), eager)
    return steps[kind]


def _guarded(compiled: LayerStep, eager: LayerStep) -> LayerStep:
    """Run the compiled step; if compiling fails (no C++ compiler, an unsupported op), warn once and run eager
    from then on — the same numbers, at eager speed."""
    failed = False

    def run(normed: torch.Tensor, final_logprobs: torch.Tensor) -> torch.Tensor:
        nonlocal failed
        if not failed:
            try:
                return compiled(normed, final_logprobs)
            except Exception as exc:  # torch.compile raises many backend-specific types
                failed = True
                warnings.warn(
                    f"compiled readout unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                    "using the eager path (same results, slower) — pass --compile off to skip the attempt",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return eager(normed, final_logprobs)

    return run
