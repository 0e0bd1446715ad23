"""Where a model name points — decided in milliseconds, before torch or transformers is imported.

A name is a catalogue entry, a ``.gguf`` file, a local model directory, or a Hugging Face hub id. A hub id is
only worth trying when the hub answers or the local Hugging Face cache holds it; otherwise the name points
nowhere and the error comes at once, not after the hub client's ~25 s of retries.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import urllib.parse
from pathlib import Path
from typing import Literal

from depthlens.errors import ModelNotFoundError
from depthlens.models import catalogue


@dataclasses.dataclass(frozen=True)
class ModelSource:
    kind: Literal["catalogue", "gguf", "directory", "hub"]
    path: Path | None = None  # the directory to load from (catalogue: None until installed)
    gguf_file: str | None = None
    offline: str | None = None  # hub ids only: why the hub is not used (then the local cache only)


@functools.cache
def _unreachable(host: str, port: int, timeout_s: float) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return True
    return False


def hub_offline_reason(timeout_s: float = 1.0) -> str | None:
    """Why the Hugging Face Hub cannot be used now (None when it can): ``HF_HUB_OFFLINE`` is set, or one TCP
    connection to it failed within ``timeout_s`` (probed once per process)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    endpoint = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    return f"the Hugging Face Hub ({host}) is unreachable" if _unreachable(host, port, timeout_s) else None


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except HFValidationError:  # not even a well-formed repo id
        return False


def locate(name: str) -> ModelSource:
    """Where ``name`` points, or a ModelNotFoundError that says what it is not."""
    if name in catalogue.CATALOGUE:
        return ModelSource(
            "catalogue", catalogue.converted_dir(name) if catalogue.is_installed(name) else None
        )
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {str(path)!r} does not exist")
        return ModelSource("gguf", path.parent, path.name)
    if path.is_dir():
        return ModelSource("directory", path)
    offline = hub_offline_reason()
    if offline is not None and not _in_hub_cache(name):
        raise ModelNotFoundError(
            f"could not load model {name!r}: not a catalogue name ({', '.join(catalogue.CATALOGUE)}), "
            f"not a local directory or .gguf file, and not in the local Hugging Face cache ({offline})"
        )
    return ModelSource("hub", offline=offline)
