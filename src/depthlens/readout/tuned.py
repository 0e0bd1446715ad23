"""depthlens's own tuned lens on disk (``kind`` ``tuned``): the folder ``depthlens lens fit --out LENS`` writes.

It holds ``translators.safetensors`` (``weight`` [L−1, d, d], ``bias`` [L−1, d], float32: layer l is read from
W_l h + b_l), ``lens.json`` (the stamp: the model, its weights' fingerprint, L, d, the data, token counts, steps,
held-out KL per layer for the logit and the tuned lens, and ``digest``, the safetensors file's sha256) and, while a
fit is resumable, ``checkpoint.pt``. The fit itself is ``studies.lens_fit``. A lens fitted to another model —
another fingerprint, depth or width — is refused by name (``lens_files.check_fit``): its translators would read
nonsense without failing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, ClassVar

import torch

from depthlens.config import LensKind
from depthlens.readout.lens_files import (
    FINGERPRINT_VALUES,
    Translators,
    check_fit,
    file_digest,
    hidden_size,
    model_fingerprint,
    refused,
)

__all__ = [
    "CHECKPOINT", "FINGERPRINT_VALUES", "STAMP", "STAMP_FORMAT", "WEIGHTS", "TunedFolder", "check_fit",
    "file_digest", "hidden_size", "model_fingerprint", "save_lens", "write_whole",
]  # fmt: skip

STAMP_FORMAT = "depthlens-tuned-lens-1"
WEIGHTS = "translators.safetensors"
STAMP = "lens.json"
CHECKPOINT = "checkpoint.pt"


class TunedFolder:
    """depthlens's tuned-lens folder: W_l h + b_l (``readout.lens_files.LensFormat``)."""

    kind: ClassVar[LensKind] = "tuned"

    def holds(self, path: Path) -> bool:
        return (path / STAMP).is_file()

    def weights_file(self, path: Path) -> Path:
        return path / WEIGHTS

    def read(self, path: Path, given: str) -> dict[str, Any]:
        """The stamp of the lens folder ``path``; refused, naming the ``lens`` setting, when it is not one."""
        file = path / STAMP
        if not (file.is_file() and (path / WEIGHTS).is_file()):
            raise refused(
                given,
                f"no fitted lens there ({STAMP} and {WEIGHTS} expected, or a tuned-lens package's params.pt and "
                f"config.json); fit one with `depthlens lens fit --model MODEL --out {path}`",
            )
        try:
            stamp = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise refused(given, f"{file} is not a lens stamp ({exc}); fit the lens again") from None
        if not isinstance(stamp, dict) or stamp.get("format") != STAMP_FORMAT:
            raise refused(given, f"{file} is not a {STAMP_FORMAT} stamp; fit the lens again")
        return stamp

    def load(self, path: Path, given: str) -> Translators:
        from safetensors.torch import load_file

        tensors = load_file(str(path / WEIGHTS))
        weight, bias = tensors.get("weight"), tensors.get("bias")
        if weight is None or bias is None:
            raise refused(given, f"{path / WEIGHTS} holds no weight and bias; fit the lens again")
        return Translators(weight.float(), bias.float())


def save_lens(out: Path, weight: torch.Tensor, bias: torch.Tensor, stamp: dict[str, Any]) -> dict[str, Any]:
    """Write the translators and the stamp (``digest`` added: the safetensors file's sha256, as ``file_digest``
    reads it back) into the folder ``out``, both whole or neither (``write_whole``); returns the stamp."""
    from safetensors.torch import save

    out.mkdir(parents=True, exist_ok=True)
    # Written as bytes, not by save_file: its file is created mode 0600 whatever the umask (lens.json is 0644).
    data = save({"weight": weight.float().contiguous(), "bias": bias.float().contiguous()})
    stamp = {"format": STAMP_FORMAT, **stamp, "digest": hashlib.sha256(data).hexdigest()[:16]}
    write_whole({out / WEIGHTS: data, out / STAMP: (json.dumps(stamp, indent=1) + "\n").encode()})
    return stamp


def write_whole(files: dict[Path, bytes]) -> None:
    """Write each of ``files`` (path → bytes) whole: all to temporary names beside them, fsynced, then renamed in
    order. An OSError (a full disk) removes every temporary file and is raised naming the file it was for."""
    staged = {path: path.with_name(f".{path.name}.tmp") for path in files}
    try:
        for path, data in files.items():
            with staged[path].open("wb") as f:
                try:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                except OSError as exc:
                    exc.filename = str(path)
                    raise
        for path, tmp in staged.items():
            tmp.replace(path)
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
