"""A request's prompt as the token ids the engine reads: a completion's prompts, or a chat's messages through the
model's chat template; every refusal a 400 naming its field."""

from __future__ import annotations

from typing import Any

from depthlens.config import ServeConfig
from depthlens.errors import InputError
from depthlens.serve.errors import ApiError
from depthlens.serve.schema import ChatRequest, CompletionRequest
from depthlens.studies.score_inputs import as_token_ids, render_chat


def completion_prompts(
    body: CompletionRequest, tokenizer: Any, settings: ServeConfig
) -> tuple[tuple[int, ...], ...]:
    """The token ids of a completion request's prompts: a string, ids, or a list of either (up to the server's
    ``max_prompts``), strings tokenized as the model reads them; none empty."""
    raw = body.prompt
    if isinstance(raw, str) or (raw and isinstance(raw[0], int)):
        items: list[Any] = [raw]
    else:
        items = list(raw)
    if not items or len(items) > settings.max_prompts:
        raise ApiError(
            400,
            f"give 1 to {settings.max_prompts} prompts (the server's limit), not {len(items)}",
            "prompt",
            "invalid_value",
        )
    out = []
    for item in items:
        if isinstance(item, str):
            if tokenizer is None:
                raise ApiError(
                    400, "this model has no tokenizer: give the prompt as token ids", "prompt", "no_tokenizer"
                )
            ids = as_token_ids(tokenizer(item, add_special_tokens=True)["input_ids"])
        else:
            ids = list(item)
        if not ids:
            raise ApiError(400, "the prompt is empty: give at least one token", "prompt", "invalid_value")
        out.append(tuple(ids))
    return tuple(out)


def chat_prompt(body: ChatRequest, tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """The token ids of a chat request's messages through the model's chat template (no tools; every message
    with its content)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ApiError(
            400,
            "this model has no chat template; use /v1/completions with a plain prompt",
            "messages",
            "no_chat_template",
        )
    for i, m in enumerate(body.messages):
        if m.tool_calls:
            raise ApiError(
                400,
                f"messages[{i}].tool_calls: depthlens serve runs no tools; send the assistant's turn as "
                "its content (tool_calls empty or left out)",
                f"messages[{i}].tool_calls",
                "unsupported",
            )
        if m.content is None:
            raise ApiError(
                400,
                f"messages[{i}] ({m.role}) has no content: give its text as 'content' (a string or a list "
                "of text parts)",
                f"messages[{i}].content",
                "missing_content",
            )
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages
    ]
    try:
        return (tuple(render_chat(tokenizer, messages, "messages")),)
    except InputError as exc:
        raise ApiError(400, str(exc), "messages", "invalid_value") from None
