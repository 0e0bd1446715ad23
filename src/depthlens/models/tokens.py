"""Tokens as a person reads them: the text of each token, whitespace and stray bytes made visible.

Tokenizers store pieces in their own alphabets — byte-level BPE writes a space as ``Ġ`` and the bytes of
``é`` as ``Ã©``; SentencePiece writes a space as ``▁`` and unknown characters as byte pieces ``<0xE2>``. A piece
is turned back into its bytes, the bytes into text; a space shows as ``␣``, a newline as ``↵``, a tab as ``⇥``,
and bytes that are only part of a character (the rest is in the next token) as ``⟨e2⟩``. Labels only: token
ids stay the exact record.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"})


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the printable character standing for each of the 256 bytes."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def _is_byte_level(tokenizer: Any) -> bool:
    # A byte-level tokenizer reads "Ġ" as a space; any other keeps it as the letter (or cannot say).
    to_string = getattr(tokenizer, "convert_tokens_to_string", None)
    try:
        return to_string is not None and to_string(["Ġ"]) == " "
    except (KeyError, TypeError, ValueError):
        return False


def piece_bytes(piece: str, byte_level: bool) -> bytes:
    """The bytes a vocabulary piece stands for."""
    match = _BYTE_PIECE.fullmatch(piece)
    if match:
        return bytes([int(match.group(1), 16)])
    table = _byte_of_char()
    if byte_level and all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    return piece.replace("▁", " ").encode("utf-8")


def readable(raw: bytes) -> str:
    """``raw`` as text with whitespace visible and bytes of an incomplete character as ``⟨xx⟩``."""
    text = raw.decode("utf-8", errors="surrogateescape")
    out = "".join(f"⟨{ord(c) - 0xDC00:02x}⟩" if "\udc80" <= c <= "\udcff" else c for c in text)
    return out.translate(_VISIBLE) or "∅"


def token_bytes(tokenizer: Any, token_ids: Sequence[int]) -> list[bytes]:
    """The bytes each token stands for (a character split across tokens is split here too)."""
    byte_level = _is_byte_level(tokenizer)
    return [piece_bytes(str(p), byte_level) for p in tokenizer.convert_ids_to_tokens(list(token_ids))]


def token_texts(tokenizer: Any, token_ids: Sequence[int]) -> list[str]:
    """One readable label per token id (see the module docstring)."""
    byte_level = _is_byte_level(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(token_ids))
    return [readable(piece_bytes(str(p), byte_level)) for p in pieces]


def layer_top_texts(
    tokenizer: Any, layer_top_ids: Sequence[Sequence[Sequence[int]]]
) -> list[list[list[str]]]:
    """``token_texts`` of each layer's top-k ids, [T][L][K] → the same shape of labels (``layer_top_tokens``):
    one tokenizer call for the whole array."""
    flat = [i for layers in layer_top_ids for ids in layers for i in ids]
    texts = iter(token_texts(tokenizer, flat))
    return [[[next(texts) for _ in ids] for ids in layers] for layers in layer_top_ids]
