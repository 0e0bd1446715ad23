"""Final answers: extract them from a response, key them for voting, and decide equivalence (docs/definitions.md §5).

Extraction, in order: the last brace-matched ``\\boxed{…}`` (or ``\\fbox{…}``) with non-empty content; for
multiple-choice questions a letter — inside the box, after "answer is", or the last "(X)"; otherwise the last
plain number of the text. Equivalence goes through Math-Verify. Its own timeout uses SIGALRM, which only works
on the main thread, so off the main thread the check runs in a worker process that is killed on timeout.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import multiprocessing
import re
import threading
from typing import Literal

log = logging.getLogger("depthlens.answers")

Source = Literal["boxed", "letter", "number"]

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_LETTER_IN = re.compile(r"^\(?\s*([A-J])\s*\)?[.:]?$")
_ANSWER_IS = re.compile(r"answer\s+is\s*:?\s*\\?\(?\s*\(?([A-J])\)?(?![A-Za-z])", re.IGNORECASE)
_PAREN_LETTER = re.compile(r"\(([A-J])\)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str
    source: Source


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{…}`` in ``text``, braces matched (nested braces kept), in order."""
    found = []
    for match in _BOX.finditer(text):
        i = match.end()
        if i >= len(text):
            continue
        if text[i] != "{":  # \boxed 5: one token without braces
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                found.append(token.group(0))
            continue
        depth, j = 0, i
        while j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                found.append(text[i + 1 : j])
                break
            j += 1
    return found


def extract_answer(text: str, choices: int = 0) -> Answer | None:
    """The final answer of a response, or None when it states none.

    ``choices`` > 0 makes it a multiple-choice question with letters A.. (only letters count then).
    """
    boxed = [b.strip() for b in boxed_contents(text) if b.strip()]
    letters = "ABCDEFGHIJ"[:choices]
    if choices:
        for content in reversed(boxed):
            inner = re.sub(r"\\text\{([^}]*)\}", r"\1", content).strip()
            m = _LETTER_IN.match(inner)
            if m and m.group(1) in letters:
                return Answer(m.group(1), "letter")
        for pattern in (_ANSWER_IS, _PAREN_LETTER):
            hits = [m.group(1) for m in pattern.finditer(text) if m.group(1) in letters]
            if hits:
                return Answer(hits[-1], "letter")
        return None
    if boxed:
        return Answer(boxed[-1], "boxed")
    numbers = _NUMBER.findall(text)
    if numbers:
        return Answer(numbers[-1].rstrip("."), "number")
    return None


def vote_key(answer: str) -> str:
    """A canonical form so that equal answers vote together: "-4.0", "−4", "$-4$" and "-4." share a key.

    Numbers (including a/b and \\frac{a}{b}) become their value; other text is stripped of spacing, $ and
    \\text{…} wrappers. Not full symbolic equivalence — that is ``answers_equivalent`` — but what voting needs.
    """
    s = answer.strip().replace("−", "-").replace("$", "")
    s = re.sub(r"\\(?:text|mathrm|textbf)\{([^}]*)\}", r"\1", s)
    s = re.sub(r"\\[,;!: ]|\\left|\\right", "", s)
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s).strip().rstrip(".").strip()
    frac = re.fullmatch(r"(-?)\\d?frac\{(-?\d+)\}\{(\d+)\}", s)
    if frac:
        s = f"{frac.group(1)}{frac.group(2)}/{frac.group(3)}"
    number = s.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s) else s
    try:
        if re.fullmatch(r"-?\d+/\d+", number):
            num, den = number.split("/")
            value = int(num) / int(den) if int(den) else None
        else:
            value = float(number)
    except ValueError:
        value = None
    if value is not None and value == value and abs(value) != float("inf"):
        return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(round(value, 9))
    return re.sub(r"\s+", "", s)


def _verify_in_process(pred: str, gold: str, timeout: int | None) -> bool | None:
    """Math-Verify's verdict: True / False, or None when either side does not parse."""
    from math_verify import parse, verify

    parsed_gold = parse(f"${gold}$", parsing_timeout=timeout)  # type: ignore[arg-type]
    parsed_pred = parse(f"${pred}$", parsing_timeout=timeout)  # type: ignore[arg-type]
    # Math-Verify falls back to the raw string when it extracts nothing: only a parsed expression counts.
    if not any(not isinstance(x, str) for x in parsed_gold) or not any(
        not isinstance(x, str) for x in parsed_pred
    ):
        return None
    return bool(verify(parsed_gold, parsed_pred, timeout_seconds=timeout))


_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _warm() -> None:
    import math_verify  # noqa: F401  (sympy and the LaTeX parser take seconds to import)

    # The worker disables Math-Verify's SIGALRM timeout on purpose (the parent enforces one): silence its warning.
    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _worker_pool() -> concurrent.futures.ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            _pool.submit(_warm).result(timeout=300)  # start-up is not charged to the first check's timeout
        return _pool


def _reset_pool() -> None:
    global _pool
    with _pool_lock:
        if _pool is not None:
            for process in list(getattr(_pool, "_processes", {}).values()):
                process.kill()  # a runaway sympy simplification does not stop on request
            _pool.shutdown(wait=False, cancel_futures=True)
            _pool = None


def answers_equivalent(pred: str, gold: str, timeout_s: int = 5) -> bool | None:
    """Is ``pred`` the same answer as ``gold``? True / False; None when Math-Verify cannot parse one of them or
    runs out of time (callers count None as wrong, and log it).

    Equal vote keys short-cut the check. On the main thread Math-Verify's SIGALRM timeout is used; elsewhere the
    check runs in a spawned worker process, killed and replaced when it overruns.
    """
    if vote_key(pred) == vote_key(gold):
        return True
    if threading.current_thread() is threading.main_thread():
        try:
            return _verify_in_process(pred, gold, timeout_s)
        except Exception as exc:  # Math-Verify raises its own TimeoutException and sympy errors
            log.warning("math-verify failed on %r vs %r: %s", pred, gold, exc)
            return None
    future = _worker_pool().submit(_verify_in_process, pred, gold, None)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        log.warning("math-verify timed out on %r vs %r; counted as wrong", pred, gold)
        _reset_pool()
        return None
    except Exception as exc:
        log.warning("math-verify failed on %r vs %r: %s", pred, gold, exc)
        return None
