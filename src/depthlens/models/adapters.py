"""Architecture knowledge, as data: one row per ``config.model_type``.

A row says where a family keeps its transformer blocks, its final norm and its unembedding, and what it does to
logits after the unembedding. Supporting a new family is one row here; the parametrized tiny-model test in
``tests/test_adapters.py`` picks it up. Paths are dotted attribute paths from the ``*ForCausalLM`` object; a
tuple lists alternatives tried in order (attribute names moved between transformers releases).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, cast

import torch
from torch import nn

from depthlens.errors import UnsupportedArchitectureError, named

Path = str | tuple[str, ...]
PostKind = Literal["softcap", "divide", "multiply"]


@dataclasses.dataclass(frozen=True)
class LogitPost:
    """Logit post-processing the model applies after ``lm_head``, read from a config attribute.

    ``softcap``: z ← c·tanh(z / c) (Gemma 2/3); ``divide``: z ← z / s (Granite); ``multiply``: z ← z·s (Cohere).
    A config value of None or 0 means the model skips it.
    """

    kind: PostKind
    config_attr: str


@dataclasses.dataclass(frozen=True)
class Adapter:
    """Where one architecture family keeps the parts the logit lens needs."""

    blocks: Path
    final_norm: Path
    unembed: Path
    logit_post: LogitPost | None = None
    # Hugging Face appends the *normalised* last block output as hidden_states[-1] for every family here.
    last_hidden_normed: bool = True


_DECODER = Adapter(blocks="model.layers", final_norm="model.norm", unembed="lm_head")
_SOFTCAP = LogitPost("softcap", "final_logit_softcapping")
_TRANSFORMER_H = Adapter(blocks="transformer.h", final_norm="transformer.ln_f", unembed="lm_head")

ADAPTERS: dict[str, Adapter] = {
    "gpt2": _TRANSFORMER_H,
    "gpt_neox": Adapter(
        blocks="gpt_neox.layers", final_norm="gpt_neox.final_layer_norm", unembed=("lm_head", "embed_out")
    ),
    "llama": _DECODER,
    "mistral": _DECODER,
    "mixtral": _DECODER,
    "qwen2": _DECODER,
    "qwen2_moe": _DECODER,
    "qwen3": _DECODER,
    "qwen3_moe": _DECODER,
    "phi3": _DECODER,
    "gpt_oss": _DECODER,
    "olmo2": _DECODER,
    "smollm3": _DECODER,
    "gemma": _DECODER,
    "gemma2": dataclasses.replace(_DECODER, logit_post=_SOFTCAP),
    "gemma3_text": dataclasses.replace(_DECODER, logit_post=_SOFTCAP),
    # The multimodal wrapper: its language model sits one level down, and its forward applies no soft-capping
    # (transformers 5), so neither does the lens — p_L must be what the model itself outputs.
    "gemma3": Adapter(
        blocks="model.language_model.layers", final_norm="model.language_model.norm", unembed="lm_head"
    ),
    "phi": Adapter(blocks="model.layers", final_norm="model.final_layernorm", unembed="lm_head"),
    "granite": dataclasses.replace(_DECODER, logit_post=LogitPost("divide", "logits_scaling")),
    "cohere": dataclasses.replace(_DECODER, logit_post=LogitPost("multiply", "logit_scale")),
    "stablelm": _DECODER,
    # LFM2 names its final norm after where the embedding would be tied; it is applied after the last block.
    "lfm2": Adapter(blocks="model.layers", final_norm="model.embedding_norm", unembed="lm_head"),
    # OPT with word_embed_proj_dim != hidden_size (opt-350m) projects after the norm: not covered by this row.
    "opt": Adapter(
        blocks="model.decoder.layers", final_norm="model.decoder.final_layer_norm", unembed="lm_head"
    ),
    "bloom": _TRANSFORMER_H,
    "gptj": _TRANSFORMER_H,
    "gpt_neo": _TRANSFORMER_H,
    "falcon": _TRANSFORMER_H,
}


@dataclasses.dataclass(frozen=True)
class LogitPostFn:
    """A resolved logit post-processing z ↦ post(z), with its elementwise derivative for exact Jacobians."""

    kind: PostKind
    scale: float

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        if self.kind == "softcap":
            return torch.tanh(z / self.scale) * self.scale
        return z / self.scale if self.kind == "divide" else z * self.scale

    def derivative(self, z: torch.Tensor) -> torch.Tensor:
        """d post(z) / dz, elementwise, same shape as ``z``."""
        if self.kind == "softcap":  # sech², not 1 − tanh², which cancels to 0 where tanh saturates
            return torch.cosh(z / self.scale).pow(-2)
        return torch.full_like(z, 1.0 / self.scale if self.kind == "divide" else self.scale)


@dataclasses.dataclass(frozen=True)
class ModelParts:
    """The resolved modules of one loaded model."""

    blocks: nn.ModuleList
    final_norm: nn.Module
    unembed: nn.Module
    logit_post: LogitPostFn | None
    last_hidden_normed: bool

    @property
    def n_layers(self) -> int:
        """L, the number of transformer blocks (layers are counted 1..L)."""
        return len(self.blocks)

    @property
    def unembed_weight(self) -> torch.Tensor:
        """The unembedding's weight [V, d]: a Linear's, or the tied input Embedding's."""
        weight = self.unembed.weight
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"the unembedding {type(self.unembed).__name__} has no weight tensor")
        return weight


def _get_path(root: nn.Module, path: str) -> object | None:
    obj: object = root
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _resolve(model: nn.Module, path: Path, what: str, model_type: str, flag: str) -> nn.Module:
    candidates = (path,) if isinstance(path, str) else path
    for candidate in candidates:
        found = _get_path(model, candidate)
        if isinstance(found, nn.Module):
            return found
    raise UnsupportedArchitectureError(
        f"model_type {model_type!r}: could not find the {what} at {' or '.join(candidates)}; "
        f"pass {named(flag)} with its dotted attribute path from {type(model).__name__}",
        owner="ModelSpec",
    )


def _unembedding(model: nn.Module, explicit: str | None, path: Path, model_type: str) -> nn.Module:
    """The unembedding at its path; where the row's path is missing, the model's own output embeddings."""
    if explicit:
        return _resolve(model, explicit, "unembedding", model_type, "unembed")
    try:
        return _resolve(model, path, "unembedding", model_type, "unembed")
    except UnsupportedArchitectureError:
        getter = getattr(
            model, "get_output_embeddings", None
        )  # transformers' models have it; nn.Module has not
        found = getter() if callable(getter) else None
        if isinstance(found, nn.Module):
            return found
        raise


def _make_post(post: LogitPost | None, config: object) -> LogitPostFn | None:
    if post is None:
        return None
    value = getattr(config, post.config_attr, None)
    return LogitPostFn(post.kind, float(value)) if value else None


def adapter_for(model_type: str) -> Adapter:
    """The table row for ``model_type``, or an error listing the known ones and the explicit way out."""
    try:
        return ADAPTERS[model_type]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} has no adapter (known: {', '.join(sorted(ADAPTERS))}); "
            f"pass {named('blocks')}, {named('final_norm')} and {named('unembed')} (dotted attribute paths, e.g. "
            "'model.layers', 'model.norm', 'lm_head'; the unembedding defaults to the model's output embeddings) "
            "or add a row in depthlens/models/adapters.py",
            owner="ModelSpec",
        ) from None


def resolve_parts(
    model: nn.Module,
    *,
    blocks: str | None = None,
    final_norm: str | None = None,
    unembed: str | None = None,
) -> ModelParts:
    """Locate blocks, final norm, unembedding and logit post-processing of ``model``.

    Explicit paths override the table; when all three are given an unknown architecture is accepted
    (with no logit post-processing, which the last-layer check in ``readout`` would expose). For an unknown
    architecture the unembedding may be left out: ``get_output_embeddings()`` supplies it.
    """
    config = model.config
    # Multimodal wrappers keep the language model's settings under text_config.
    text_config = getattr(config, "text_config", None) or config
    model_type = getattr(config, "model_type", "unknown")
    if blocks and final_norm and model_type not in ADAPTERS:
        row = Adapter(blocks=blocks, final_norm=final_norm, unembed=unembed or "lm_head")
    else:
        row = adapter_for(model_type)
    return ModelParts(
        blocks=cast(  # a ModuleList in every architecture the table knows
            nn.ModuleList, _resolve(model, blocks or row.blocks, "transformer blocks", model_type, "blocks")
        ),
        final_norm=_resolve(model, final_norm or row.final_norm, "final norm", model_type, "final_norm"),
        unembed=_unembedding(model, unembed, row.unembed, model_type),
        logit_post=_make_post(row.logit_post, text_config),
        last_hidden_normed=row.last_hidden_normed,
    )
