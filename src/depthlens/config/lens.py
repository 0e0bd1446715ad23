"""Which lens reads the layers out, as one value: ``LensSpec`` — the lens's kind, where it lies, and once resolved
the digest of its fit and its stamp. ``ReadoutConfig`` carries it to every run, store and engine.

This room opens no file: ``LensSpec.parse`` reads the text a front was given (``logit``, ``tuned:PATH``,
``jacobian:PATH``); resolving it — which form a tuned lens's folder holds, its stamp read, its fit's digest taken —
is ``readout.lenses.resolve_lens``, called once where a run is built (``studies.resolve.readout``). A store's
manifest keeps ``str(spec)`` and the digest (``ReadoutConfig.to_dict``), so a resumed run compares both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from depthlens.config.base import Config, check_choice, invalid
from depthlens.errors import ConfigError

LensKind = Literal["logit", "tuned", "tuned-package", "jacobian"]
"""``logit``: each layer read through the final norm and unembedding as it is; ``tuned``: through depthlens's own
affine translator W_l h + b_l first (``depthlens lens fit``); ``tuned-package``: through the ``tuned-lens``
package's residual translator h + W_l h + b_l (its ``params.pt`` + ``config.json``); ``jacobian``: through the
Jacobian lens's J_l h (Gurnee et al. 2026; the published ``.pt`` artifact). docs/definitions.md §1."""

KINDS: tuple[LensKind, ...] = ("logit", "tuned", "tuned-package", "jacobian")

SPELLINGS: dict[str, LensKind] = {"tuned": "tuned", "tuned-package": "tuned-package", "jacobian": "jacobian"}
"""The prefixes a front may give a lens path with: ``tuned:PATH`` reads either tuned form (the folder says which:
``readout.lenses``), ``tuned-package:PATH`` insists on the package's, ``jacobian:PATH`` a J-lens artifact."""

REQUIREMENT = "must be logit, tuned:PATH or jacobian:PATH"
HINT = "tuned: a `depthlens lens fit` folder or a tuned-lens package folder; jacobian: a J-lens .pt artifact"


@dataclasses.dataclass(frozen=True, eq=False)
class LensSpec:
    """A lens as one value: ``kind``, the fitted lens's ``path`` (a folder or a file; None for the logit lens) and,
    resolved, its fit's ``digest`` and ``stamp`` (``readout.lenses.resolve_lens``). Compared by kind, path and
    digest — and equal to the text a store keeps for it (``LensSpec() == "logit"``, as the field was text before);
    the stamp rides along.

    ``kind`` is the form the path holds once resolved (``tuned`` or ``tuned-package`` for a ``tuned:PATH``), so
    ``str(spec)`` — what a store's manifest keeps — states the form."""

    kind: LensKind = "logit"
    path: str | None = None
    digest: str | None = None
    stamp: dict[str, Any] | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    @classmethod
    def parse(cls, text: str | LensSpec, digest: str | None = None) -> LensSpec:
        """``logit``, ``tuned:PATH``, ``tuned-package:PATH`` or ``jacobian:PATH`` (a ``LensSpec`` as it is), with
        a store's record of its ``digest``; anything else is refused naming the ``lens`` setting. Opens no
        file."""
        if isinstance(text, LensSpec):
            return (
                text
                if digest is None or text.digest is not None
                else dataclasses.replace(text, digest=digest)
            )
        if not isinstance(text, str):
            raise ConfigError(
                setting="lens", value=text, requirement=REQUIREMENT, owner="ReadoutConfig", hint=HINT
            )
        if text == "logit":
            return cls()
        prefix, _, path = text.partition(":")
        if prefix in SPELLINGS and path.strip():
            return cls(SPELLINGS[prefix], path.strip(), digest)
        raise ConfigError(
            setting="lens", value=text, requirement=REQUIREMENT, owner="ReadoutConfig", hint=HINT
        )

    @property
    def family(self) -> str:
        """The prefix a front gives this lens by: ``tuned`` for either tuned form, else the kind."""
        return "tuned" if self.kind == "tuned-package" else self.kind

    @property
    def resolved(self) -> bool:
        """Whether its stamp has been read (the logit lens has none to read)."""
        return self.path is None or self.stamp is not None

    def same_folder(self, other: LensSpec) -> bool:
        """Whether both name the same lens: the same family, and for a fitted lens the same path however it is
        spelled (``tuned:runs/l`` and ``tuned:./runs/l``)."""
        if self.path is None or other.path is None:
            return self.path is None and other.path is None
        return self.family == other.family and Path(self.path).resolve() == Path(other.path).resolve()

    def describe(self) -> str:
        """A few words for titles and tables: ``the logit lens``, ``the Jacobian lens (NAME)``."""
        if self.path is None:
            return "the logit lens"
        name = Path(self.path).name
        return {
            "tuned": f"the tuned lens ({name})",
            "tuned-package": f"the tuned lens ({name}, tuned-lens package)",
            "jacobian": f"the Jacobian lens ({name})",
        }[self.kind]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return str(self) == other
        if isinstance(other, LensSpec):
            return (self.kind, self.path, self.digest) == (other.kind, other.path, other.digest)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(str(self))  # equal specs, and a spec and its text, hash alike

    def __str__(self) -> str:
        return self.kind if self.path is None else f"{self.kind}:{self.path}"


JACOBIAN_SKIP_FIRST = 16
"""The J-lens estimator's leading positions read neither as source nor as target (attention sinks with atypical
residual statistics): the reference's and TransformerLens's ``skip_first_positions``, fixed by the SPEC."""

SaveDType = Literal["float16", "float32"]
"""The J-lens artifact's matrices on disk: ``float16`` as published (Jacobian entries are of order one, so it costs
little precision and halves the file), or ``float32``."""


@dataclasses.dataclass(frozen=True)
class JacobianFitConfig(Config):
    """How a Jacobian lens is fitted (``depthlens lens fit --kind jacobian``, ``studies.jacobian_fit``;
    docs/definitions.md §1).

    Attributes:
        prompts: prompts averaged into J (the reference: ~100 of 128 tokens is usable; published lenses use up to
            1,000). Each costs d backward passes over it: on a CPU, minutes (docs/performance.md).
        max_tokens: each prompt's length in tokens (the corpus is cut into windows of it); > 17, since the first
            ``JACOBIAN_SKIP_FIRST`` positions and the last are no source.
        heldout: prompts kept apart (never fitted on) for the held-out KL per layer the stamp records.
        max_seconds: the fit stops after the prompt running when this much wall time has passed, writes the lens
            of the prompts done and keeps its checkpoint (``--resume`` goes on).
        memory_mb: the backward's working memory; sets how many one-hot cotangents run in one batched backward
            (``readout.jacobian.dim_batch_for``). The model and one forward's graph come on top.
        checkpoint_every: prompts between checkpoints.
        seed: which corpus windows are drawn, and in what order.
        dtype: the artifact's matrices on disk (see ``SaveDType``).
    """

    prompts: int = 100
    max_tokens: int = 128
    heldout: int = 16
    max_seconds: float = 3600.0
    memory_mb: int = 512
    checkpoint_every: int = 1
    seed: int = 0
    dtype: SaveDType = "float16"

    def __post_init__(self) -> None:
        for name in ("prompts", "heldout", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise invalid("JacobianFitConfig", name, getattr(self, name), "must be ≥ 1")
        if self.max_tokens < JACOBIAN_SKIP_FIRST + 2:
            raise invalid(
                "JacobianFitConfig",
                "max_tokens",
                self.max_tokens,
                f"must be ≥ {JACOBIAN_SKIP_FIRST + 2}",
                f"the first {JACOBIAN_SKIP_FIRST} positions and the last are no source",
            )
        if not self.max_seconds > 0:
            raise invalid("JacobianFitConfig", "max_seconds", self.max_seconds, "must be > 0")
        if self.memory_mb < 16:
            raise invalid("JacobianFitConfig", "memory_mb", self.memory_mb, "must be ≥ 16")
        check_choice("JacobianFitConfig", "dtype", self.dtype, SaveDType)
