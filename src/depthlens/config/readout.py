"""How hidden states become divergences, settling depths and DTR, and the Token Constraint Bound's settings
(docs/definitions.md §1–2, §6)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal, Self

from depthlens.config.base import Config, check_choice, invalid
from depthlens.config.lens import LensSpec
from depthlens.errors import InputError, named

Divergence = Literal["jsd", "jsd-nat", "kl", "cosine"]
"""``jsd``: Jensen–Shannon divergence in bits (base 2, bounded by 1); ``jsd-nat``: the same in nats;
``kl``: KL(p_L ‖ p_l) in nats; ``cosine``: 1 − cos(norm(h_l), norm(h_L))."""

DIVERGENCE_MAX: dict[str, tuple[float, str]] = {
    "jsd": (1.0, "1 bit"),
    "jsd-nat": (math.log(2), "ln 2 ≈ 0.693 nats"),
    "cosine": (2.0, "2"),
}
"""The largest value each bounded divergence can take (KL is unbounded), and how to say it."""

PREFIX_TOKENS = 50
"""ℓ_prefix, the paper's prefix length in generated tokens: what Think@n ranks by (``VotingConfig.rank_prefix``),
what online Think@n decides at (``OnlineConfig.decision_prefix``), what a sample store's ``dtr_prefix`` covers
unless told (``depth_prefix``), and so how many tokens a sample reads out at every layer unless told
(``SamplingConfig.readout_tokens``, the server's ``--readout-tokens``)."""

MAX_LAYER_TOP_K = 100
"""The most tokens per layer ``ReadoutConfig.layer_top_k`` keeps: K ids and K probabilities per read-out token and
layer (12 bytes each in memory); more is a vocabulary dump, not a lens (docs/performance.md)."""

MAX_TRACK = 100
"""The most token ids ``ReadoutConfig.track`` follows through the layers: M log-probabilities and ranks per read-out
token and layer (a rank costs one pass over the vocabulary per id); more is a vocabulary dump, not a lens."""

Compile = Literal["auto", "on", "off"]
"""``auto``: a compiled (fused) readout kernel on CUDA, eager elsewhere; ``on``: compiled on any device (on a
CPU it pays ~20 s of compilation once, then runs at the matmul's pace); ``off``: eager everywhere."""

DeepRule = Literal["spec", "paper-literal"]
"""``spec``: deep when c_t ≥ ⌈ρ·L⌉ (docs/definitions.md §2, the paper's figures); ``paper-literal``: c_t ≥ ⌈(1−ρ)·L⌉
(the paper's Algorithm 1 as printed)."""


@dataclasses.dataclass(frozen=True)
class ReadoutConfig(Config):
    """How hidden states become per-layer distributions and divergences (docs/definitions.md §1).

    Attributes:
        divergence: which divergence to the final layer is measured (see ``Divergence``).
        final_norm: apply the model's final norm before the unembedding at layers < L (the logit lens);
            False is the ``--no-final-norm`` ablation, never the default.
        memory_mb: budget for the readout's working tensors (vocab-sized chunks and the forward segment);
            chunk sizes are derived from it so peak memory does not grow with sequence length or depth. None =
            fit the device: 512 MB on a CPU, a quarter of the free memory on a GPU (at most 16 GiB;
            ``readout.stream.budget_mb``). A budget changes how the work is cut, not its results (float32
            rounding aside), so a store resumes under another one.
        compile: fuse unembedding, log-softmax and divergence into one compiled kernel per layer (see
            ``Compile``); falls back to eager, with a warning, where compilation is unavailable.
        early_exit: when only sequence scores are asked (no per-token divergences), walk each token's layers
            only up to its settling depth — the same results, fewer unembedding products.
        also: further divergences measured in the same layer walk and stored beside the primary one (the
            KL / cosine ablation of the correlation study costs no extra unembedding product).
        vocab_size: cut logits to this many rows (padded vocabularies); None = the tokenizer's length.
        lens: which lens reads the layers out (``config.lens.LensSpec``): the logit lens, a tuned lens or a
            Jacobian lens. Given as text (``logit``, ``tuned:PATH``, ``jacobian:PATH``) it is parsed, no file
            read; a run's config holds it resolved — its form found, its stamp read, its fit's digest taken, once,
            where the run is built (``studies.resolve.readout`` → ``readout.lenses.resolve_lens``). ``to_dict``
            keeps it as the text ``lens`` and its fit's ``lens_digest``, so a store records *which* fit read it;
            ``from_dict`` reads both back (a path that holds another fit by now is refused when it is read).
        layer_top_k: keep each read-out token's K most probable tokens at every layer, with their probabilities
            (``layer_top_ids`` / ``layer_top_probs``, [T][L][K]: the logit lens's own predictions,
            ``metrics.layer_top``); 0 keeps none. At most ``MAX_LAYER_TOP_K``.
        layer_target: keep the target trajectory — the read-out token's own log-probability (natural log) and
            rank (0 = most probable; ties share the better rank) at every layer (``layer_target_logprobs`` /
            ``layer_target_ranks``, [T][L]; ``metrics.layer_quantities``), the logit lens's classic plot.
        track: token ids followed through every layer for every read-out token: their log-probabilities and ranks
            (``layer_track_logprobs`` / ``layer_track_ranks``, [T][L][M], in this order); at most ``MAX_TRACK``
            distinct ids, each below the model's vocabulary (checked where the model is known,
            ``check_track``).
        layer_entropy: keep each layer's entropy H(p_{t,l}) in nats (``layer_entropy``, [T][L]).
    """

    divergence: Divergence = "jsd"
    final_norm: bool = True
    memory_mb: int | None = None
    vocab_size: int | None = None
    early_exit: bool = True
    compile: Compile = "auto"
    also: tuple[Divergence, ...] = ()
    lens: LensSpec = LensSpec()  # noqa: RUF009 (a frozen value: one shared default is safe)
    layer_top_k: int = 0
    layer_target: bool = False
    track: tuple[int, ...] = ()
    layer_entropy: bool = False

    @property
    def lens_spec(self) -> LensSpec:
        """The lens (``lens``; the name it had while ``lens`` was its text)."""
        return self.lens

    @property
    def lens_digest(self) -> str | None:
        """The digest of the lens's fit (None for the logit lens, or one not resolved yet)."""
        return self.lens.digest

    def to_dict(self) -> dict[str, Any]:
        """As every config's, with the lens as a store keeps it: its text and its fit's digest."""
        data: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            data[field.name] = list(value) if isinstance(value, tuple) else value
            if field.name == "lens":
                data.update(lens=str(self.lens), lens_digest=self.lens.digest)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """A manifest's readout: ``lens`` and ``lens_digest`` back into one (unresolved) ``LensSpec``."""
        data = dict(data)
        digest = data.pop("lens_digest", None)
        data["lens"] = LensSpec.parse(data.get("lens", "logit"), digest)
        return super().from_dict(data)

    def __post_init__(self) -> None:
        check_choice("ReadoutConfig", "divergence", self.divergence, Divergence)
        object.__setattr__(self, "lens", LensSpec.parse(self.lens))  # text parsed; no file is read here
        check_choice("ReadoutConfig", "compile", self.compile, Compile)
        object.__setattr__(self, "also", tuple(k for k in dict.fromkeys(self.also) if k != self.divergence))
        for kind in self.also:
            check_choice("ReadoutConfig", "also", kind, Divergence)
        if self.memory_mb is not None and self.memory_mb < 16:
            raise invalid("ReadoutConfig", "memory_mb", self.memory_mb, "must be ≥ 16")
        if isinstance(self.layer_top_k, bool) or not isinstance(self.layer_top_k, int):
            raise invalid("ReadoutConfig", "layer_top_k", self.layer_top_k, "must be a whole number")
        if not 0 <= self.layer_top_k <= MAX_LAYER_TOP_K:
            raise invalid(
                "ReadoutConfig",
                "layer_top_k",
                self.layer_top_k,
                f"must be in 1..{MAX_LAYER_TOP_K}, or 0 for none",
                "each layer's K most probable tokens",
            )
        if self.vocab_size is not None and self.vocab_size < 2:
            raise invalid(
                "ReadoutConfig", "vocab_size", self.vocab_size, "must be ≥ 2", "a distribution needs 2"
            )
        self._check_per_layer()

    def _check_per_layer(self) -> None:
        """The per-layer quantities' settings: flags are true or false, ``track`` distinct token ids ≥ 0 (at most
        ``MAX_TRACK``; below ``vocab_size`` where it is given)."""
        for name in ("layer_target", "layer_entropy"):
            if not isinstance(getattr(self, name), bool):
                raise invalid("ReadoutConfig", name, getattr(self, name), "must be true or false")
        if isinstance(self.track, (str, bytes)) or not isinstance(self.track, (tuple, list)):
            raise invalid("ReadoutConfig", "track", self.track, "must be a list of token ids")
        ids = tuple(self.track)
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise invalid("ReadoutConfig", "track", list(ids), "must be token ids (whole numbers ≥ 0)")
        if len(set(ids)) != len(ids):
            raise invalid("ReadoutConfig", "track", list(ids), "must name each token id once")
        if len(ids) > MAX_TRACK:
            raise invalid(
                "ReadoutConfig", "track", list(ids), f"must be at most {MAX_TRACK} token ids, not {len(ids)}"
            )
        object.__setattr__(self, "track", ids)
        if self.vocab_size is not None:
            check_track(ids, self.vocab_size)


def check_track(track: tuple[int, ...], vocab: int, model: str = "the model") -> None:
    """``ReadoutConfig.track``'s ids against the vocabulary the lens reads (``vocab`` rows): an id at or past it is
    refused, naming it, before anything is read out or written."""
    past = [i for i in track if i >= vocab]
    if past:
        raise invalid(
            "ReadoutConfig",
            "track",
            list(track),
            f"token id {past[0]} is past {model}'s vocabulary of {vocab} (ids 0..{vocab - 1})",
        )


def check_per_layer(readout: ReadoutConfig, tokens: bool) -> None:
    """The per-layer quantities are per-token fields, as each layer's top-k (``check_layer_top``): a run asking for
    the target trajectory, tracked ids or each layer's entropy without its per-token values is refused, naming
    both."""
    kept = {
        "layer_target": "the target trajectory is",
        "track": "tracked ids are",
        "layer_entropy": "each layer's entropy is",
    }
    for name, what in kept.items():
        value = getattr(readout, name)
        if value and not tokens:
            raise InputError(
                setting=name,
                value=list(value) if isinstance(value, tuple) else value,
                requirement=f"{what} kept per token and layer: add {named('tokens', True)}",
            )


def check_layer_top(layer_top_k: int, tokens: bool) -> None:
    """Each layer's top-k is a per-token field: a run or request asking for it (``layer_top_k`` > 0) without its
    per-token values (``tokens``) is refused, naming both, rather than computed and dropped."""
    if layer_top_k and not tokens:
        raise InputError(
            setting="layer_top_k",
            value=layer_top_k,
            requirement=f"each layer's top-k is kept per token: add {named('tokens', True)}",
        )


@dataclasses.dataclass(frozen=True)
class DTRConfig(Config):
    """Settling and deep-thinking settings (docs/definitions.md §2).

    Attributes:
        g: settling threshold on the cumulative-minimum divergence (units of the divergence: bits for jsd).
        rho: depth fraction defining the deep regime.
        deep_rule: how ρ becomes a layer threshold (see ``DeepRule``).
        dtr_prefix_tokens: ℓ of the ``dtr_prefix`` score, the DTR over the first ℓ completion tokens; None = no
            prefix: DTR over the whole response only (``score`` reports no ``dtr_prefix``, the correlation study
            takes the whole response's DTR). ``score --prefix``; ``generate(prefix=)`` in Python.
        settle: the settling rule: ``jsd`` — the first layer whose cumulative-minimum divergence (``--divergence``,
            JSD by default) is ≤ g; ``topk:K`` — the first layer from which every layer's top-K token set equals
            the final layer's (DTR-explorer's rule; g is then unused). docs/definitions.md §2.
    """

    g: float = 0.5
    rho: float = 0.85
    deep_rule: DeepRule = "spec"
    dtr_prefix_tokens: int | None = None
    settle: str = "jsd"

    DICT_KEYS: ClassVar[dict[str, str]] = {"dtr_prefix_tokens": "prefix"}  # a manifest's ``dtr.prefix``

    @property
    def top_k(self) -> int | None:
        """K of a ``topk:K`` settling rule; None for the divergence threshold rule."""
        return settle_top_k(self.settle)

    def __post_init__(self) -> None:
        settle_top_k(self.settle)
        if not (math.isfinite(self.g) and self.g >= 0):
            raise invalid("DTRConfig", "g", self.g, "must be a finite number ≥ 0", f"default {DTRConfig.g}")
        if not (0 < self.rho <= 1):
            raise invalid("DTRConfig", "rho", self.rho, "must be in (0, 1]", f"default {DTRConfig.rho}")
        check_choice("DTRConfig", "deep_rule", self.deep_rule, DeepRule)
        if self.dtr_prefix_tokens is not None and self.dtr_prefix_tokens < 1:
            raise invalid(
                "DTRConfig",
                "dtr_prefix_tokens",
                self.dtr_prefix_tokens,
                "must be ≥ 1 token",
                "or None for no prefix",
            )


def depth_prefix(dtr: DTRConfig) -> int:
    """ℓ of a sample store's ``dtr_prefix`` column (its manifest's ``depth.prefix``): a store always carries one,
    since Think@n ranks by it — over the run's ``dtr_prefix_tokens`` where it set them, else ``PREFIX_TOKENS``."""
    return dtr.dtr_prefix_tokens if dtr.dtr_prefix_tokens is not None else PREFIX_TOKENS


@dataclasses.dataclass(frozen=True)
class LensFitConfig(Config):
    """How a tuned lens is fitted (``depthlens lens fit``, ``studies.lens_fit``; docs/definitions.md §1).

    Attributes:
        max_tokens: token positions read (training and held-out together).
        heldout: share of the sequences kept apart for the held-out KL (never trained on).
        steps: KL steps (Adam) after the least-squares start; 0 keeps the least-squares translators.
        lr: Adam's learning rate.
        batch_tokens: token positions per KL step.
        layers_per_step: layers trained per KL step (drawn at random; each costs an unembedding product).
        max_seconds: the KL steps stop after this much wall time (checkpointed; ``--resume`` goes on).
        ridge: the least-squares ridge, relative to the states' mean square.
        checkpoint_every: steps between checkpoints.
        seed: the held-out split's and the minibatches' seed.
    """

    max_tokens: int = 8192
    heldout: float = 0.2
    steps: int = 200
    lr: float = 1e-4
    batch_tokens: int = 64
    layers_per_step: int = 4
    max_seconds: float = 600.0
    ridge: float = 1e-4
    checkpoint_every: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("max_tokens", "batch_tokens", "layers_per_step", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise invalid("LensFitConfig", name, getattr(self, name), "must be ≥ 1")
        if self.steps < 0:
            raise invalid("LensFitConfig", "steps", self.steps, "must be ≥ 0")
        if not 0 < self.heldout < 1:
            raise invalid("LensFitConfig", "heldout", self.heldout, "must be in (0, 1)")
        if not (self.lr > 0 and self.max_seconds > 0 and self.ridge >= 0):
            raise invalid("LensFitConfig", "lr", self.lr, "lr and max_seconds must be > 0, ridge ≥ 0")


def settle_top_k(settle: str) -> int | None:
    """K of ``topk:K`` (K ≥ 1), None for ``jsd``; anything else raises naming ``--settle``."""
    if settle == "jsd":
        return None
    k = settle.removeprefix("topk:")
    if settle.startswith("topk:") and k.isdigit() and int(k) >= 1:
        return int(k)
    raise invalid("DTRConfig", "settle", settle, "must be jsd or topk:K with K ≥ 1", "e.g. topk:5")


VEff = Literal["ipr", "exp-entropy"]
"""``ipr``: 1 / Σ o_i² (inverse participation ratio, docs/definitions.md §6 default); ``exp-entropy``: exp H(o)."""


@dataclasses.dataclass(frozen=True)
class TCBConfig(Config):
    """Token Constraint Bound settings (docs/definitions.md §6).

    Attributes:
        epsilon: the tolerated output change ε in δ_TCB = ε / ‖J‖_F.
        v_eff: which effective-vocabulary size is reported as ``v_eff``.
        spectral: also report ``tcb_spectral`` = ε / ‖J‖_2 (power iteration; costs ~2 unembedding products per
            iteration).
        power_iterations: the most power-iteration steps for the spectral norm.
        exact: compute δ_TCB in float64 (the reference) instead of float32 (within 1e-4 relative of it: the
            anchored closed form of ``metrics.tcb`` has no cancellation left for float64 to guard).
    """

    epsilon: float = 1.0
    v_eff: VEff = "ipr"
    spectral: bool = False
    power_iterations: int = 100
    exact: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise invalid(
                "TCBConfig",
                "epsilon",
                self.epsilon,
                "must be a finite number > 0",
                f"default {TCBConfig.epsilon}",
            )
        check_choice("TCBConfig", "v_eff", self.v_eff, VEff)
        if self.power_iterations < 1:
            raise invalid("TCBConfig", "power_iterations", self.power_iterations, "must be ≥ 1")


@dataclasses.dataclass(frozen=True)
class TCBStudies(Config):
    """The settings of the Token Constraint Bound paper's four studies (``depthlens tcb …``,
    ``studies.tcb_studies``; docs/cli.md): their defaults, stated once.

    Attributes:
        split: ``regimes``: all prompts also pooled and split at this measured V_eff.
        top_k: ``geometry``: how many competing tokens (the most probable) move.
        cluster: ``geometry``: α < 1, their unembedding rows pulled toward the centroid.
        disperse: ``geometry``: α > 1, pushed away.
        task: ``prompts``: the offline reasoning-gym task answered.
        questions: ``prompts``: how many of its questions.
        shots: ``prompts``: the numbers of worked examples compared.
        prompts_max_new_tokens: ``prompts``: the longest greedy answer.
        prompt: ``trace``: the user message answered.
        trace_max_new_tokens: ``trace``: the longest generation.
        window: ``trace``: tokens of history for the median δ of the sharp-drop rule.
        factor: ``trace``: a drop is δ ≤ median / factor ...
        max_perplexity: ``trace``: ... while the token's perplexity is ≤ this.
        chat: ``trace``: use the chat template when the model has one.
    """

    split: float = 4.0
    top_k: int = 10
    cluster: float = 0.5
    disperse: float = 1.5
    task: str = "reasoning_gym:chain_sum"
    questions: int = 10
    shots: tuple[int, ...] = (0, 2)
    prompts_max_new_tokens: int = 96
    prompt: str = "Explain in two sentences why the sky is blue."
    trace_max_new_tokens: int = 64
    window: int = 8
    factor: float = 10.0
    max_perplexity: float = 2.0
    chat: bool = True
