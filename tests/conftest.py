"""Tiny random-weight models, one per adapter row, built from configs: no test downloads anything."""

from __future__ import annotations

import functools
import os
import string
from pathlib import Path
from typing import Any

import pytest
import torch

from depthlens.config import EngineConfig
from depthlens.models import catalogue
from depthlens.sampling.choose import AUTO_ENV


@pytest.fixture(autouse=True)
def _torch_threads_as_found():
    """Every test leaves torch's intra-op thread count as it found it: a run's thread choice (models.threads) made
    by a test that calls a study function directly would otherwise carry into the next test, whose float32
    results then differ in the last digit from a fresh process's (tests/test_faults.py compares the two)."""
    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch._C.set_num_threads(
            before
        )  # torch's own: an in-process vLLM engine makes torch.set_num_threads a no-op


# `make test` installs the vllm extra, where `--backend auto` means vLLM: the suite's CLI runs on tiny models test
# the transformers sampler, as auto picks it without the extra; tests/test_vllm_backend.py names vllm itself.
os.environ[AUTO_ENV] = "hf"

V = 101  # tiny vocabulary
COMMON: dict[str, Any] = {
    "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 64, "vocab_size": V, "max_position_embeddings": 256,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
}  # fmt: skip
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}

# model_type → config overrides; every row of ADAPTERS must appear here (test_adapters checks).
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": {"n_embd": 32, "n_layer": 3, "n_head": 4, "n_positions": 256, "vocab_size": V,
             "bos_token_id": 1, "eos_token_id": 2},
    "gpt_neox": {**COMMON, "num_key_value_heads": 4},
    "llama": COMMON,
    "mistral": {**COMMON, "sliding_window": 16},
    "mixtral": {**COMMON, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": COMMON,
    "qwen2_moe": {**COMMON, **MOE, "shared_expert_intermediate_size": 32},
    "qwen3": {**COMMON, "head_dim": 8},
    "qwen3_moe": {**COMMON, **MOE, "head_dim": 8},
    "phi3": COMMON,
    "gpt_oss": {**COMMON, "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 16},
    "olmo2": COMMON,
    "smollm3": COMMON,
    "gemma": {**COMMON, "head_dim": 8},
    "gemma2": {**COMMON, "head_dim": 8, "final_logit_softcapping": 2.0, "sliding_window": 16},
    "gemma3_text": {**COMMON, "head_dim": 8, "final_logit_softcapping": 2.0, "sliding_window": 16},
    "gemma3": {**COMMON, "head_dim": 8, "final_logit_softcapping": 2.0, "sliding_window": 16},  # text part
    "phi": {**COMMON, "num_key_value_heads": 4},
    "granite": {**COMMON, "logits_scaling": 4.0},
    "cohere": {**COMMON, "logit_scale": 0.5},
    "stablelm": COMMON,
    "lfm2": {**COMMON, "layer_types": ["conv", "full_attention", "conv"], "block_multiple_of": 8},
    "opt": {**COMMON, "ffn_dim": 64, "word_embed_proj_dim": 32},
    "bloom": {"hidden_size": 32, "n_layer": 3, "n_head": 4, "vocab_size": V, "bos_token_id": 1, "eos_token_id": 2},
    "gptj": {"n_embd": 32, "n_layer": 3, "n_head": 4, "n_positions": 256, "rotary_dim": 4, "vocab_size": V,
             "bos_token_id": 1, "eos_token_id": 2},
    "gpt_neo": {"hidden_size": 32, "num_layers": 3, "num_heads": 4, "max_position_embeddings": 256,
                "attention_types": [[["global", "local"], 1], [["global"], 1]], "window_size": 16,
                "intermediate_size": 64, "vocab_size": V, "bos_token_id": 1, "eos_token_id": 2},
    "falcon": {**COMMON, "new_decoder_architecture": False, "multi_query": True, "alibi": False},
}  # fmt: skip


@functools.cache
def _build(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    if model_type == "gemma3":
        from transformers import Gemma3Config, Gemma3ForConditionalGeneration

        text = {**TINY_CONFIGS["gemma3"], **overrides}
        vision = {
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 28,
            "patch_size": 14,
        }
        config = Gemma3Config(
            text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=V - 1
        )
        torch.manual_seed(seed)
        return Gemma3ForConditionalGeneration(config).eval()
    config = AutoConfig.for_model(model_type, **{**TINY_CONFIGS[model_type], **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    # Random init gives near-uniform logits; a wider spread makes the divergences non-trivial.
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(4.0)
    return model.eval()


def tiny_model(model_type: str, **overrides: Any) -> Any:
    """A fresh-weights tiny model of ``model_type`` (cached per arguments; do not mutate)."""
    return _build(model_type, **overrides)


@pytest.fixture
def tiny_llama():
    from depthlens.models.load import wrap

    return wrap(tiny_model("llama"))


@pytest.fixture(scope="session")
def real_model():
    """The real default model; integration tests skip where it is not installed (`make model` installs it)."""
    if not catalogue.is_installed(catalogue.DEFAULT_MODEL):
        pytest.skip(f"{catalogue.DEFAULT_MODEL} not installed; run `make model`")
    from depthlens.models.load import load

    return load(catalogue.DEFAULT_MODEL, device="cpu")


# The engine of `smollm2_engine`: compiled (enforce_eager off), float32 so the values equal the transformers readout.
SMOLLM2_ENGINE = EngineConfig(backend="vllm", dtype="float32", max_model_len=512)


@pytest.fixture(scope="session")
def smollm2_engine(real_model):
    """One vLLM engine with the in-engine readout on the real default model (compiled, float32, sequences of up to
    512 tokens), shared by every vLLM test module of the session: a start costs ~15-45 s here once its graph is
    in vLLM's compile cache (the first start with a new setting compiles for minutes)."""
    from depthlens.sampling.choose import vllm_available

    if not vllm_available():
        pytest.skip("needs the vllm extra: pip install 'depthlens[vllm]'")
    from depthlens.models.info import info_of
    from depthlens.sampling.vllm.engine import JobSize, start_engine, stop_engine

    engine = start_engine(info_of(real_model), SMOLLM2_ENGINE, JobSize(8, 512))
    yield engine
    stop_engine(engine)


class CharTokenizer:
    """A character tokenizer for tiny models: ids 0–2 are pad/bos/eos, the rest spell ``ALPHABET`` cyclically,
    so random generations decode to digit strings that answer extraction and grading can work on."""

    ALPHABET = "0123456789 .-"
    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    chat_template = None

    def __len__(self) -> int:
        return V

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [3 + self.ALPHABET.index(c) if c in self.ALPHABET else 3 + len(self.ALPHABET) for c in text]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        special = {0: "<pad>", 1: "<s>", 2: "</s>"}
        return "".join(
            ("" if skip_special_tokens else special[i])
            if i in special
            else self.ALPHABET[(i - 3) % len(self.ALPHABET)]
            for i in ids
        )

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.decode([i]) for i in ids]

    def get_vocab(self) -> dict[str, int]:
        return {"<pad>": 0, "<s>": 1, "</s>": 2}


@pytest.fixture
def tiny_chat():
    """The tiny llama with a character tokenizer: enough for generation, grading and the sample store."""
    from depthlens.models.load import wrap

    return wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")


@pytest.fixture(scope="session")
def view_stores(tmp_path_factory):
    """Stores written by the CLI for the explorer's tests (``depthlens view``): see tests/view_stores.py."""
    from tests.view_stores import build_stores

    return build_stores(tmp_path_factory.getbasetemp() / "view-stores")


def char_tokenizer() -> Any:
    """A character-level fast tokenizer (101 tokens: the tiny models' vocabulary) with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for char in string.printable:
        if char not in "\x0b\x0c\r":
            vocab.setdefault(char, len(vocab))  # 101 tokens: the tiny model's vocabulary
    chars = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    chars.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    chars.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=chars, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    return tokenizer


def save_chat_model(path: Path) -> Path:
    """Save the tiny llama with the character tokenizer and its chat template at ``path``, where the CLI loads it."""
    tiny_model("llama").save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path
