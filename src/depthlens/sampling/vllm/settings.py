"""What the driver tells the engine's worker about the readout, as plain data (no vllm import).

Two channels, as vLLM provides them:
- engine-wide, in ``additional_config`` (``engine_readout_config``): that the worker captures the residual
  stream, and of how many layers. It is part of the hash vLLM keys its compile caches on, so a cached graph
  compiled without the capture is never handed back to an engine that needs it (and the other way round).
- per request, in ``SamplingParams.extra_args`` (``RequestReadout``): which positions are read out and how
  (window, divergence kinds, final norm, vocabulary cut, rows per unembedding product). Requests without it,
  and positions outside their window, cost the worker nothing beyond the capture itself.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple

from depthlens.config import Divergence, EngineConfig, ReadoutConfig

if TYPE_CHECKING:
    import torch

CONFIG_KEY = "depthlens_readout"  # additional_config key (engine-wide)
REQUEST_KEY = "depthlens_readout"  # SamplingParams.extra_args key (per request)
TAG_KEY = "depthlens_readout_tag"  # extra_args key naming the request in the drained readout


@dataclasses.dataclass(frozen=True)
class EngineReadout:
    """The engine-wide part: capture the residual stream after blocks 1..L−1 of an L-block model."""

    n_layers: int
    capture: str = "auto"  # auto | aux | hooks: how the worker takes the states (capture.install)

    def to_config(self) -> dict[str, Any]:
        return {CONFIG_KEY: {"n_layers": self.n_layers, "capture": self.capture}}

    @staticmethod
    def from_config(additional_config: Any) -> EngineReadout | None:
        data = additional_config.get(CONFIG_KEY) if isinstance(additional_config, dict) else None
        return EngineReadout(int(data["n_layers"]), str(data.get("capture", "auto"))) if data else None


@dataclasses.dataclass(frozen=True)
class RequestReadout:
    """One request's readout settings.

    Attributes:
        window: generated positions 0..window−1 are read out (None: every generated position).
        kinds: divergence kinds measured, the primary one first.
        final_norm: apply the model's final norm before the unembedding at layers < L (the logit lens).
        vocab: cut every layer's logits to this many rows (the tokenizer's length), as the transformers lens does.
        rows: token-layer rows per unembedding product (the memory budget's block size).
        prompt_from: prefill readout: the prompt's tokens from this index on are a completion, each read out at
            the position before it (teacher forcing); None for generation.
        float32_lens: norm and unembed the captured states in float32 (a float32 copy of the final norm and of
            the unembedding, made once per worker) where the engine runs in a lower precision; the states
            themselves stay the engine's.
        lens: a tuned lens's folder (absolute), whose translators the worker applies to layers 1..L−1 before the
            norm; None: the logit lens. The driver checked it against the model (``sampling.vllm.tuned``).
        lens_digest: that fit's digest: the worker refuses a folder that holds another fit by now.
        layer_top_k: also keep each read-out position's K most probable tokens at every layer, with their
            probabilities (``metrics.layer_top``), from the logits the divergences read; 0 keeps none.
        layer_target, track, layer_entropy: the per-layer quantities (``ReadoutConfig``'s fields of those names,
            ``metrics.layer_quantities``) of each read-out position, from the same log-probabilities; a generated
            position's target is the token the engine samples there, so the worker reads such rows after sampling.
    """

    window: int | None
    kinds: tuple[Divergence, ...] = ("jsd",)
    final_norm: bool = True
    vocab: int | None = None
    rows: int = 0
    prompt_from: int | None = None
    float32_lens: bool = False
    lens: str | None = None
    lens_digest: str | None = None
    layer_top_k: int = 0
    layer_target: bool = False
    track: tuple[int, ...] = ()
    layer_entropy: bool = False

    def to_extra(self) -> dict[str, Any]:
        return {
            REQUEST_KEY: dataclasses.asdict(self) | {"kinds": list(self.kinds), "track": list(self.track)}
        }

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> RequestReadout | None:
        data = (extra or {}).get(REQUEST_KEY)
        if not data:
            return None
        return cls(**{**data, "kinds": tuple(data["kinds"]), "track": tuple(data.get("track", ()))})

    @property
    def per_layer(self) -> bool:
        """Whether this request keeps per-layer quantities besides the divergences and the top-k."""
        return self.layer_target or bool(self.track) or self.layer_entropy

    def group(self) -> tuple[Any, ...]:
        """The settings rows must share to be read out in one lens walk (prefill rows also read the baselines).
        Not ``layer_top_k``: a walk takes its rows' largest K, and each row keeps its own first K of it."""
        return (
            self.kinds,
            self.final_norm,
            self.vocab,
            self.rows,
            self.prompt_from is not None,
            self.float32_lens,
            self.lens,
            self.lens_digest,
            self.layer_target,
            self.track,
            self.layer_entropy,
        )


class Taken(NamedTuple):
    """What the worker read out for one request (``depthlens_take``), row for row by position."""

    positions: list[int]  # in order
    rows: torch.Tensor  # [n, kinds, L] float32 divergences; a NaN row: a state was not finite
    base: torch.Tensor | None = None  # prefill readout: [n, 3] final-layer log p, entropy, self-certainty
    top_ids: torch.Tensor | None = None  # layer_top_k ≥ 1: [n, L, K] int32, each layer's top-k tokens
    top_probs: torch.Tensor | None = None  # [n, L, K] float32, their probabilities
    values: dict[str, torch.Tensor] | None = None  # the per-layer quantities: field → [n, L] or [n, L, m]


def request_readout(
    readout: ReadoutConfig,
    engine: EngineConfig,
    info: Any,
    model: Any = None,
    window: int | None = None,
    primary_only: bool = False,
) -> RequestReadout:
    """The one builder of a request's readout settings from the run's ``readout`` and ``engine`` configs — every
    in-engine caller's (``EngineGenerator``, ``EngineScorer``, the server's ``EngineDepth``), so what the worker
    runs is what the run asked for (``float32_lens`` included). ``info``: the model's ``ModelInfo``; ``model``: the
    loaded model where there is one (a tuned lens is checked against its own weights, else against the
    checkpoint's, before the engine starts); ``primary_only``: the primary divergence alone
    (teacher-forced scoring)."""
    from depthlens.config.readout import check_track
    from depthlens.readout.stream import chunk_sizes
    from depthlens.sampling.vllm.tuned import engine_lens

    vocab = readout.vocab_size or info.vocab_size
    check_track(readout.track, vocab, getattr(info, "name", "the model"))  # before the engine starts
    rows = chunk_sizes(readout, vocab, info.hidden_size, info.n_layers, 1)[
        1
    ]  # the memory budget's block size
    kinds = (readout.divergence,) if primary_only else (readout.divergence, *readout.also)
    lens = engine_lens(
        readout, info if model is None else model, info
    )  # checked against the model, before it starts
    return RequestReadout(
        window,
        kinds,
        readout.final_norm,
        vocab,
        rows,
        float32_lens=engine.float32_lens,
        layer_top_k=readout.layer_top_k,
        layer_target=readout.layer_target,
        track=tuple(readout.track),
        layer_entropy=readout.layer_entropy,
        lens=lens["lens"],
        lens_digest=lens["lens_digest"],
    )
