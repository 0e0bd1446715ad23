"""A response's text as it grows: incremental decoding (what a stream sends at each step) and stop strings.

Decoding token by token is not decoding the tokens one at a time: a multi-byte character or a word piece may need
the next token. The decoder keeps the text of the tokens already sent and sends only what the whole sequence's
decoding adds beyond it, holding back a tail that ends in an incomplete character (U+FFFD) — and, with stop
strings, a tail that could still grow into one. The streamed pieces joined equal ``final_text``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_INCOMPLETE = "\ufffd"


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True) if tokenizer is not None else ""


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string (excluded), and whether one was found."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def final_text(tokenizer: Any, ids: Sequence[int], stop: Sequence[str]) -> str:
    return cut_at_stop(decode(tokenizer, ids), stop)[0]


class TextStream:
    """One response's text, fed its token ids as they come; ``feed`` returns the new text that may be sent."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.text = ""  # the decoded text so far (cut at a stop string once one appears)
        self.sent = 0  # characters of ``text`` already handed out
        self.stopped = False  # a stop string appeared: nothing after it counts

    def feed(self, ids: Sequence[int], final: bool = False) -> str:
        """The text of ``ids`` (all tokens so far) beyond what was sent; ``final``: the response has ended, send
        everything held back."""
        if self.stopped:
            return ""
        text = decode(self.tokenizer, ids)
        text, self.stopped = cut_at_stop(text, self.stop)
        self.text = text
        ready = len(text)
        if not (final or self.stopped):
            while ready > self.sent and text[ready - 1] == _INCOMPLETE:
                ready -= 1  # a character still missing its bytes
            ready -= self._stop_prefix(text[:ready])
        if ready <= self.sent:
            return ""
        piece, self.sent = text[self.sent : ready], ready
        return piece

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest tail of ``text`` that begins a stop string (held back: it may become one)."""
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    longest = max(longest, k)
                    break
        return longest
