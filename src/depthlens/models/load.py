"""Load a causal LM from a catalogue name, a local directory, a .gguf file or a Hugging Face id."""

from __future__ import annotations

import contextlib
import dataclasses
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError

from depthlens.errors import (
    ConfigError,
    DepthlensError,
    InputError,
    ModelInstallError,
    ModelNotFoundError,
    named,
)
from depthlens.models import catalogue
from depthlens.models.adapters import ModelParts, resolve_parts
from depthlens.models.allocator import keep_freed_memory
from depthlens.models.locate import hub_offline_reason, locate

DType = Literal["auto", "float32", "bfloat16", "float16"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass(frozen=True, repr=False)  # the default repr would print the whole module tree
class LoadedModel:
    """A model ready for readout: the module, its tokenizer (None for tokenizer-less test models) and parts."""

    model: Any  # a transformers PreTrainedModel
    tokenizer: Any | None
    parts: ModelParts
    name: str

    @property
    def n_layers(self) -> int:
        """L, the number of transformer blocks."""
        return self.parts.n_layers

    @property
    def vocab_rows(self) -> int:
        """The unembedding's rows: every token id the model can sample is below it (stores record it, so a
        stored token id at or past it is refused as damage)."""
        weight = getattr(self.parts.unembed, "weight", None)
        if weight is not None:
            return int(weight.shape[0])
        return int(getattr(self.model.config, "vocab_size", 0) or len(self.tokenizer or ()))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def text_tokenizer(self, work: str) -> Any:
        """The tokenizer, for ``work`` on text; an ``InputError`` naming the model and the work where it has none."""
        if self.tokenizer is None:
            raise InputError(f"model {self.name} has no tokenizer; {work} needs one")
        return self.tokenizer

    def __repr__(self) -> str:
        """One line: ``LoadedModel('smollm2-135m-instruct': llama, L=30, d=576, vocab 49152, float32 on cpu,
        weights Q4_1, dequantised to float32)``."""
        from depthlens.models.precision import precision_of

        config = getattr(self.model.config, "text_config", None) or self.model.config
        vocab = len(self.tokenizer) if self.tokenizer is not None else getattr(config, "vocab_size", "?")
        precision = precision_of(self)
        return (
            f"LoadedModel({self.name!r}: {getattr(config, 'model_type', type(self.model).__name__)}, "
            f"L={self.n_layers}, d={getattr(config, 'hidden_size', '?')}, vocab {vocab}, "
            f"{precision['compute_dtype']} on {self.device}, weights {precision['weights']})"
        )

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model accepts, where its config says."""
        config = getattr(self.model.config, "text_config", None) or self.model.config
        for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(config, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        return None


def _available(kind: str) -> bool:
    backend = {
        "cuda": torch.cuda,
        "mps": getattr(torch.backends, "mps", None),
        "xpu": getattr(torch, "xpu", None),
    }
    module = backend.get(kind)
    return kind == "cpu" or (module is not None and bool(module.is_available()))


_NAMES = {"cuda": "CUDA", "mps": "MPS", "xpu": "XPU"}  # as users know the backends


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when present, else CPU; cpu, cuda[:N], mps and xpu[:N] where this machine has them."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device {device!r} is not a torch device; use auto, cpu, cuda or cuda:N") from None
    if resolved.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ConfigError(f"device {device!r} cannot hold a model to read out; use auto, cpu, cuda or cuda:N")
    if not _available(resolved.type):
        raise ConfigError(
            f"device {device!r} asked for, but {_NAMES.get(resolved.type, resolved.type)} is not available here; "
            f"use {named('device')} cpu"
        )
    if resolved.index is not None and resolved.type in ("cuda", "xpu"):
        count = getattr(torch, resolved.type).device_count()
        if resolved.index >= count:
            raise ConfigError(
                f"device {device!r} asked for, but this machine has {count} {resolved.type} device(s)"
            )
    return resolved


def resolve_dtype(dtype: DType, device: torch.device) -> torch.dtype:
    """``auto`` → float32 on CPU (bf16 matmuls are slow there), bfloat16 on accelerators."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ConfigError(f"dtype {dtype!r} is not one of auto, {', '.join(_DTYPES)}") from None


def wrap(
    model: Any,
    tokenizer: Any | None = None,
    *,
    name: str | None = None,
    blocks: str | None = None,
    final_norm: str | None = None,
    unembed: str | None = None,
) -> LoadedModel:
    """Wrap an already-constructed model (e.g. one built from a config in a test) for readout.

    The model is put in eval mode (no dropout: a readout must not vary run to run), and its parameters are left
    as they are — their ``requires_grad`` flags and values are the caller's. Every read runs under
    ``torch.inference_mode``, so none builds an autograd graph whatever the flags say.
    """
    model.eval()
    parts = resolve_parts(model, blocks=blocks, final_norm=final_norm, unembed=unembed)
    return LoadedModel(model=model, tokenizer=tokenizer, parts=parts, name=name or type(model).__name__)


@contextlib.contextmanager
def frozen(model: Any) -> Iterator[None]:
    """``model``'s parameters not requiring grad for the duration, each flag as it was afterwards: for a
    computation that needs autograd for its own tensors (a tuned lens's translators) and must leave a caller's
    model untouched — no ``.grad`` accumulated on its weights, its ``requires_grad`` flags its own."""
    thawed = [p for p in model.parameters() if p.requires_grad]
    for p in thawed:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in thawed:
            p.requires_grad_(True)


def load(
    name: str = catalogue.DEFAULT_MODEL,
    *,
    device: str = "auto",
    dtype: DType = "auto",
    trust_remote_code: bool = False,
    blocks: str | None = None,
    final_norm: str | None = None,
    unembed: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
    on_offline: Callable[[str], None] = lambda _: None,
) -> LoadedModel:
    """Load ``name`` for readout.

    Args:
        name: a catalogue name (``depthlens models``; installed on first use), a ``.gguf`` file, a local
            model directory, or a Hugging Face hub id.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N``.
        dtype: weights dtype; readout probabilities are float32 whatever this is.
        trust_remote_code: allow the checkpoint's own Python code (off unless asked).
        blocks: dotted path to the transformer blocks, for architectures without an adapter row.
        final_norm: dotted path to the final norm, likewise.
        unembed: dotted path to the unembedding, likewise.
        progress: called with a line of text at each slow step.
        on_offline: told, in a sentence, when a hub id is looked up in the local cache only because the hub is
            unreachable (or ``HF_HUB_OFFLINE`` is set).
    """
    source = locate(name)  # an unknown name fails here, before any weight is read
    keep_freed_memory()  # readout buffers are reused, not page-faulted in again per chunk (models/allocator.py)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if source.kind == "catalogue":
        target = str(catalogue.install(name, progress))
    else:
        target = str(source.path) if source.path is not None else name
    if source.gguf_file:
        kwargs["gguf_file"] = source.gguf_file
    if source.offline:
        # Go offline at once rather than let the hub client retry for ~25 s.
        on_offline(f"{source.offline}; looking for {name!r} in the local Hugging Face cache only")
        kwargs["local_files_only"] = True
    progress(f"loading {name}")
    model, tokenizer = _from_pretrained(name, target, source, kwargs)
    if getattr(model, "hf_quantizer", None) is not None and source.gguf_file:
        model.hf_quantizer = None  # GGUF weights are dequantised on load; nothing quantised remains
    model.to(torch_device)
    model.requires_grad_(False)  # a model we loaded is ours: no read of it needs parameter gradients
    return wrap(model, tokenizer, name=name, blocks=blocks, final_norm=final_norm, unembed=unembed)


def _from_pretrained(name: str, target: str, source: Any, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """The model and its tokenizer (None where it has none) from ``target``; errors say what the file or name is."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok_kwargs = {
            k: kwargs[k] for k in ("gguf_file", "local_files_only", "trust_remote_code") if k in kwargs
        }
        model = AutoModelForCausalLM.from_pretrained(target, **kwargs)
        try:
            tokenizer = AutoTokenizer.from_pretrained(target, **tok_kwargs)
        except (OSError, ValueError):
            tokenizer = None
    except OSError as exc:
        if source.kind != "hub":
            raise _unreadable(name, exc) from exc
        said = _first_line(exc)
        hub = f"and its local cached copy failed: {said}" if source.offline else f"and the hub said: {said}"
        raise ModelNotFoundError(
            f"could not load model {name!r}: not a catalogue name ({', '.join(catalogue.CATALOGUE)}), "
            f"not a local directory or .gguf file, {hub}"
        ) from exc
    except (ValueError, RuntimeError, struct.error, EOFError, KeyError, SafetensorError) as exc:
        # A file that is cut short or is not a model: GGUF parsing, safetensors headers, shape mismatches.
        raise _unreadable(name, exc) from exc
    return model, tokenizer


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _unreadable(name: str, exc: BaseException) -> DepthlensError:
    """The error for a model that exists but does not load: a damaged catalogue copy, or a bad file."""
    kind = "struct.error" if isinstance(exc, struct.error) else type(exc).__name__  # a file cut short
    why = f"{kind}: {_first_line(exc)}"
    if name in catalogue.CATALOGUE:
        damage = catalogue.damage(name, deep=True)
        state = f"its installed copy is damaged ({damage})" if damage else "its installed copy does not load"
        return ModelInstallError(f"model {name!r}: {state} — {why}; {catalogue.reinstall_hint(name)}")
    return ModelNotFoundError(
        f"could not load model {name!r}: the file is cut short or is not a model ({why}); "
        "check the file (a whole .gguf, or a directory with config.json and weights) or download it again"
    )


def load_tokenizer(name: str, trust_remote_code: bool = False) -> Any | None:
    """Only the tokenizer of ``name`` (to label stored token ids without loading weights); None if unavailable.

    Catalogue models are looked up in the local cache only — nothing is downloaded or installed here.
    """
    from transformers import AutoTokenizer

    path = Path(name).expanduser()
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if name in catalogue.CATALOGUE:
        if not catalogue.is_installed(name):
            return None
        target = catalogue.converted_dir(name)
    elif path.suffix == ".gguf":
        target, kwargs["gguf_file"] = path.parent, path.name
    elif path.is_dir():
        target = path
    else:
        target = Path(name)
        if hub_offline_reason() is not None:  # the local cache only: no ~25 s of hub retries
            kwargs["local_files_only"] = True
    try:
        return AutoTokenizer.from_pretrained(str(target), **kwargs)
    except (OSError, ValueError):
        return None
