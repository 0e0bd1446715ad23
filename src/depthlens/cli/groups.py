"""Option groups: options that travel together (the model and how to load it, the vLLM engine's knobs, the task,
sampling, the answer rules, the store, Ray) declared once as a frozen dataclass of option types, each with the
spec it builds. A command names a group by one parameter (``model: Model``); ``grouped`` spreads the group's
fields into the command's signature — so ``--help`` lists every option as before — and hands the command the
group built from them. A renamed field renames its option and its reader together: nothing is read by name from a
command's ``locals()``."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from depthlens.cli import options as opt
from depthlens.config import (
    AnswerConfig,
    Backend,
    DTRConfig,
    EngineConfig,
    ModelSpec,
    OnlineConfig,
    RayConfig,
    ReadoutConfig,
    SamplingConfig,
    StoreSpec,
    TaskSpec,
    TCBConfig,
    VotingConfig,
)
from depthlens.models.catalogue import DEFAULT_MODEL

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Model:
    """``--model`` and how to load it."""

    model: opt.Model = DEFAULT_MODEL
    device: opt.Device = ModelSpec.device
    dtype: opt.DType = ModelSpec.dtype
    trust_remote_code: opt.TrustRemoteCode = ModelSpec.trust_remote_code

    def spec(self, arch: Arch | None = None) -> ModelSpec:
        """The run's ``ModelSpec`` (``arch``: where an architecture without an adapter row keeps its parts)."""
        parts = arch or Arch()
        return ModelSpec(
            self.model,
            self.device,
            self.dtype,
            self.trust_remote_code,
            parts.blocks,
            parts.final_norm_path,
            parts.unembed,
        )


@dataclasses.dataclass(frozen=True)
class Arch:
    """An architecture without an adapter row: where its parts are."""

    blocks: opt.Blocks = None
    final_norm_path: opt.FinalNormPath = None
    unembed: opt.Unembed = None


@dataclasses.dataclass(frozen=True)
class Engine:
    """The vLLM engine's knobs (``EngineConfig``)."""

    tensor_parallel_size: opt.TensorParallel = EngineConfig.tensor_parallel_size
    gpu_memory_utilization: opt.GpuMemory = EngineConfig.gpu_memory_utilization
    max_model_len: opt.MaxModelLen = EngineConfig.max_model_len
    enforce_eager: opt.EnforceEager = EngineConfig.enforce_eager
    kv_cache_gib: opt.KvCacheGib = EngineConfig.kv_cache_gib

    def engine(self, backend: Backend, model: Model) -> EngineConfig:
        """The engine ``backend`` (``--backend`` resolved) runs with these knobs, in the model's ``--dtype``."""
        return EngineConfig(backend, model.dtype, **dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True)
class Vllm(Engine):
    """The engine of a run that reads its layers out while sampling: the vLLM engine's knobs, whether its lens runs
    in float32, and torch's threads (hf)."""

    float32_lens: opt.Float32Lens = EngineConfig.float32_lens
    threads: opt.Threads = EngineConfig.threads


@dataclasses.dataclass(frozen=True)
class Task:
    """``--task`` and its settings."""

    task: opt.Task = TaskSpec.name
    data: opt.Data = None
    questions: opt.Questions = TaskSpec.questions
    task_seed: opt.TaskSeed = TaskSpec.task_seed
    task_config: opt.TaskConfig = TaskSpec.task_config

    def spec(self) -> TaskSpec:
        """The task as the store's manifest records it (``specs.task_spec``: a missing question file, an unknown
        task or ``--task-config`` key refused here, before torch is imported)."""
        from depthlens.cli.specs import task_spec

        return task_spec(self.task, self.questions, self.task_seed, self.task_config, self.data)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How each token is sampled, and how many."""

    temperature: opt.Temperature = SamplingConfig.temperature
    top_p: opt.TopP = SamplingConfig.top_p
    top_k: opt.TopKSampling = SamplingConfig.top_k
    min_p: opt.MinP = SamplingConfig.min_p
    max_new_tokens: opt.MaxNew = SamplingConfig.max_new_tokens

    def config(self, readout_tokens: int | None) -> SamplingConfig:
        """The sampling settings, the first ``readout_tokens`` of each response read out at every layer."""
        return SamplingConfig(
            self.temperature,
            self.top_p,
            self.max_new_tokens,
            readout_tokens,
            top_k=self.top_k,
            min_p=self.min_p,
        )


@dataclasses.dataclass(frozen=True)
class Answers:
    """How the prompts ask and the answers are read."""

    prompt_style: opt.PromptStyleOpt = AnswerConfig.prompt_style
    answer_type: opt.AnswerTypeOpt = AnswerConfig.answer_type
    answer_fallback: opt.AnswerFallbackOpt = AnswerConfig.fallback

    def config(self) -> AnswerConfig:
        from depthlens.cli.specs import answer_config

        return answer_config(self.prompt_style, self.answer_type, self.answer_fallback)


@dataclasses.dataclass(frozen=True)
class Store:
    """Whether a sample store continues or is replaced, and the format of a new one."""

    resume: opt.Resume = StoreSpec.resume
    overwrite: opt.Overwrite = StoreSpec.overwrite
    store_format: opt.StoreFormatOpt = StoreSpec.format
    float16: opt.Float16 = StoreSpec.float16

    def spec(self, out: Path) -> StoreSpec:
        fmt = self.store_format
        return StoreSpec(out, self.resume, self.overwrite, fmt, self.float16)  # type: ignore[arg-type]  # --store's text


@dataclasses.dataclass(frozen=True)
class Ray:
    """Ray actors for ``--ray``."""

    ray: opt.RayOpt = False
    ray_address: opt.RayAddress = RayConfig.address
    workers: opt.Workers = RayConfig.workers
    cpus: opt.Cpus = RayConfig.cpus
    gpus: opt.Gpus = RayConfig.gpus

    @property
    def on(self) -> bool:
        """``--ray``, or ``--ray-address`` (which implies it)."""
        return self.ray or self.ray_address is not None

    def config(self, block: int | None = None) -> RayConfig | None:
        """Ray's settings, or None to run in this process; a local Ray's actors beyond this machine's CPUs are
        refused (``studies.runs.check_ray``)."""
        if not self.on:
            return None
        from depthlens.studies.runs import check_ray

        config = RayConfig(self.workers, self.cpus, self.gpus, self.ray_address, block)
        check_ray(config)
        return config


@dataclasses.dataclass(frozen=True)
class Tcb:
    """The Token Constraint Bound beside the scores."""

    tcb: opt.Tcb = True
    epsilon: opt.Epsilon = TCBConfig.epsilon
    v_eff: opt.VEffOpt = TCBConfig.v_eff
    spectral: opt.Spectral = TCBConfig.spectral
    tcb_exact: opt.TcbExact = TCBConfig.exact

    def config(self) -> TCBConfig | None:
        if not self.tcb:
            return None
        v_eff = self.v_eff
        return TCBConfig(self.epsilon, v_eff, self.spectral, exact=self.tcb_exact)  # type: ignore[arg-type]  # --v-eff's text


@dataclasses.dataclass(frozen=True)
class Layers:
    """What each read-out token keeps of every layer beside its divergence (per-token fields: ``score`` needs
    ``--tokens``): its top-k, the target trajectory, tracked ids, the entropy (``ReadoutConfig``'s fields)."""

    layer_top_k: opt.LayerTopK = ReadoutConfig.layer_top_k
    layer_target: opt.LayerTarget = ReadoutConfig.layer_target
    track: opt.Track = ""
    layer_entropy: opt.LayerEntropy = ReadoutConfig.layer_entropy

    def fields(self) -> dict[str, Any]:
        """The readout's fields these set (``--track`` read as its ids: ``specs.track_ids``)."""
        from depthlens.cli.specs import track_ids

        return {
            "layer_top_k": self.layer_top_k,
            "layer_target": self.layer_target,
            "track": track_ids(self.track),
            "layer_entropy": self.layer_entropy,
        }


@dataclasses.dataclass(frozen=True)
class HeatmapLayers(Layers):
    """``heatmap``'s: the target trajectory read and drawn unless ``--no-layer-target`` (one text: a few percent
    more)."""

    layer_target: opt.HeatmapLayerTarget = True


def grouped(fn: F) -> F:
    """``fn`` with each parameter annotated by a group (a dataclass above) spread into the group's options, in
    place, for typer to read (``__signature__``); ``fn`` is called with the groups built."""
    signature = inspect.signature(fn, eval_str=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, type] = {}
    for p in signature.parameters.values():
        if dataclasses.is_dataclass(p.annotation) and isinstance(p.annotation, type):
            groups[p.name] = p.annotation
            hints = typing.get_type_hints(p.annotation, include_extras=True)
            for f in dataclasses.fields(p.annotation):
                params.append(
                    inspect.Parameter(
                        f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name]
                    )
                )
        else:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))

    @functools.wraps(fn)
    def call(**given: Any) -> Any:
        for name, group in groups.items():
            given[name] = group(**{f.name: given.pop(f.name) for f in dataclasses.fields(group)})
        return fn(**given)

    call.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]  # read by inspect
    call.__annotations__ = {p.name: p.annotation for p in params}
    return call  # type: ignore[return-value]  # it takes the groups' fields instead: typer reads its signature


@dataclasses.dataclass(frozen=True)
class Vote:
    """``thinkn``'s vote: n of each pool, η, ℓ, the trials, the methods."""

    n: opt.ThinknN = None
    pool: opt.ThinknPool = None
    eta: opt.Eta = VotingConfig.eta
    prefix: opt.PrefixOpt = str(VotingConfig.rank_prefix)
    trials: opt.Trials = VotingConfig.trials
    methods: opt.Methods = None
    ablation: opt.Ablation = False
    seed: opt.Seed = VotingConfig.seed
    deepconf_window: opt.DeepconfWindow = VotingConfig.deepconf_window
    tie_break: opt.TieBreakOpt = VotingConfig.tie_break


@dataclasses.dataclass(frozen=True)
class Live:
    """``thinkn --online``: the live policy, or its replay over a stored pool."""

    online: opt.Online = False
    signal: opt.SignalOpt = OnlineConfig.signal
    warmup: opt.Warmup = OnlineConfig.warmup
    max_n: opt.MaxN = OnlineConfig.max_n
    consensus: opt.Consensus = OnlineConfig.consensus
    sweep: opt.Sweep = False


@dataclasses.dataclass(frozen=True)
class Stored:
    """A stored pool's depth settings, each overridden where given (a new pool: the defaults)."""

    g: opt.StoreG = None
    rho: opt.StoreRho = None
    deep_rule: opt.StoreDeepRule = None
    divergence: opt.StoreDivergence = None
    lens: opt.StoreLens = None
    settle: opt.StoreSettle = None

    def dtr(self, store: Path | None) -> DTRConfig:
        """The DTR settings of a vote: the store's own (a new store: the defaults), each overridden where given;
        a stored pool must hold what its settling rule reads (``resolve.check_stored_settle``)."""
        from depthlens.stores.samples import read_manifest
        from depthlens.studies.resolve import stored_dtr

        given = {"g": self.g, "rho": self.rho, "deep_rule": self.deep_rule, "settle": self.settle}
        return stored_dtr(read_manifest(store) if store is not None else {}, given, str(store))
