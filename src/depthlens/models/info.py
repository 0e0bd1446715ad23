"""What an engine-side backend needs to know about a model without loading its weights: the tokenizer and the
config (layers, vocabulary, context, end-of-turn ids, KV bytes per token).

``LoadedModel`` holds a transformers model for the readout; ``ModelInfo`` holds none — the vLLM backend reads
the layers out inside its own engine, so loading a second copy of the weights here would only cost memory.
Studies read ``name``, ``tokenizer`` and ``n_layers`` from either.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from depthlens.errors import ConfigError, InputError, ModelNotFoundError, named
from depthlens.models import catalogue
from depthlens.models.locate import locate

# End-of-turn markers of common chat templates (the same list ``sampling.generate.END_OF_TURN`` uses).
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|return|>")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}


def text_config(config: Any) -> Any:
    """The language model's own settings (multimodal wrappers keep them under ``text_config``)."""
    return getattr(config, "text_config", None) or config


def kv_bytes_per_token(config: Any, dtype: str = "bfloat16") -> int:
    """Bytes of KV cache one token takes in every layer: 2 (K, V) × L × KV heads × head size × dtype bytes.

    An upper bound for models with sliding-window or latent (MLA) attention, which store less.
    """
    text = text_config(config)
    heads = int(getattr(text, "num_attention_heads", 1))
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    return 2 * int(text.num_hidden_layers) * kv_heads * head_dim * _DTYPE_BYTES.get(dtype, 2)


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """A model as the vLLM backend sees it: where the engine loads it from, its tokenizer and its shapes.

    Attributes:
        name: as the user gave it (a catalogue name, a directory, a hub id).
        source: what the engine loads (a catalogue entry's safetensors directory, a directory, a hub id).
        tokenizer: the model's tokenizer (prompts, decoding, the vocabulary the lens is cut to).
        config: the transformers config (shapes only; no weights are read).
        end_ids: token ids that end a response (eos ids and known end-of-turn markers).
    """

    name: str
    source: str
    tokenizer: Any
    config: Any
    end_ids: frozenset[int]
    model: None = None  # no weights: code that needs a transformers model must not get this object

    @property
    def n_layers(self) -> int:
        return int(text_config(self.config).num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(text_config(self.config).hidden_size)

    @property
    def vocab_size(self) -> int:
        """The vocabulary the lens reads: the tokenizer's length (padded embedding rows are cut, as in
        ``readout.stream.lens_for``)."""
        return len(self.tokenizer)

    @property
    def vocab_rows(self) -> int:
        """The embedding's rows (padding included): every token id the model can sample is below it."""
        return max(int(getattr(text_config(self.config), "vocab_size", 0) or 0), self.vocab_size)

    @property
    def max_positions(self) -> int | None:
        text = text_config(self.config)
        for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(text, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    def validate(self, prompt: list[int], budget: int, what: str) -> None:
        """Refuse a prompt the engine cannot take: empty, token ids outside the vocabulary, too long."""
        if not prompt:
            raise InputError(f"{what}: the prompt is empty; give at least one prompt token (e.g. the BOS)")
        rows = int(getattr(text_config(self.config), "vocab_size", 0) or self.vocab_size)
        bad = [i for i in prompt if not 0 <= i < rows]
        if bad:
            raise InputError(
                f"{what}: token id(s) {bad[:5]} outside {self.name}'s vocabulary of {rows}; token ids must come "
                "from this model's tokenizer"
            )
        limit = self.max_positions
        if limit is not None and len(prompt) + budget > limit:
            raise InputError(
                f"{what}: {len(prompt) + budget} tokens exceed {self.name}'s context of {limit}; shorten the "
                f"prompt or lower {named('max_new_tokens')}"
            )


def _end_ids(source: str, config: Any, tokenizer: Any) -> frozenset[int]:
    from transformers import GenerationConfig

    ids: set[int] = set()
    try:
        eos = GenerationConfig.from_pretrained(source).eos_token_id
    except (OSError, ValueError):
        eos = getattr(text_config(config), "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    ids.update(vocab[m] for m in END_OF_TURN if m in vocab)
    return frozenset(int(i) for i in ids)


def sampling_defaults(model: Any) -> tuple[float, float, str]:
    """The temperature and top-p for a request that gives none, and where they come from: those the model's
    ``generation_config`` sets (as vLLM's ``--generation-config auto`` reads them), else depthlens's own
    (``SamplingConfig``: 0.6 / 0.95, what every command samples with). ``model``: a ``LoadedModel`` or a
    ``ModelInfo``."""
    from depthlens.config import SamplingConfig

    config = getattr(getattr(model, "model", None), "generation_config", None)
    if config is None and isinstance(model, ModelInfo):
        from transformers import GenerationConfig

        try:
            config = GenerationConfig.from_pretrained(model.source)
        except (OSError, ValueError):
            config = None
    # a config transformers derived from the model's own (no generation_config.json) sets no sampling
    chosen = {} if config is None or getattr(config, "_from_model_config", False) else config.to_diff_dict()
    temperature, top_p = chosen.get("temperature"), chosen.get("top_p")
    if temperature is None and top_p is None:
        return SamplingConfig.temperature, SamplingConfig.top_p, "depthlens's defaults"
    return (
        float(temperature if temperature is not None else SamplingConfig.temperature),
        float(top_p if top_p is not None else SamplingConfig.top_p),
        "the model's generation_config",
    )


def load_info(
    name: str = catalogue.DEFAULT_MODEL,
    trust_remote_code: bool = False,
    progress: Callable[[str], None] = lambda _: None,
) -> ModelInfo:
    """The tokenizer and config of ``name`` (a catalogue entry is installed on first use); no weights.

    A ``.gguf`` file is refused here: vLLM loads safetensors directories (the transformers backend reads it).
    """
    source = locate(name)
    if source.kind == "gguf":
        raise ConfigError(
            f"{name}: {named('backend', 'vllm')} loads safetensors model directories, not a .gguf file; convert it, "
            f"use a catalogue name (its cached safetensors copy is used), or {named('backend', 'hf')}"
        )
    from transformers import AutoConfig, AutoTokenizer

    if source.kind == "catalogue":
        target = str(catalogue.install(name, progress))
    else:
        target = str(source.path) if source.path is not None else name
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if source.offline:
        kwargs["local_files_only"] = True
    try:
        config = AutoConfig.from_pretrained(target, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(target, **kwargs)
    except (OSError, ValueError) as exc:
        said = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(
            f"could not read the config and tokenizer of model {name!r}: {said}"
        ) from exc
    if not hasattr(text_config(config), "num_hidden_layers"):
        raise ConfigError(f"model {name!r}: its config names no num_hidden_layers; use {named('backend')} hf")
    return ModelInfo(name, target, tokenizer, config, _end_ids(target, config, tokenizer))


def info_of(lm: Any) -> ModelInfo:
    """``ModelInfo`` of an already loaded model (``LoadedModel``): its tokenizer, its config, its source."""
    if isinstance(lm, ModelInfo):
        return lm
    name = lm.name
    path = Path(name).expanduser()
    source = (
        str(catalogue.install(name)) if name in catalogue.CATALOGUE else str(path) if path.is_dir() else name
    )
    config = lm.model.config
    if lm.tokenizer is None:
        raise InputError(f"model {name} has no tokenizer; the vLLM backend needs one")
    return ModelInfo(name, source, lm.tokenizer, config, _end_ids(source, config, lm.tokenizer))


def kv_cache_bytes(
    per_token: int, requests: int, longest: int, block: int = 128, margin: float = 1.25
) -> int:
    """KV cache for ``requests`` concurrent sequences of up to ``longest`` tokens: whole blocks each, × margin."""
    blocks = requests * math.ceil(longest / block) + 1
    return int(blocks * block * per_token * margin)
