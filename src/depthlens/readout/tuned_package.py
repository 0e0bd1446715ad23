"""A tuned lens written by the ``tuned-lens`` package (``kind`` ``tuned-package``), read in its residual form.

Its folder holds ``config.json`` (``TunedLensConfig``: ``base_model_name_or_path``, ``d_model``,
``num_hidden_layers``, ``bias``, ``lens_type`` ``linear_tuned_lens``, ``unembed_hash``, …) and ``params.pt``, the
state dict of its translators — ``{i}.weight`` [d, d] and ``{i}.bias`` [d] for i = 0..L−1, translator i reading
``hidden_states[i]`` as h + W_i h + b_i (the package adds the translator's output to the state: "residual"). So
depthlens's layer l (1..L−1, the output of block l = ``hidden_states[l]``) reads through translator l, written here
as the affine map (I + W_l) h + b_l; translator 0 (the embeddings) is not read. ``params.pt`` is loaded with
``torch.load(weights_only=True)``: a file that needs pickled code is refused. The digest is ``params.pt``'s.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any, ClassVar

import torch

from depthlens.config import LensKind
from depthlens.readout.lens_files import Translators, refused

CONFIG = "config.json"
PARAMS = "params.pt"
FORM = "residual: h + W_l h + b_l (the tuned-lens package's)"


class TunedPackageFolder:
    """The ``tuned-lens`` package's folder (``readout.lens_files.LensFormat``)."""

    kind: ClassVar[LensKind] = "tuned-package"

    def holds(self, path: Path) -> bool:
        return (path / CONFIG).is_file() and (path / PARAMS).is_file()

    def weights_file(self, path: Path) -> Path:
        return path / PARAMS

    def read(self, path: Path, given: str) -> dict[str, Any]:
        """The stamp from ``config.json``: the model it names, L, d, whether translators have a bias."""
        try:
            config = json.loads((path / CONFIG).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise refused(given, f"{path / CONFIG} is not a tuned-lens config ({exc})") from None
        if (
            not isinstance(config, dict)
            or config.get("lens_type", "linear_tuned_lens") != "linear_tuned_lens"
        ):
            kind = config.get("lens_type") if isinstance(config, dict) else type(config).__name__
            raise refused(given, f"{path / CONFIG}: lens_type {kind!r}, not a linear_tuned_lens")
        n, d = config.get("num_hidden_layers"), config.get("d_model")
        if not (isinstance(n, int) and isinstance(d, int) and n >= 1 and d >= 1):
            raise refused(
                given, f"{path / CONFIG} gives no num_hidden_layers and d_model (whole numbers ≥ 1)"
            )
        return {
            "format": "tuned-lens-package",
            "form": FORM,
            "model": config.get("base_model_name_or_path"),
            "revision": config.get("base_model_revision"),
            "n_layers": n,
            "d": d,
            "bias": bool(config.get("bias", True)),
            "unembed_hash": config.get("unembed_hash"),
        }

    def load(self, path: Path, given: str) -> Translators:
        """Translators 1..L−1 as (I + W_l, b_l), float32; every refusal names the translator at fault."""
        stamp = self.read(path, given)
        n, d = stamp["n_layers"], stamp["d"]
        state = safe_state(path / PARAMS, given)
        expected = {f"{i}.weight" for i in range(n)} | (
            {f"{i}.bias" for i in range(n)} if stamp["bias"] else set()
        )
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or extra:
            what = "; ".join(
                p
                for p in (f"missing {missing[:4]}" if missing else "", f"extra {extra[:4]}" if extra else "")
                if p
            )
            raise refused(
                given, f"{path / PARAMS} does not hold the {n} translators its config names ({what})"
            )
        weight = torch.stack([_matrix(state, f"{i}.weight", (d, d), given) for i in range(1, n)])
        weight = weight + torch.eye(d)  # residual: h + W h = (I + W) h
        bias = (
            torch.stack([_matrix(state, f"{i}.bias", (d,), given) for i in range(1, n)])
            if stamp["bias"]
            else None
        )
        return Translators(weight, bias)


def safe_state(file: Path, given: str) -> dict[str, Any]:
    """``torch.load(file, weights_only=True)`` as a dict; a file that needs pickled code, or is no torch file, is
    refused naming the ``lens`` setting."""
    try:
        with warnings.catch_warnings():  # a bare pickle's protocol note: it is refused below, or read as data
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).splitlines()[0][:160]
        raise refused(
            given,
            f"{file} needs pickled code to load ({reason}); depthlens loads lenses with "
            "torch.load(weights_only=True) and refuses it — save plain tensors",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise refused(given, f"{file} is not a torch file ({str(exc).splitlines()[0][:160]})") from None
    if not isinstance(state, dict):
        raise refused(given, f"{file} holds a {type(state).__name__}, not a dict of tensors")
    return state


def _matrix(state: dict[str, Any], key: str, shape: tuple[int, ...], given: str) -> torch.Tensor:
    value = state[key]
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise refused(given, f"translator {key} is {got}, not {shape}")
    if not torch.isfinite(value).all():
        raise refused(given, f"translator {key} holds NaN or infinite values")
    return value.float()
