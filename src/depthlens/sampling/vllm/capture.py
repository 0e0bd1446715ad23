"""Take the residual stream after every block out of vLLM's forward pass, in a way that survives compilation.

Python forward hooks do not run on a compiled vLLM model as one expects: registered after the engine starts they
are never called (the graph was traced without them), registered before they are traced into the graph once,
so their Python side effects (appending to a list) happen only at trace time, and a replayed CUDA graph runs no
Python at all. Two paths do survive, and both are set up in the worker's ``load_model``, after the weights are
loaded and before vLLM profiles and compiles the model:

- ``aux`` — EAGLE-3's auxiliary hidden states (``EagleModelMixin``: Llama, Mistral, Qwen2/3, Phi-3, …). The
  model's own forward returns ``hidden_states + residual`` (the residual stream, not vLLM's split pair) after
  each chosen block as outputs of the compiled graph; the runner keeps them in its execute state when
  ``use_aux_hidden_state_outputs`` is set. Every block 1..L−1 is chosen.
- ``hooks`` — for decoders without the mixin (Gemma 2/3): a forward hook per block whose only effect is a tensor
  copy of the stream into a persistent buffer ``[L − 1, max_num_batched_tokens, d]``. A copy into a tensor is a
  graph operation, not a Python side effect, so Dynamo traces it into the compiled graph (and a CUDA graph
  captures it); the buffer's rows of this step's tokens are then read after the forward.

Neither path changes what the engine samples. The states stay in the worker; ``lens.read_rows`` reduces them.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import torch
from torch import nn
from vllm.model_executor.models.interfaces import EagleModelMixin, supports_eagle3

from depthlens.errors import named
from depthlens.sampling.vllm.settings import EngineReadout

HINT = f"use {named('backend')} hf (the transformers readout), or report the model so its vLLM modules can be added"


class Capture(Protocol):
    kind: str
    norm: nn.Module

    def states(self, execute_state: Any, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The L − 1 residual states [k, d] at the batch's flat token rows ``flat``, after the forward."""
        ...


def decoder_of(model: nn.Module) -> nn.Module:
    """The module holding the blocks (``layers``) and the final ``norm`` of a vLLM causal LM."""
    inner: Any = model
    if hasattr(inner, "get_language_model"):
        inner = inner.get_language_model()
    elif hasattr(inner, "language_model"):
        inner = inner.language_model
    return getattr(inner, "model", inner)


class AuxCapture:
    """EAGLE-3's auxiliary hidden states after blocks 1..L−1, outputs of the compiled graph."""

    kind = "aux"

    def __init__(self, runner: Any, norm: nn.Module, n_layers: int) -> None:
        runner.get_model().set_aux_hidden_state_layers(tuple(range(1, n_layers)))
        runner.use_aux_hidden_state_outputs = True  # the runner keeps the states in its execute state
        self.norm = norm

    def states(self, execute_state: Any, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(a[flat] for a in execute_state.aux_hidden_states)


def _copy_stream(module: nn.Module, args: Any, output: Any, *, buffer: torch.Tensor, slot: int) -> None:
    # Pure tensor operations only: this body is traced into the compiled graph.
    hidden, residual = output if isinstance(output, tuple) else (output, None)
    stream = hidden if residual is None else hidden + residual
    buffer[slot, : stream.shape[0]].copy_(stream)


class HookCapture:
    """Forward hooks that copy each block's residual stream into a buffer, traced into the compiled graph."""

    kind = "hooks"

    def __init__(self, runner: Any, layers: nn.ModuleList, norm: nn.Module, n_layers: int) -> None:
        tokens = runner.vllm_config.scheduler_config.max_num_batched_tokens
        hidden = runner.vllm_config.model_config.get_hidden_size()
        dtype = runner.vllm_config.model_config.dtype
        self.buffer = torch.zeros(n_layers - 1, tokens, hidden, dtype=dtype, device=runner.device)
        for slot, block in enumerate(list(layers)[: n_layers - 1]):
            block.register_forward_hook(functools.partial(_copy_stream, buffer=self.buffer, slot=slot))
        self.norm = norm

    def states(self, execute_state: Any, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.buffer[:, flat].unbind(0))


def install(runner: Any, config: EngineReadout) -> Capture:
    """Set up the capture on the runner's freshly loaded model (before profiling and compilation)."""
    model = runner.get_model()
    decoder = decoder_of(model)
    name = runner.vllm_config.model_config.model
    layers, norm = getattr(decoder, "layers", None), getattr(decoder, "norm", None)
    if not isinstance(layers, nn.ModuleList) or not isinstance(norm, nn.Module):
        raise RuntimeError(
            f"depthlens: {name}: vLLM's {type(model).__name__} has no decoder with 'layers' and a final 'norm' "
            f"to read the residual stream of; {HINT}"
        )
    if len(layers) != config.n_layers or getattr(decoder, "start_layer", 0) != 0:
        raise RuntimeError(
            f"depthlens: {name}: the engine holds blocks {getattr(decoder, 'start_layer', 0)}.."
            f"{len(layers)} of {config.n_layers}; the in-engine readout needs every block in one process "
            f"(pipeline parallelism is not supported: use {named('tensor_parallel_size')})"
        )
    kind = config.capture
    if kind == "auto":
        kind = "aux" if supports_eagle3(model) and isinstance(decoder, EagleModelMixin) else "hooks"
    if kind == "aux":
        if not isinstance(decoder, EagleModelMixin):
            raise RuntimeError(
                f"depthlens: {name}: vLLM's {type(model).__name__} has no auxiliary hidden states"
            )
        return AuxCapture(runner, norm, config.n_layers)
    return HookCapture(runner, layers, norm, config.n_layers)
