"""The FastAPI app: OpenAI's routes (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``) and
``/health``, over one engine (docs/serve.md).

Why FastAPI + uvicorn and not vLLM's own OpenAI server extended: vLLM's server drives its ``AsyncLLM`` with its
own request processing (detokenizer, output processor, ``n`` as one request with a shared seed stream), so it has
no place for a per-sample readout, a decision at ℓ that aborts some samples of a request and continues others, or
a vote across samples; and it serves only vLLM, while depthlens serves its transformers sampler too. Our routes
are thin: parse, check, run on the rooms below, shape the OpenAI body.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from depthlens.config import ServeConfig
from depthlens.errors import DepthlensError
from depthlens.sampling.live import GenerationCancelled
from depthlens.sampling.vllm.engine import EngineError
from depthlens.serve import errors
from depthlens.serve.bodies import Envelope, chunk, request_depthlens, response_body, usage_chunk
from depthlens.serve.engines import Engine
from depthlens.serve.errors import ApiError, ClientGone
from depthlens.serve.job import Job, build_job
from depthlens.serve.jobs import Outcome, run_job
from depthlens.serve.metrics import Measured, Metrics
from depthlens.serve.runner import Runner
from depthlens.serve.schema import ChatRequest, CompletionRequest


def finite(value: Any) -> Any:
    """``value`` with every non-finite float as None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _json(value: Any) -> str:
    return json.dumps(finite(value), separators=(",", ":"), ensure_ascii=False)


def _failure(exc: BaseException) -> ApiError:
    """What a request's own run raised, as the error its client gets."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, GenerationCancelled):
        return ApiError(
            503,
            "the request was aborted: the server is shutting down and its --shutdown-grace ran out; "
            "retry on another replica",
            code="aborted",
        )
    if isinstance(exc, EngineError):
        return ApiError(503, str(exc), code="engine_failed")
    if isinstance(exc, DepthlensError):
        return errors.depthlens_error(exc)
    raise exc


class Server:
    """The app's state: one engine, its runner, the tokenizer, the settings."""

    def __init__(self, engine: Engine, tokenizer: Any, settings: ServeConfig) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.settings = settings
        self.runner = Runner(engine, settings)
        self.metrics = Metrics(self.runner)

    def check_key(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise ApiError(
                401, "missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
            )

    async def parse(self, request: Request, model: type[BaseModel]) -> Job:
        self.check_key(request)
        try:
            raw = await request.body()
        except ClientDisconnect:
            raise ClientGone() from None  # answered 499, unlogged (``errors.install``)
        data = errors.read_json(raw)
        errors.refuse_body(data)
        try:
            body = model.model_validate(data)
        except ValidationError as exc:
            raise errors.schema_error(exc) from None
        assert isinstance(body, CompletionRequest | ChatRequest)
        job = build_job(body, self.tokenizer, self.engine.context, self.settings, self.engine.vocab)
        if job.logprobs and not self.engine.top_logprobs:
            param = "top_logprobs" if job.chat else "logprobs"
            raise ApiError(
                400,
                f"the top log-probabilities of each token need a server on the vllm backend (this one runs "
                f"{self.engine.name}, which gives the sampled token's only: {param} 0)",
                param,
                "unsupported",
            )
        if job.logprobs is not None and job.voted:
            raise ApiError(
                400,
                "logprobs are not given for a voted answer (depthlens.think / .online); each "
                "sample's values are in depthlens.tokens",
                "logprobs",
                "unsupported",
            )
        return job

    async def respond(self, request: Request, job: Job) -> Response:
        env = Envelope.new(self.settings.model_id, job.chat)
        top = request_depthlens(job, self.engine)
        cancel = self.runner.admit()
        if job.stream:
            work = lambda push: run_job(self.engine, job, self.tokenizer, cancel, push)  # noqa: E731
            events = self.runner.stream(work, cancel)  # started now: its slot is freed even if never sent
            return StreamingResponse(self.sse(env, job, top, events), media_type="text/event-stream")
        try:
            outcome = await self.runner.call(
                lambda: run_job(self.engine, job, self.tokenizer, cancel), cancel, request
            )
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client has gone
        except Exception as exc:
            raise _failure(exc) from None
        self.metrics.served(outcome.prompt_tokens, outcome.completion_tokens, outcome.readout_tokens)
        return Response(
            _json(response_body(env, job, outcome, self.tokenizer, top)), media_type="application/json"
        )

    async def sse(
        self, env: Envelope, job: Job, top: dict[str, Any], events: AsyncGenerator[dict[str, Any], None]
    ) -> AsyncIterator[str]:
        """The SSE stream: a chunk per event, the usage chunk when asked, ``[DONE]``. Closed early (the client
        left), it closes ``events``, which cancels the request's work."""
        async with contextlib.aclosing(events):
            async for line in self._lines(env, job, top, events):
                yield line

    async def _lines(
        self, env: Envelope, job: Job, top: dict[str, Any], events: AsyncGenerator[dict[str, Any], None]
    ) -> AsyncIterator[str]:
        started: set[int] = set()
        async for event in events:
            if event["type"] == "error":
                try:
                    error = _failure(event["error"])
                except Exception as exc:  # unforeseen: logged like any other, sent without its traceback
                    errors.log.error("unhandled error in a stream", exc_info=exc)
                    error = ApiError(
                        500,
                        f"internal error ({type(exc).__name__}); see the server's log",
                        code="internal_error",
                    )
                yield f"data: {_json(error.body())}\n\n"
                break
            if event["type"] == "done":
                outcome: Outcome = event["outcome"]
                self.metrics.served(outcome.prompt_tokens, outcome.completion_tokens, outcome.readout_tokens)
                if job.include_usage:
                    yield f"data: {_json({**usage_chunk(env, outcome), 'depthlens': top})}\n\n"
                break
            body = chunk(env, event, self.tokenizer, job, event["index"] not in started)
            started.add(event["index"])
            yield f"data: {_json(body)}\n\n"
        yield "data: [DONE]\n\n"


def create_app(engine: Engine, tokenizer: Any, settings: ServeConfig) -> FastAPI:
    """The app serving ``engine`` under ``settings.model_id``; its lifespan's end aborts and stops everything."""
    server = Server(engine, tokenizer, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        server.runner.close()

    app = FastAPI(title="depthlens", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    errors.install(app)
    app.add_middleware(errors.BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Measured, metrics=server.metrics)  # the outermost: it sees every answer, 413s included

    @app.get("/health")
    async def health() -> JSONResponse:
        state = server.runner.health()
        ok = state.get("engine") != "failed" and not server.runner.closing
        return JSONResponse(
            {"status": "ok" if ok else "unavailable", **state}, status_code=200 if ok else 503
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return server.metrics.response()  # open like /health: counts only, for the scraper

    def card() -> dict[str, Any]:
        return {"id": settings.model_id, "object": "model", "created": 0, "owned_by": "depthlens"}

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        server.check_key(request)
        return JSONResponse({"object": "list", "data": [card()]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> JSONResponse:
        server.check_key(request)
        if model_id != settings.model_id:
            raise ApiError(404, f"model {model_id!r} is not served here", "model", "model_not_found")
        return JSONResponse(card())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.respond(request, await server.parse(request, CompletionRequest))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await server.respond(request, await server.parse(request, ChatRequest))

    return app
