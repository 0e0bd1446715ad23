"""Request bodies as the OpenAI API defines them, plus the ``depthlens`` object (docs/serve.md).

Strict pydantic models: a field of the wrong type or a name no model knows is refused (422) rather than ignored —
a misspelt ``depthlens`` option would otherwise silently do nothing. OpenAI fields the server cannot honour are
accepted only at their neutral value (``presence_penalty: 0``), so a client that sends them unchanged still works.
The DeepConf option names users already send to other servers are aliases of the online policy's own
(``warmup_samples`` → ``warmup``, ``window_size`` → ``window``, ``max_traces`` → ``max_n``,
``consensus_threshold`` → ``consensus``; ``variant`` low / high and a fixed ``threshold`` select online DeepConf).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from depthlens.config import PREFIX_TOKENS, AnswerType, TieBreak, VotingConfig


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _alias(*names: str) -> Any:
    return Field(None, validation_alias=AliasChoices(*names))


class ThinkOptions(Strict):
    """Think@n per request: sample ``n``, keep the top ``eta`` by prefix DTR over ``prefix`` tokens, vote."""

    n: int = VotingConfig.n  # ranges: VotingConfig's own checks (serve.job), named depthlens.think.*
    eta: float = VotingConfig.eta
    prefix: int = PREFIX_TOKENS
    tie_break: TieBreak = VotingConfig.tie_break  # a live tie: uniform answers the first given of the tied
    answer_type: AnswerType | None = None


class OnlineOptions(Strict):
    """Online Think@n (``signal: dtr``) or online DeepConf (``signal: confidence``) per request."""

    signal: Literal["dtr", "confidence"] | None = None
    warmup: int | None = _alias("warmup", "warmup_samples")
    max_n: int | None = _alias("max_n", "max_traces")
    consensus: float | None = _alias("consensus", "consensus_threshold")
    eta: float | None = None
    prefix: int | None = None
    window: int | None = _alias("window", "window_size")
    batch_size: int | None = None
    variant: Literal["low", "high"] | None = None
    threshold: float | None = None
    answer_type: AnswerType | None = None


class DepthlensOptions(Strict):
    """The ``depthlens`` object of a request (``extra_body={"depthlens": {...}}`` with the openai client)."""

    tokens: bool = False
    layer_top_k: int = 0  # each read-out token's top-k per layer (ReadoutConfig.layer_top_k), with ``tokens``
    layer_target: bool = False  # the target trajectory (ReadoutConfig.layer_target), with ``tokens``
    track: list[int] = []  # token ids followed through every layer (ReadoutConfig.track), with ``tokens``
    layer_entropy: bool = False  # each layer's entropy (ReadoutConfig.layer_entropy), with ``tokens``
    readout_tokens: int | Literal["all"] | None = None
    prefix: Annotated[int, Field(ge=1)] = PREFIX_TOKENS  # ℓ of dtr_prefix
    g: float | None = None
    rho: float | None = None
    answer_type: AnswerType | None = None
    think: ThinkOptions | None = None
    online: OnlineOptions | None = None


class StreamOptions(Strict):
    include_usage: bool = False


class ResponseFormat(Strict):
    """OpenAI's ``response_format``: plain text only (``json_object`` / ``json_schema`` need constrained
    decoding, which the server does not do: refused by name, never ignored)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class Common(Strict):
    """Fields both endpoints share."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM's extra sampling parameters (its -1 = off, as 0)
    min_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    depthlens: DepthlensOptions | None = None

    def unsupported(self) -> dict[str, object]:
        """Fields given at a value the server cannot honour: name → value."""
        out: dict[str, object] = {}
        if self.response_format is not None and self.response_format.type != "text":
            out["response_format"] = {"type": self.response_format.type}
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                out[name] = getattr(self, name)
        if self.logit_bias:
            out["logit_bias"] = self.logit_bias
        return out


class CompletionRequest(Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> dict[str, object]:
        out = super().unsupported()
        if self.echo:
            out["echo"] = True
        if self.suffix:
            out["suffix"] = self.suffix
        if self.best_of not in (None, self.n):
            out["best_of"] = self.best_of
        return out


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None  # None or missing is refused (job.py): 400 naming the field
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # accepted empty (clients echo an assistant turn whole)

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatRequest(Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    parallel_tool_calls: bool | None = None

    def unsupported(self) -> dict[str, object]:
        out = super().unsupported()
        if self.top_logprobs and not self.logprobs:
            out["top_logprobs"] = "without logprobs: true"
        return out
