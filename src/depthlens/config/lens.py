"""Which lens reads the layers out, resolved once: ``logit``, or ``tuned:PATH`` parsed, its stamp read and its fit's
digest taken — the one value (``LensSpec``) that ``ReadoutConfig`` carries to every run, store and engine.

A tuned-lens folder (``depthlens lens fit --out LENS``) holds ``translators.safetensors`` and ``lens.json``, the
stamp (the model's fingerprint, L, d, the fit's numbers and ``digest``, the safetensors file's sha256). Reading
the stamp is the only file this room opens: a ``ReadoutConfig`` naming a tuned lens is built with its digest, so
no store can be written without it (``readout.tuned`` checks the fit against a loaded model).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

from depthlens.errors import ConfigError, InputError, named

LensKind = Literal["logit", "tuned"]
"""``logit``: each layer read through the final norm and unembedding as it is; ``tuned``: through a per-layer affine
translator A_l h + b_l first (the tuned lens, Belrose et al. 2023; fitted by ``depthlens lens fit``)."""

STAMP_FORMAT = "depthlens-tuned-lens-1"
WEIGHTS = "translators.safetensors"
STAMP = "lens.json"


@dataclasses.dataclass(frozen=True)
class LensSpec:
    """A lens as one value: ``kind``, a tuned lens's folder ``path``, and — resolved — its fit's ``digest`` and
    ``stamp`` (``resolve``). Compared and hashed by kind, folder and digest."""

    kind: LensKind = "logit"
    path: str | None = None  # the fitted lens's directory (``tuned`` only)
    digest: str | None = None
    stamp: dict[str, Any] | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> LensSpec:
        """``logit`` or ``tuned:PATH``; anything else is refused naming the ``lens`` setting."""
        if text == "logit":
            return cls()
        if text.startswith("tuned:") and text.removeprefix("tuned:").strip():
            return cls("tuned", text.removeprefix("tuned:").strip())
        raise ConfigError(
            setting="lens",
            value=text,
            requirement="must be logit or tuned:PATH",
            owner="ReadoutConfig",
            hint="PATH: a `depthlens lens fit --out` folder",
        )

    def resolve(self, digest: str | None = None) -> LensSpec:
        """This lens with its stamp read and its digest taken (the logit lens as it is); ``digest`` — a store's
        record of the fit — refuses a folder that holds another fit by now."""
        if self.path is None:
            return self
        stamp = read_stamp(Path(self.path))
        if digest not in (None, stamp["digest"]):
            raise InputError(
                setting="lens",
                value=str(self),
                requirement=f"the lens there is fit {stamp['digest']}, not {digest} that this store was read "
                "with; write a new store, or restore that lens",
            )
        return dataclasses.replace(self, digest=stamp["digest"], stamp=stamp)

    def same_folder(self, other: LensSpec) -> bool:
        """Whether both name the same lens: the same kind, and for a tuned lens the same folder however it is
        spelled (``tuned:runs/l`` and ``tuned:./runs/l``)."""
        if self.path is None or other.path is None:
            return self.path is None and other.path is None
        return Path(self.path).resolve() == Path(other.path).resolve()

    def __str__(self) -> str:
        return self.kind if self.path is None else f"{self.kind}:{self.path}"


def read_stamp(path: Path) -> dict[str, Any]:
    """The stamp of the lens folder ``path``; InputError naming the ``lens`` setting when it is not one."""
    file = path / STAMP
    given = f"tuned:{path}"
    if not (file.is_file() and (path / WEIGHTS).is_file()):
        raise InputError(
            setting="lens",
            value=given,
            requirement=f"no fitted lens there ({STAMP} and {WEIGHTS} expected); fit one with `depthlens lens "
            f"fit {named('model')} MODEL {named('out')} {path}`",
        )
    try:
        stamp = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(
            setting="lens", value=given, requirement=f"{file} is not a lens stamp ({exc}); fit the lens again"
        ) from None
    if not isinstance(stamp, dict) or stamp.get("format") != STAMP_FORMAT:
        raise InputError(
            setting="lens",
            value=given,
            requirement=f"{file} is not a {STAMP_FORMAT} stamp; fit the lens again",
        )
    return stamp
