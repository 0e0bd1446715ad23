"""A record of ``depthlens score``'s input as the model reads it: its text (a prompt, chat messages rendered by the
model's template, a completion tokenised on its own) or its ids as token ids, checked by the reader that will take
them — a record it cannot read is a ``BadRecord`` (``skip_bad`` skips it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from depthlens.errors import InputError, named
from depthlens.models.load import LoadedModel
from depthlens.readout.stream import TokenSequence
from depthlens.stores.inputs import BadLine, InputRecord


def as_token_ids(value: Any) -> list[int]:
    # apply_chat_template returns a list, or a BatchEncoding in recent transformers.
    if hasattr(value, "keys") and "input_ids" in value:
        value = value["input_ids"]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value and isinstance(value[0], list):
        value = value[0]
    return [int(i) for i in value]


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], where: str) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template, ready for the reply."""
    from jinja2 import TemplateError

    try:
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except (TemplateError, ValueError, TypeError, KeyError, IndexError) as exc:
        # The template itself rejects the conversation (roles out of order, a role it does not know, ...).
        raise InputError(
            f"{where}: the model's chat template rejects these messages ({type(exc).__name__}: {exc}); "
            "check the roles and their order, or give a plain 'prompt'"
        ) from None
    return as_token_ids(rendered)


def tokenize(lm: LoadedModel, data: dict[str, Any], where: str) -> TokenSequence:
    """Token ids of one input record: prompt (context) and completion (scored)."""
    if "prompt_ids" in data:
        completion = (
            data["completion_ids"] if "completion_ids" in data else data["token_ids"]
        )  # a sample store
        return TokenSequence(list(data["prompt_ids"]), list(completion))
    tok = lm.tokenizer
    if tok is None:
        raise InputError(f"{where}: model {lm.name} has no tokenizer; give 'prompt_ids' and 'completion_ids'")
    if "messages" in data:
        if not getattr(tok, "chat_template", None):
            raise InputError(f"{where}: model {lm.name} has no chat template; give a plain 'prompt' instead")
        prompt = render_chat(tok, data["messages"], where)
    else:
        prompt = as_token_ids(tok(data["prompt"], add_special_tokens=True)["input_ids"])
        if not prompt and tok.bos_token_id is not None:
            prompt = [tok.bos_token_id]
    # The completion is tokenised on its own, as generation appends tokens after the prompt's last one.
    completion = as_token_ids(tok(data["completion"], add_special_tokens=False)["input_ids"])
    return TokenSequence(prompt, completion)


class BadRecord(InputError):
    """A record the model cannot read (a token id outside its vocabulary, too long for its context): ``skip_bad``
    skips it, so a rerun that resumes must pass it too. ``problem``: what is wrong, without the remedy."""

    def __init__(self, problem: str) -> None:
        super().__init__(
            f"{problem} (pass {named('skip_bad', True)} to skip such records)", setting="skip_bad"
        )
        self.problem = problem


def checked_sequence(
    lm: Any,
    record: InputRecord,
    validate: Callable[[TokenSequence, str], None],
    on_skip: Callable[[BadLine], None] | None,
) -> TokenSequence | None:
    """The record tokenized and checked by ``validate``; None when it is bad and ``on_skip`` takes it (else the
    InputError, naming the line, says how to skip such records)."""
    where = f"line {record.line} (id {record.id!r})" if record.line else f"record {record.id!r}"
    try:
        seq = tokenize(lm, record.data, where)
        validate(seq, where)
    except InputError as exc:
        if on_skip is None:
            raise BadRecord(str(exc)) from None
        on_skip(BadLine(record.line, str(exc)))
        return None
    return seq
