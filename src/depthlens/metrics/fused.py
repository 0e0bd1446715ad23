"""One layer's readout as a single compiled kernel: normed state → logits → log-softmax → divergence to the
final layer, without the eager path's dozen passes over [tokens, V] tensors.

Eager PyTorch runs each elementwise step (exp, log, products, sums) as its own pass over the vocabulary, so on
a CPU the divergence costs about twice the unembedding product it follows; compiled (torch.compile / Inductor,
Triton on CUDA) the steps fuse into the matmul's epilogue and a reduction, and the readout runs at the
matmul's pace (docs/performance.md). The math is ``metrics.divergence``'s own, compiled; cosine needs no logits
and stays eager.

Every lens takes this path: a fitted lens's pre-norm transform (the tuned lens's W_l h + b_l, the Jacobian lens's
J_l h — one d × d product, ``readout.lens.TranslatedLens``) runs where the normed states are made
(``ReadoutChunk.normed_blocks`` / ``normed_rows``), and the kernel starts from those.

Two shapes: ``compiled_step`` reads one layer of a chunk of tokens (``score``'s path, where a chunk has hundreds
of rows), ``compiled_block`` a block of layers of a few rows at once (the sampler's step: one unembedding product
for the block, so W_U streams from memory once per block, then the fused log-softmax and divergences).
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Callable

import torch

from depthlens.config import Compile, Divergence
from depthlens.errors import DepthlensWarning, named
from depthlens.metrics.divergence import layer_divergence
from depthlens.metrics.layer_top import layer_top_k_of_logits
from depthlens.metrics.tcb_softmax import AnchoredSoftmax, anchored_softmax
from depthlens.readout.lens import LogitLens

FUSABLE: tuple[Divergence, ...] = ("jsd", "jsd-nat", "kl")

LayerStep = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]  # (normed [k, d], final log-probs [c, V], rows [k] of them to compare with) → [k]

BlockStep = Callable[
    [torch.Tensor, torch.Tensor], torch.Tensor
]  # (normed [k, c, d], final log-probs [c, V]) → [kinds, k, c]

TopBlockStep = Callable[
    [torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]
]  # as BlockStep, and each layer's top-K: → ([kinds, k, c], ids [k, c, K] int64, probabilities [k, c, K] float32)

# Per lens and kind (or tuple of kinds): the guarded compiled step (compiled once, reused for every chunk).
_CACHE: weakref.WeakKeyDictionary[LogitLens, dict[object, Callable]] = weakref.WeakKeyDictionary()


def use_compiled(setting: Compile, device: torch.device) -> bool:
    """Whether ``ReadoutConfig.compile`` asks for the compiled kernel on ``device`` from the start (``auto`` on a
    CPU may still choose it later, once the work has shown it pays: ``CompileRule``)."""
    return setting == "on" or (setting == "auto" and device.type == "cuda")


AUTO_COMPILE_AFTER_S = 600.0
"""``--compile auto`` on a CPU: CPU-seconds of eager readout after which the sampler compiles its kernel. The
rent-or-buy rule: on this CPU the fused kernel saves the sampler only the few per cent of its readout that are
not the unembedding product (which already runs at the core's float32 peak; docs/performance.md, "The sampler's
readout through the fused kernel"), so a compilation (≈ 25 CPU-s) pays back only after ≈ 600 s of readout. Past
that a run pays the compile once; before it, at most what it has already spent — never more than twice what the
better choice, made with hindsight, would have cost."""


@dataclasses.dataclass
class CompileRule:
    """When a sampler reads out through the compiled kernel: ``on`` always, ``off`` never, ``auto`` on CUDA
    always and on a CPU once ``AUTO_COMPILE_AFTER_S`` CPU-seconds of eager readout have run (``note`` adds
    them)."""

    setting: Compile
    device: torch.device
    spent_s: float = 0.0

    def note(self, seconds: float) -> None:
        self.spent_s += seconds

    @property
    def compiled(self) -> bool:
        return use_compiled(self.setting, self.device) or (
            self.setting == "auto" and self.spent_s >= AUTO_COMPILE_AFTER_S
        )


def _step(lens: LogitLens, kind: Divergence) -> LayerStep:
    def step(normed: torch.Tensor, final_logprobs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        logq = torch.log_softmax(lens.logits_from_normed(normed), dim=-1)
        # the eager path's own formula, traced and fused; the final rows are gathered inside the kernel (an
        # indirect load), so early exit's shrinking set of tokens needs no [k, V] copy of them per layer
        return layer_divergence(kind, final_logprobs[rows], logq)

    return step


def compiled_step(lens: LogitLens, kind: Divergence) -> LayerStep | None:
    """The compiled per-layer step for ``kind`` (None for cosine, which needs no logits): the divergence of each
    normed state to the final log-probs of its row in ``rows``."""
    if kind not in FUSABLE:
        return None
    steps = _CACHE.setdefault(lens, {})
    if kind not in steps:
        eager = _step(lens, kind)
        steps[kind] = _guarded(torch.compile(eager, dynamic=True), eager)
    return steps[kind]


def _block(lens: LogitLens, kinds: tuple[Divergence, ...]) -> BlockStep:
    def block(normed: torch.Tensor, final_logprobs: torch.Tensor) -> torch.Tensor:
        logq = torch.log_softmax(lens.logits_from_normed(normed), dim=-1)  # [k, c, V]
        return torch.stack([layer_divergence(kind, final_logprobs, logq) for kind in kinds])

    return block


def _top_block(lens: LogitLens, kinds: tuple[Divergence, ...], top_k: int) -> TopBlockStep:
    def block(
        normed: torch.Tensor, final_logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = lens.logits_from_normed(normed)  # [k, c, V]
        logq = torch.log_softmax(logits, dim=-1)
        values = [layer_divergence(kind, final_logprobs, logq) for kind in kinds]
        # selected on the logits by their block maxima (one more reduction over the logits the softmax reads),
        # normalised for the K selected only: no [k, c, V] pass of its own beyond that reduction
        ids, probs = layer_top_k_of_logits(logits, logq, top_k)
        return torch.stack(values) if values else logits.new_zeros(0, *logits.shape[:-1]), ids, probs

    return block


def compiled_block(
    lens: LogitLens, kinds: tuple[Divergence, ...], top_k: int = 0
) -> BlockStep | TopBlockStep:
    """The compiled step for a block of layers and the fusable ``kinds`` (all of ``FUSABLE``): one unembedding
    product for the block [k, c, d], each kind's divergence to the final log-probs [c, V] → [kinds, k, c]; with
    ``top_k`` = K > 0 also each layer's K most probable tokens (``metrics.layer_top.layer_top_k_of_logits``, from
    the same logits inside the same kernel) → ([kinds, k, c], ids [k, c, K], probabilities [k, c, K]). ``kinds``
    may then be empty (a cosine readout, whose divergence needs no logits, still gets its layers' top-k here)."""
    unfusable = [kind for kind in kinds if kind not in FUSABLE]
    if unfusable:
        raise ValueError(f"compiled_block: {unfusable} need no logits; compute them eagerly")
    steps = _CACHE.setdefault(lens, {})
    key = (kinds, top_k) if top_k else kinds
    if key not in steps:
        eager = _top_block(lens, kinds, top_k) if top_k else _block(lens, kinds)
        steps[key] = _guarded(torch.compile(eager, dynamic=True), eager)
    return steps[key]


_TCB: list[Callable] = []  # the compiled anchored softmax of δ_TCB, one per process (it holds no weights)


def compiled_tcb_softmax() -> Callable[..., AnchoredSoftmax]:
    """δ_TCB's elementwise half (``metrics.tcb_softmax.anchored_softmax``: the anchored softmax, its sums and the
    [2c, V] operand of its products, split for bf16 weights) as one compiled step, where the lens is compiled: on a
    GPU its dozen passes over [c, V] become a few fused reductions."""
    if not _TCB:
        _TCB.append(_guarded(torch.compile(anchored_softmax, dynamic=True), anchored_softmax))
    return _TCB[0]


def _guarded(compiled: Callable, eager: Callable) -> Callable:
    """Run the compiled step; if compiling fails (no C++ compiler, an unsupported op), warn once and run eager
    from then on — the same numbers, at eager speed."""
    failed = False

    @torch.no_grad()  # no graph, as every read: a wrapped model's weights may require grad (models.load.wrap)
    def run(*args: torch.Tensor) -> torch.Tensor:
        nonlocal failed
        if not failed:
            try:
                return compiled(*args)
            except Exception as exc:  # torch.compile raises many backend-specific types
                failed = True
                warnings.warn(  # a setting's warning: each front names the setting its own way
                    DepthlensWarning(
                        f"compiled readout unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                        f"using the eager path (same results, slower) — pass {named('compile', 'off')} to skip "
                        "the attempt",
                        setting="compile",
                    ),
                    stacklevel=2,
                )
        return eager(*args)

    return run
