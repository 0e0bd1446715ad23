"""OpenAI-style errors: every failure answers ``{"error": {"message", "type", "param", "code"}}``, never a traceback.

Statuses (docs/serve.md): 400 a request that cannot be served as given (malformed JSON, a value out of its range
or not one of its choices, beyond a limit or the context, options that contradict each other), 401 a missing or
wrong API key, 404 an unknown model or route, 413 a body over ``--max-body-bytes``, 422 a body that is JSON but not
the schema (a wrong type, an unknown field or ``depthlens`` option, a missing field), 429 the queue is full
(``Retry-After``), 503 the server is shutting down or its engine failed, 500 anything unforeseen — logged here
with its traceback, answered with its type and message only.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from depthlens.errors import DepthlensError, plain
from depthlens.stores.records import unencodable

log = logging.getLogger("depthlens.serve")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


# the code of an error raised without one: every error body carries a code a client can branch on
_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    422: "invalid_type",
    429: "queue_full",
    500: "internal_error",
    503: "unavailable",
}


class ClientGone(Exception):
    """The client disconnected before its response was ready (its samples were aborted)."""


class ApiError(Exception):
    """An error the server answers with ``status`` and the OpenAI error body (``code`` never null: without one
    given, the status's own)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code or _CODES.get(status, "http_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        kind = _TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


_VALUE_ERRORS = {
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "too_short",
    "too_long",
    "literal_error",
}


def _param(loc: tuple[Any, ...]) -> str:
    """A pydantic location as a dotted field name, union branches (``list[int]``) left out."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float")))]
    return _indexed(".".join(parts))


def _indexed(dotted: str) -> str:
    """``messages.1.content`` as a body spells it: ``messages[1].content``."""
    return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", dotted)


def _unencodable_key(value: object, path: str = "") -> str | None:
    """Where a field *name* holds text UTF-8 cannot encode (a lone surrogate): the object holding it ('' for the
    body itself), or None."""
    items: Any = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    )
    for key, item in items:
        if isinstance(key, str) and unencodable(key) is not None:
            return path
        found = _unencodable_key(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def schema_error(exc: ValidationError) -> ApiError:
    """The first problem of a body that does not fit the schema, as a 422 that names the field."""
    errors = exc.errors()
    first = errors[0]
    param = _param(first["loc"])
    if param == "prompt" or param.startswith("prompt"):
        message = "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids"
        return ApiError(422, message, "prompt", "invalid_type")
    if first["type"] == "extra_forbidden":
        where = "depthlens option" if param.startswith("depthlens.") else "field"
        return ApiError(
            422, f"unknown {where}: {param!r}; see docs/serve.md for the fields", param, "unknown_field"
        )
    if first["type"] in _VALUE_ERRORS:  # the right type, a value out of range or not one of the choices
        value = json.dumps(first.get("input"), default=str)[:80]
        return ApiError(400, f"{param}: {first['msg']} (got {value})", param, "invalid_value")
    if first["type"] == "missing":
        return ApiError(422, f"missing required field {param!r}", param, "missing_field")
    value = json.dumps(first.get("input"), default=str)[:80]
    return ApiError(422, f"{param}: {first['msg']} (got {value})", param, "invalid_type")


REQUEST_NAMES = {
    "dtr_prefix_tokens": "prefix",  # depthlens.prefix
    "rank_prefix": "prefix",  # depthlens.think.prefix
    "decision_prefix": "prefix",  # depthlens.online.prefix
    "keep": "eta",  # depthlens.online.eta
}
"""A setting → the field of a request that sets it, where the two names differ (every other field is its
setting's name)."""


def request_name(setting: str) -> str:
    """The request's field for ``setting``."""
    return REQUEST_NAMES.get(setting, setting)


def depthlens_error(exc: DepthlensError, within: str = "", renamed: dict[str, str] | None = None) -> ApiError:
    """A library error raised by a request's own settings (a config out of range, a prompt too long) → 400; one
    about a setting names it, and every other setting its text names, as the request spells them, in the object
    ``within`` (``depthlens.think``): ``depthlens.think.eta 1.5: must be in (0, 1]``. ``renamed``: the request's
    name of a setting the library calls otherwise (online ``eta`` is ``OnlineConfig.keep``)."""
    if exc.setting is None:
        return ApiError(400, exc.phrased(spell=request_name), within or None, "invalid_value")

    def spell(setting: str) -> str:
        name = (renamed or {}).get(setting) or request_name(setting)
        return f"{within}.{name}" if within else name

    def assign(setting: str, value: str) -> str:  # a setting set to a value, as a JSON body writes it
        return f"{spell(setting)} {JSON_WORDS.get(value, plain(value))}"

    param = spell(exc.setting)
    message = exc.phrased(param, repr_value=True, spell=spell, assign=assign)
    head = f"{param} {exc.value!r}:"
    if repr(exc.value) in JSON_WORDS and message.startswith(head):  # ``depthlens.layer_target true: …``
        message = f"{param} {JSON_WORDS[repr(exc.value)]}:" + message[len(head) :]
    return ApiError(400, message, param, "invalid_value")


JSON_WORDS = {"True": "true", "False": "false", "None": "null"}
"""Python's words for the values JSON spells otherwise: a request's error says them as its body does."""


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    message = {404: f"no route {request.method} {request.url.path}", 405: "method not allowed"}.get(
        exc.status_code, str(exc.detail)
    )
    return ApiError(exc.status_code, message).response()


async def _unforeseen(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    text = " ".join(str(exc).split())[:300]
    message = f"internal error ({type(exc).__name__}: {text}); see the server's log"
    return ApiError(500, message, code="internal_error").response()


# No field takes an integer of more digits: the widest, a seed, is read as a 64-bit number (2⁶⁴ − 1 has 20 digits).
# Longer integers are not converted at all — Python refuses to read one of more than 4,300 digits (a ValueError
# from inside the JSON parser), and reading one of 4,000 costs time for a value every field refuses.
MAX_INT_DIGITS = 20


class LongInteger:
    """An integer a body spells with more than ``MAX_INT_DIGITS`` digits, kept as its digit count."""

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))
        self.negative = text.startswith("-")


def _integer(text: str) -> int | LongInteger:
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else LongInteger(text)


def read_json(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; refused with 400 ``invalid_json`` where it is not JSON or reaches past the
    parser's own limits (nesting, any ``ValueError`` of its own), and with 400 naming the field where an integer
    has more digits than any field takes (``MAX_INT_DIGITS``)."""
    try:
        data = json.loads(raw, parse_int=_integer)
    except RecursionError:
        raise ApiError(
            400, "the body's JSON is nested too deeply to read; send a flatter body", code="invalid_json"
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError, as is any other limit
        said = " ".join(str(exc).split())[:200]
        raise ApiError(400, f"the body is not valid JSON ({said})", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    _refuse_long_integers(data)
    return data


def _refuse_long_integers(data: dict[str, Any]) -> None:
    """The first ``LongInteger`` of ``data`` in the body's order, refused naming its field (no recursion: a body
    may nest as deeply as the parser allowed)."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, LongInteger):
            param = _indexed(path)
            sign = "negative " if value.negative else ""
            raise ApiError(
                400,
                f"{param} is a {sign}{value.digits:,}-digit integer: past the range of every field (none takes "
                f"an integer of more than {MAX_INT_DIGITS} digits); send a value in {param}'s range",
                param,
                "invalid_value",
            )
        items = (
            value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        )
        children = [(f"{path}.{key}" if path else str(key), item) for key, item in items]
        stack.extend(reversed(children))


def refuse_body(data: dict[str, Any]) -> None:
    """What no field's own check sees: a text UTF-8 cannot carry (a lone surrogate, which JSON can spell), a
    message whose content is an empty list, and ``max_tokens`` given together with ``max_completion_tokens``
    (which of the two was meant is not guessed)."""
    field = unencodable(data)
    if field is not None:
        raise ApiError(
            400,
            f"{_indexed(field)} holds a lone surrogate (text UTF-8 cannot encode, e.g. \\ud800); send the text "
            "whole",
            _indexed(field),
            "invalid_text",
        )
    holder = _unencodable_key(data)
    if holder is not None:
        raise ApiError(
            400,
            f"a field name in {_indexed(holder) or 'the body'} holds a lone surrogate (text UTF-8 cannot encode, "
            "e.g. \\ud800); send field names whole",
            _indexed(holder) or None,
            "invalid_text",
        )
    messages = data.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("content") == []:
            raise ApiError(
                400,
                f"messages[{i}].content is an empty list; give the message's text",
                f"messages[{i}].content",
            )
    if data.get("max_tokens") is not None and data.get("max_completion_tokens") is not None:
        raise ApiError(
            400,
            "max_tokens and max_completion_tokens given together; send one of them (max_completion_tokens is "
            "OpenAI's newer name)",
            "max_tokens",
            "invalid_value",
        )


def _client_gone(request: Request, exc: Exception) -> Response:
    """A client that left (mid-body, or before its answer): 499, as proxies log it; nobody reads the answer."""
    return Response(status_code=499)


def install(app: Any) -> None:
    """The handlers that turn every exception into the OpenAI error body."""
    from starlette.requests import ClientDisconnect

    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unforeseen)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413 before the route reads it (by its
    Content-Length, or while a chunked body streams in)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_long = (
            declared is not None and declared.isdigit() and (len(declared) > 18 or int(declared) > self.limit)
        )
        if too_long:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise ApiError(413, self._message(), code="body_too_large")
            return message

        await self.app(scope, counted, send)

    def _message(self) -> str:
        return f"request body over {self.limit} bytes (--max-body-bytes); send a shorter prompt"

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = ApiError(413, self._message(), code="body_too_large").response()
        await response(scope, receive, send)
