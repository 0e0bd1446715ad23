"""What a run is, as plain data: the model and how to load it, the task, the store, Ray, and the whole of a
``score``, ``generate`` or online run. Every front builds them in one place (``studies.runs``: ``score_run``,
``generate_run``, ``online_run``, each after every check that needs no model) and passes them whole; Python code
may build one by hand: ``studies.generate.generate(lm, GenerateRun(StoreSpec(out), pool=8), questions)``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, Literal

from depthlens.config.answers import AnswerConfig
from depthlens.config.base import MOST_BATCH, MOST_QUESTIONS, MOST_RESPONSES, Config, check_seed, invalid
from depthlens.config.readout import (
    MAX_LAYER_TOP_K,
    DTRConfig,
    ReadoutConfig,
    TCBConfig,
    check_layer_top,
    check_per_layer,
)
from depthlens.config.sampling import EngineConfig, SamplingConfig
from depthlens.config.voting import OnlineConfig
from depthlens.errors import InputError, named

StoreFormat = Literal["parquet", "jsonl"]
"""``parquet``: a sharded Parquet store directory (the default for new stores); ``jsonl``: one JSON line per
record (``--out x.jsonl``, ``--store jsonl``, and every store written before Parquet)."""


@dataclasses.dataclass(frozen=True)
class ModelSpec(Config):
    """A model and how to load it (``depthlens.load``'s arguments; ``blocks`` / ``final_norm`` / ``unembed``
    locate the parts of an architecture without an adapter row)."""

    name: str
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False
    blocks: str | None = None
    final_norm: str | None = None
    unembed: str | None = None

    def load_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``depthlens.models.load.load`` besides the name."""
        return {k: v for k, v in self.to_dict().items() if k != "name"}


@dataclasses.dataclass(frozen=True)
class TaskSpec(Config):
    """Where a run's questions come from, as a store's manifest records it (``task``). ``questions`` None: every
    question of a hub or JSONL task, ``GENERATED`` of a generated (reasoning-gym) one."""

    GENERATED: ClassVar[int] = 50

    name: str = "reasoning_gym:basic_arithmetic"
    questions: int | None = None
    task_seed: int = 0
    task_config: str | None = None
    data: str | None = None  # a local JSONL for a hub task

    def __post_init__(self) -> None:
        check_seed("TaskSpec", "task_seed", self.task_seed)
        if self.questions is not None and not (1 <= self.questions <= MOST_QUESTIONS):
            raise invalid("TaskSpec", "questions", self.questions, f"must be in 1..{MOST_QUESTIONS:,}")


@dataclasses.dataclass(frozen=True)
class StoreSpec:
    """Where a run writes: ``out``, whether it continues (``resume``) or replaces (``overwrite``) what is there,
    the format of a new store (None: the default, or the existing store's own) and the width of Parquet floats."""

    out: Path
    resume: bool = False
    overwrite: bool = False
    format: StoreFormat | None = None
    float16: bool = False

    def __post_init__(self) -> None:
        if self.resume and self.overwrite:
            raise InputError(
                f"{named('resume')} and {named('overwrite')} together: {named('resume')} continues {self.out}, "
                f"{named('overwrite')} replaces it; "
                "pass one of them"
            )


@dataclasses.dataclass(frozen=True)
class RayConfig(Config):
    """Ray actors for ``--ray``: how many, what each holds, the cluster (None: a local Ray on 127.0.0.1), and how
    many rows (records, or questions for generation) make one block — one shard of the store."""

    SCORE_BLOCK: ClassVar[int] = 16  # records per block (and shard) of ``score --ray`` when ``block`` is None
    GENERATE_BLOCK: ClassVar[int] = 1  # questions per block of ``generate --ray``

    workers: int = 1
    cpus: float = 1.0
    gpus: float = 0.0
    address: str | None = None
    block: int | None = None  # None: SCORE_BLOCK records per block for scoring, GENERATE_BLOCK questions

    def __post_init__(self) -> None:
        if self.workers < 1 or self.cpus <= 0 or self.gpus < 0:
            raise InputError(
                f"{named('workers')} {self.workers}, {named('cpus')} {self.cpus:g}, {named('gpus')} {self.gpus:g}: "
                f"need 1+ workers, "
                "CPUs > 0, GPUs ≥ 0"
            )
        if self.block is not None and self.block < 1:
            raise invalid("RayConfig", "block", self.block, "must be ≥ 1")


@dataclasses.dataclass(frozen=True)
class ScoreRun:
    """One ``score`` run: records from ``source`` scored into ``store`` (read out by transformers, or with
    ``engine.backend`` vllm inside a vLLM engine)."""

    source: Path
    store: StoreSpec
    readout: ReadoutConfig = dataclasses.field(default_factory=ReadoutConfig)
    dtr: DTRConfig = dataclasses.field(default_factory=DTRConfig)
    tcb: TCBConfig | None = dataclasses.field(default_factory=TCBConfig)
    tokens: bool = False
    batch_size: int = 1
    skip_bad: bool = False
    engine: EngineConfig = dataclasses.field(
        default_factory=EngineConfig
    )  # vllm: teacher forced in the engine
    command: str | None = (
        None  # the call that made the run, as its manifest records it (None: the command line)
    )

    def __post_init__(self) -> None:
        check_layer_top(self.readout.layer_top_k, self.tokens)
        check_per_layer(self.readout, self.tokens)
        check_batch("ScoreRun", self.batch_size)


@dataclasses.dataclass(frozen=True)
class GenerateRun:
    """One ``generate`` (or ``thinkn --out``) run: ``pool`` responses per question of ``task``, sampled
    ``batch_size`` at a time on ``engine`` with each token's layers read out, into ``store``. ``POOL`` is
    ``generate``'s pool when none is given."""

    POOL: ClassVar[int] = 8

    store: StoreSpec
    pool: int
    seed: int = 0
    batch_size: int = 16
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    readout: ReadoutConfig = dataclasses.field(default_factory=ReadoutConfig)
    dtr: DTRConfig = dataclasses.field(default_factory=DTRConfig)
    answers: AnswerConfig = dataclasses.field(default_factory=AnswerConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    task: TaskSpec | None = None  # None: the manifest records an empty task (questions given from Python)
    command: str | None = (
        None  # the call that made the run, as its manifest records it (None: the command line)
    )

    def __post_init__(self) -> None:
        if self.pool < 1:
            raise InputError(f"{named('pool')} = {self.pool}; sample at least 1 response per question")
        if self.pool > MOST_RESPONSES:
            raise invalid(
                "GenerateRun", "pool", self.pool, f"must be at most {MOST_RESPONSES:,} per question"
            )
        check_batch("GenerateRun", self.batch_size)
        check_seed("GenerateRun", "seed", self.seed)
        keep_top_k_ids(self)


@dataclasses.dataclass(frozen=True)
class OnlineRun:
    """One live ``thinkn --online`` run: the policy ``online`` decides per question how many responses are
    started and where each stops; sampled as in ``GenerateRun`` into a JSONL ``store``."""

    store: StoreSpec
    online: OnlineConfig
    seed: int = 0
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    readout: ReadoutConfig = dataclasses.field(default_factory=ReadoutConfig)
    dtr: DTRConfig = dataclasses.field(default_factory=DTRConfig)
    answers: AnswerConfig = dataclasses.field(default_factory=AnswerConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    task: TaskSpec | None = None
    command: str | None = (
        None  # the call that made the run, as its manifest records it (None: the command line)
    )

    def __post_init__(self) -> None:
        check_seed("OnlineRun", "seed", self.seed)
        keep_top_k_ids(self)


def check_batch(owner: str, batch_size: int) -> None:
    """A batch holds 1..``MOST_BATCH`` rows (what one of a given model holds in memory is checked against the
    machine once its shape is read: ``studies.footprint``)."""
    if not 1 <= batch_size <= MOST_BATCH:
        raise invalid(owner, "batch_size", batch_size, f"must be in 1..{MOST_BATCH:,}")


def keep_top_k_ids(run: GenerateRun | OnlineRun) -> None:
    """A pool sampled under the top-K rule (``settle`` ``topk:K``) keeps each layer's top-K token ids (its readout's
    ``layer_top_k`` raised to K where smaller): the rule settles from them, in the run and in the readers that vote
    on its stored depth, as ``score --settle`` settles from the logits."""
    k = run.dtr.top_k
    if k is not None and k > MAX_LAYER_TOP_K:  # named as the setting given, not as the readout it would raise
        raise invalid(
            "DTRConfig",
            "settle",
            run.dtr.settle,
            f"K must be at most {MAX_LAYER_TOP_K} for a sampled pool, which keeps each layer's K most probable ids",
            "e.g. topk:5",
        )
    if k is not None and run.readout.layer_top_k < k:  # a frozen run: its readout replaced once, here
        object.__setattr__(run, "readout", dataclasses.replace(run.readout, layer_top_k=k))
