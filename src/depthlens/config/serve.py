"""The server's own settings (``depthlens serve``): limits, queue and shutdown; the engine's are ``EngineConfig``."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from depthlens.config.base import MOST_BATCH, MOST_RESPONSES, invalid
from depthlens.config.readout import PREFIX_TOKENS
from depthlens.config.sampling import MOST_NEW_TOKENS, SamplingConfig

MOST_RUNNING = 1024
"""The most requests a server runs at once (``--max-running``): each holds a thread of the process while it runs;
a vLLM engine batches far fewer samples than that at a time."""

LOCALHOST = "127.0.0.1"
"""Where ``serve`` and ``view`` listen unless ``--host`` says otherwise: this machine only."""

VIEW_PORT = 8765
"""``depthlens view``'s port (``serve``'s is ``ServeConfig.PORT``)."""


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """What the server accepts and how many requests it holds.

    Attributes:
        model_id: the name ``/v1/models`` lists and requests must give as ``model``.
        api_key: when set, every ``/v1`` request must carry ``Authorization: Bearer <api_key>``.
        max_n: the most samples one request may ask for (``n``, ``think.n``, ``online.max_n``).
        max_tokens: the most tokens one sample may generate (``max_tokens``).
        default_max_tokens: a chat request's ``max_tokens`` when it gives none (completions: OpenAI's
            ``COMPLETION_MAX_TOKENS``).
        max_prompts: the most prompts one ``/v1/completions`` request may batch.
        readout_tokens: leading tokens of each sample read out at every layer when a request does not say
            (None = all); raised to the request's DTR prefix when shorter.
        max_running: requests running at once (vLLM batches all of their samples in one engine; the
            transformers backend runs one request at a time whatever this says).
        max_queue: requests waiting beyond those; past them a request gets 429 with ``Retry-After``.
        max_body_bytes: larger request bodies get 413.
        shutdown_grace: seconds SIGTERM gives in-flight requests to finish before they are aborted.
        max_sample_tokens: the most tokens — samples of a prompt sampled together × (its prompt + ``max_tokens``) —
            one request may hold on the transformers engine: what the machine's memory holds of their KV cache and
            readout, set at launch from the model (``studies.runs.sample_limit``); None = no limit (a vLLM
            engine sizes its own cache and queues what does not fit).
        temperature, top_p: a request's when it gives none — the model's ``generation_config``'s where it sets
            them, else depthlens's sampling defaults (``models.info.sampling_defaults``; not OpenAI's 1 / 1,
            which make a small model answer noise).
    """

    HOST: ClassVar[str] = LOCALHOST
    PORT: ClassVar[int] = 8000
    LOG_LEVEL: ClassVar[str] = "warning"  # uvicorn's
    # OpenAI's defaults for a request that gives none of these
    COMPLETION_MAX_TOKENS: ClassVar[int] = 16

    model_id: str
    api_key: str | None = None
    max_n: int = 64
    max_tokens: int = 4096
    default_max_tokens: int = 512
    max_prompts: int = 16
    readout_tokens: int | None = PREFIX_TOKENS
    max_running: int = 32
    max_queue: int = 64
    max_body_bytes: int = 1 << 20
    shutdown_grace: float = 30.0
    max_sample_tokens: int | None = None
    temperature: float = SamplingConfig.temperature
    top_p: float = SamplingConfig.top_p

    def __post_init__(self) -> None:
        for name, most in (
            ("max_n", MOST_RESPONSES),
            ("max_tokens", MOST_NEW_TOKENS),
            ("default_max_tokens", MOST_NEW_TOKENS),
            ("max_prompts", MOST_BATCH),
            ("max_running", MOST_RUNNING),
            ("max_body_bytes", None),  # against the machine's memory: ``studies.runs.check_serve``
        ):
            value = getattr(self, name)
            if value < 1 or (most is not None and value > most):
                requirement = "must be ≥ 1" if most is None else f"must be in 1..{most:,}"
                raise invalid("ServeConfig", name, value, requirement)
        for name in ("max_queue", "shutdown_grace"):
            if getattr(self, name) < 0:
                raise invalid("ServeConfig", name, getattr(self, name), "must be ≥ 0")
        if self.readout_tokens is not None and self.readout_tokens < 1:
            raise invalid("ServeConfig", "readout_tokens", self.readout_tokens, "must be ≥ 1, or 'all'")
