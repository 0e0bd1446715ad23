"""A request body → the job it asks for (``Job``), checked against the server's limits and the model's context
before anything runs; every refusal is a 400 that names its field."""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

from depthlens.config import DTRConfig, OnlineConfig, ReadoutConfig, SamplingConfig, ServeConfig, VotingConfig
from depthlens.config.base import check_seed
from depthlens.errors import ConfigError, DepthlensError, InputError
from depthlens.evals.answers import ExtractionConfig
from depthlens.serve.errors import ApiError, depthlens_error
from depthlens.serve.prompts import chat_prompt, completion_prompts
from depthlens.serve.schema import ChatRequest, CompletionRequest, DepthlensOptions, OnlineOptions
from depthlens.studies.runs import check_window, per_token_readout

VARIANTS = {"low": 0.1, "high": 0.9}  # DeepConf-low / -high keep the top 10 % / 90 % (their percentile)


@dataclasses.dataclass(frozen=True)
class Depth:
    """What a request asks of the readout and of voting."""

    tokens: bool  # per-token values in the answer (and on each stream chunk)
    dtr: DTRConfig  # g, ρ, the deep rule and ℓ of ``dtr_prefix``
    answers: ExtractionConfig  # how think / online read each sample's answer
    think: VotingConfig | None = None
    online: OnlineConfig | None = None
    # what each read-out token keeps of every layer, in the per-token values (``tokens``): its top-k, the target
    # trajectory, tracked ids, the entropy (``studies.runs.PER_TOKEN_READOUT``; the rest of the readout is the server's)
    asked: ReadoutConfig = dataclasses.field(default_factory=ReadoutConfig)

    @property
    def layer_top_k(self) -> int:
        return self.asked.layer_top_k


@dataclasses.dataclass(frozen=True)
class Job:
    """One request, ready to run: its prompts as token ids and how to sample and read them."""

    chat: bool
    prompts: tuple[tuple[int, ...], ...]
    n: int  # samples per prompt (plain sampling; think and online have their own)
    sampling: SamplingConfig
    seed: int  # the base seed: sample i of prompt p has seed studies.generate.sample_seed(seed, p, i)
    stop: tuple[str, ...]
    logprobs: int | None  # None: no logprobs; k: the sampled token's and the top k
    stream: bool
    include_usage: bool
    depth: Depth

    @property
    def voted(self) -> bool:
        return self.depth.think is not None or self.depth.online is not None


def build_job(
    body: CompletionRequest | ChatRequest,
    tokenizer: Any,
    context: int | None,
    settings: ServeConfig,
    vocab: int | None = None,
) -> Job:
    """The job ``body`` asks for, or an ``ApiError``. ``vocab``: the rows the engine's lens reads (tracked ids
    below it; None: the tokenizer's length where there is one)."""
    _refuse_unserved(body, settings)
    chat = isinstance(body, ChatRequest)
    prompts = (
        chat_prompt(body, tokenizer)
        if isinstance(body, ChatRequest)
        else completion_prompts(body, tokenizer, settings)
    )
    options = body.depthlens or DepthlensOptions()
    vocab = vocab if vocab is not None else len(tokenizer) if tokenizer is not None else None
    depth = _depth(options, settings, vocab)
    _check_n(body.n, depth, settings)
    limit = body.max_completion_tokens if isinstance(body, ChatRequest) else None
    max_tokens = limit or body.max_tokens
    sampling = _sampling(body, max_tokens, prompts, context, options, depth, settings, chat)
    _refuse_unheld(body.n, depth, max(len(p) for p in prompts), sampling.max_new_tokens, settings)
    stop, seed = _stop(body), _seed(body)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    logprobs = _logprobs(body)
    return Job(chat, prompts, body.n, sampling, seed, stop, logprobs, body.stream, include_usage, depth)


def _refuse_unserved(body: CompletionRequest | ChatRequest, settings: ServeConfig) -> None:
    """A request for another model than this server's, or with an OpenAI field depthlens does not serve."""
    if body.model != settings.model_id:
        raise ApiError(
            404,
            f"model {body.model!r} is not served here; this server serves {settings.model_id!r}",
            "model",
            "model_not_found",
        )
    unsupported = body.unsupported()
    if unsupported:
        name, value = next(iter(unsupported.items()))
        raise ApiError(400, f"{name} = {value!r} is not supported by depthlens serve", name, "unsupported")


def _check_n(n: int, depth: Depth, settings: ServeConfig) -> None:
    """``n`` within the server's limit; a voted request (think or online, one of them) samples its own pool."""
    if not 1 <= n <= settings.max_n:
        raise ApiError(
            400, f"n = {n} must lie in [1, {settings.max_n}] (the server's limit)", "n", "invalid_value"
        )
    if depth.think is not None or depth.online is not None:
        if n != 1:
            raise ApiError(
                400,
                "with depthlens.think or .online the samples are think.n / online.max_n and the "
                "answer is their vote: leave n out (or 1)",
                "n",
                "invalid_value",
            )
        if depth.think is not None and depth.online is not None:
            raise ApiError(
                400,
                "depthlens.think and depthlens.online exclude each other; give one",
                "depthlens",
                "invalid_value",
            )


def _stop(body: CompletionRequest | ChatRequest) -> tuple[str, ...]:
    """The request's stop strings: up to 4, none empty."""
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if len(stop) > 4 or any(not s for s in stop):
        raise ApiError(400, "stop takes up to 4 non-empty strings", "stop", "invalid_value")
    return stop


def _seed(body: CompletionRequest | ChatRequest) -> int:
    """The request's seed, checked by the command line's ``--seed`` rule; a random one where it gives none."""
    if body.seed is not None:
        try:  # numpy refuses negative seeds, and a store records its seed
            check_seed("Job", "seed", body.seed)
        except ConfigError as exc:  # an OpenAI field: named as the body spells it
            raise depthlens_error(exc) from None
        return body.seed
    return secrets.randbits(62)


def _refuse_unheld(n: int, depth: Depth, longest: int, max_tokens: int, settings: ServeConfig) -> None:
    """A request whose samples of one prompt, sampled together, hold more tokens than the transformers engine's
    memory holds (``ServeConfig.max_sample_tokens``) is refused naming what sets how many run together."""
    if settings.max_sample_tokens is None:
        return
    field, together = "n", n
    if depth.think is not None:
        field, together = "depthlens.think.n", depth.think.n
    elif depth.online is not None:
        online = depth.online
        field = (
            "depthlens.online.batch_size" if online.batch_size >= online.warmup else "depthlens.online.warmup"
        )
        together = min(max(online.batch_size, online.warmup), online.max_n)
    held = together * (longest + max_tokens)
    if held <= settings.max_sample_tokens:
        return
    if together == 1:
        field = "max_tokens"
    raise ApiError(
        400,
        f"{together} sample{'s' if together != 1 else ''} sampled together × ({longest} prompt + {max_tokens} "
        f"max_tokens) = {held:,} tokens of KV cache and readout at once; this server's memory holds "
        f"{settings.max_sample_tokens:,} (the transformers engine, one request at a time): lower {field} or "
        "max_tokens",
        field,
        "invalid_value",
    )


def _logprobs(body: CompletionRequest | ChatRequest) -> int | None:
    if isinstance(body, ChatRequest):
        k = body.top_logprobs or 0
        if not 0 <= k <= 20:
            raise ApiError(400, f"top_logprobs = {k} must lie in [0, 20]", "top_logprobs", "invalid_value")
        return k if body.logprobs else None
    if body.logprobs is not None and not 0 <= body.logprobs <= 20:
        raise ApiError(400, f"logprobs = {body.logprobs} must lie in [0, 20]", "logprobs", "invalid_value")
    return body.logprobs


def _readout_window(options: DepthlensOptions, settings: ServeConfig, depth: Depth) -> int | None:
    """The read-out window: the request's (``readout_tokens``: N or 'all'; one shorter than the prefix a vote
    decides at is refused with the run's own check, ``studies.runs.check_window``), else the server's, widened to
    every prefix the request reads (a default the request did not choose)."""
    asked = options.readout_tokens
    if asked == "all" or (asked is None and settings.readout_tokens is None):
        return None
    if isinstance(asked, int):
        if asked < 1:
            raise ApiError(
                400,
                f"depthlens.readout_tokens = {asked} must be ≥ 1 or 'all'",
                "depthlens.readout_tokens",
                "invalid_value",
            )
        return asked
    prefixes = [depth.dtr.dtr_prefix_tokens or 1]
    if depth.think is not None and depth.think.rank_prefix is not None:
        prefixes.append(depth.think.rank_prefix)
    if depth.online is not None:
        prefixes.append(depth.online.decision_prefix)
    return max(settings.readout_tokens or 1, *prefixes)


JOB_FIELDS = {
    "readout_tokens": "depthlens.readout_tokens",
    "rank_prefix": "depthlens.think.prefix",
    "decision_prefix": "depthlens.online.prefix",
    "max_new_tokens": "max_tokens",
}
"""A setting the run's checks name → the request's field that sets it (``_sampling``'s refusals)."""


def _sampling(
    body: CompletionRequest | ChatRequest,
    max_tokens: int | None,
    prompts: tuple[tuple[int, ...], ...],
    context: int | None,
    options: DepthlensOptions,
    depth: Depth,
    settings: ServeConfig,
    chat: bool,
) -> SamplingConfig:
    longest = max(len(p) for p in prompts)
    room = None if context is None else context - longest
    if room is not None and room < 1:
        raise ApiError(
            400,
            f"the prompt has {longest} tokens, the model's context {context}: no room for a reply",
            "messages" if chat else "prompt",
            "context_length_exceeded",
        )
    if max_tokens is None:
        max_tokens = settings.default_max_tokens if chat else ServeConfig.COMPLETION_MAX_TOKENS
        max_tokens = min(max_tokens, room) if room is not None else max_tokens
    if not 1 <= max_tokens <= settings.max_tokens:
        raise ApiError(
            400,
            f"max_tokens = {max_tokens} must lie in [1, {settings.max_tokens}] (the server's limit)",
            "max_tokens",
            "invalid_value",
        )
    if room is not None and max_tokens > room:
        raise ApiError(
            400,
            f"prompt ({longest} tokens) + max_tokens ({max_tokens}) exceed the model's context of "
            f"{context}; lower max_tokens",
            "max_tokens",
            "context_length_exceeded",
        )
    try:
        sampling = SamplingConfig(
            temperature=settings.temperature if body.temperature is None else body.temperature,
            top_p=settings.top_p if body.top_p is None else body.top_p,
            top_k=0 if body.top_k in (None, -1) else body.top_k,
            min_p=body.min_p or 0.0,
            max_new_tokens=max_tokens,
            readout_tokens=_readout_window(options, settings, depth),
        )
    except ConfigError as exc:  # an OpenAI field: named as the body spells it
        raise depthlens_error(exc, renamed={"max_new_tokens": "max_tokens"}) from None
    try:  # the window against the prefixes a vote decides at: the check every front's run makes
        check_window(sampling, depth.think, depth.online)
    except InputError as exc:
        raise depthlens_error(exc, renamed=JOB_FIELDS) from None
    return sampling


def _depth(options: DepthlensOptions, settings: ServeConfig, vocab: int | None = None) -> Depth:
    try:
        dtr = DTRConfig(
            g=DTRConfig.g if options.g is None else options.g,
            rho=DTRConfig.rho if options.rho is None else options.rho,
            dtr_prefix_tokens=options.prefix,
        )
        answers = ExtractionConfig(answer_type=options.answer_type or "number")
        think = online = None
        if options.think is not None:
            t = options.think
            if t.n > settings.max_n:
                raise ApiError(
                    400,
                    f"think.n = {t.n} is over the server's limit of {settings.max_n} samples",
                    "depthlens.think.n",
                    "invalid_value",
                )
            try:  # VotingConfig checks the ranges: its error names the request's field
                think = VotingConfig(n=t.n, eta=t.eta, rank_prefix=t.prefix, trials=1, tie_break=t.tie_break)
            except ConfigError as exc:
                raise depthlens_error(exc, "depthlens.think") from None
            answers = ExtractionConfig(answer_type=t.answer_type or answers.answer_type)
        if options.online is not None:
            online = _online(options.online, settings)
            answers = ExtractionConfig(answer_type=options.online.answer_type or answers.answer_type)
        asked = per_token_readout(  # the run builder's checks: ranges, tokens, the vocabulary
            tokens=options.tokens,
            vocab=vocab,
            layer_top_k=options.layer_top_k,
            layer_target=options.layer_target,
            track=tuple(options.track),
            layer_entropy=options.layer_entropy,
        )
    except DepthlensError as exc:
        raise depthlens_error(exc, "depthlens") from None
    return Depth(options.tokens, dtr, answers, think, online, asked)


def _online(o: OnlineOptions, settings: ServeConfig) -> OnlineConfig:
    defaults = OnlineConfig()
    deepconf = o.variant is not None or o.threshold is not None
    signal = o.signal or ("confidence" if deepconf else "dtr")
    if deepconf and signal != "confidence":
        raise ApiError(
            400,
            "online.variant and online.threshold are DeepConf's: they need signal 'confidence'",
            "depthlens.online.signal",
            "invalid_value",
        )
    if o.variant is not None and o.eta is not None:
        raise ApiError(
            400,
            "give online.variant (low = keep 10 %, high = 90 %) or online.eta, not both",
            "depthlens.online.eta",
            "invalid_value",
        )
    keep = VARIANTS[o.variant] if o.variant is not None else o.eta if o.eta is not None else defaults.keep
    fields = {
        "warmup": o.warmup,
        "max_n": o.max_n,
        "consensus": o.consensus,
        "decision_prefix": o.prefix,
        "window": o.window,
        "batch_size": o.batch_size,
    }
    given: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    try:
        config = OnlineConfig(signal=signal, keep=keep, threshold=o.threshold, **given)
    except ConfigError as exc:  # the policy's own check, across fields: the object answers for it
        error = depthlens_error(exc, "depthlens.online", {"keep": "eta"})  # the request's eta is its keep
        raise ApiError(400, error.message, "depthlens", "invalid_value") from None
    if config.max_n > settings.max_n:
        raise ApiError(
            400,
            f"online.max_n = {config.max_n} is over the server's limit of {settings.max_n} samples",
            "depthlens.online.max_n",
            "invalid_value",
        )
    return config
