"""Final answers: extract them from a response, key them for voting, and decide equivalence (docs/definitions.md §5).

A response answers only where it states an answer; a number met in its reasoning is not one. In order:

1. ``tag`` — the last ``<answer>…</answer>`` (only with ``tags``: reasoning-gym's own prompt style);
2. ``boxed`` — the last brace-matched ``\\boxed{…}`` (or ``\\fbox{…}``) with non-empty content;
3. ``phrase`` — the last explicit final-answer phrase: "the answer is …", "final answer: …", "Answer: …",
   "the answer to the question … is …";
4. fallbacks, only for a response that ended by itself (finish ``eos``, not cut at the token cap):
   ``letter`` — a letter task's last "(X)" (or "X)" opening a line); ``last-number`` — a numeric task's last
   number (not the "2." that numbers a step), and only with ``fallback="last-number"``; ``statement`` then
   ``equation`` — with ``fallback="final-result"``, a numeric task's result stated in a small model's own words
   ("the final answer within the specified format is 4", "so, 0 / 4 is simply 0", "7 + 9 is 16, which is the
   final answer"), else the number that ends the response's last equation ("10 + 8 = 18") — nothing when that
   equation is cut off ("3 + 4 =") or goes on past a number ("= 3 + 0"), and never an equation the question
   itself states.

The answer type decides what counts: ``string`` and ``list`` answers are text (never a bare number), ``letter``
answers only the task's option letters, ``number`` and ``expression`` numbers and LaTeX (equivalence through
Math-Verify). A phrase in a cut-off response counts only when its line was finished (the cap did not cut it).

Equivalence goes through Math-Verify. Its own timeout uses SIGALRM, which only works on the main thread, so off
the main thread the check runs in a worker process that is killed on timeout.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import logging
import multiprocessing
import re
import threading
from typing import Literal

from depthlens.config import AnswerType, Fallback

log = logging.getLogger("depthlens.answers")

Source = Literal["tag", "boxed", "phrase", "letter", "last-number", "statement", "equation"]
SOURCES: tuple[str, ...] = (
    "tag",
    "boxed",
    "phrase",
    "letter",
    "last-number",
    "statement",
    "equation",
    "none",
)
RULES = "depthlens-answers-2"
"""The extraction and grading rules of this module; stores written before them (store version 1 without an
``answers`` entry in the manifest) were read by ``depthlens-answers-1``: any last number, cut-off text too."""

NUMERIC: tuple[str, ...] = ("number", "expression")
PLACEHOLDER = (
    "answer here"  # reasoning-gym's system prompt shows <answer>answer here</answer>; models copy it
)

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)  # reasoning_gym.utils.extract_answer's pattern
_PHRASE = re.compile(
    r"(?:\bfinal\s+answer|\banswer)\s*\**\s*(?:(?:is|would\s+be|will\s+be)\b\s*:?|[:：])\s*?\**[ \t]*"
    r"|\banswer\s+to\s+[^\n.]{1,80}?\s+is\b\s*:?[ \t]*",  # "The answer to the question … is X"
    re.IGNORECASE,
)
_STEP_MARKER = re.compile(r"(?m)^[ \t]*\d+[.)](?=\s)")  # "2. " opening a line numbers a step
_STEP = re.compile(r"\s*(?:\d+[.)]|[-*•])\s")  # a numbered or bulleted step, not an answer
_LETTER_IN = re.compile(r"^\(?\s*([A-J])\s*\)?[.:]?(?![A-Za-z])")
_PAREN_LETTER = re.compile(r"\(([A-J])\)|^[ \t]*([A-J])\)", re.MULTILINE)  # "(B)", or "D) …" opening a line
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_MATH = re.compile(r"\$\$?(.+?)\$\$?|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_TEXT_WRAP = re.compile(r"\\(?:text|mathrm|textbf)\{([^}]*)\}")
# The final-result fallback. A number that closes its statement: wrapped in at most $, ** or \( \), and not
# followed by more digits or by an operator that continues the expression ("= 3 + 0" is not a result).
_RESULT = (
    r"(?:\$|\*\*|\\\()?\s*(?P<n>[-−]?\d[\d,]*(?:\.\d+)?(?:/\d+)?)(?![\d,]*\.?\d)(?!\s*[-−+*/×÷^(]\s*[\d(])"
)
# "is 4." / "is 4, …": the number closes its clause (a statement's number may not run on into words).
_CLAUSE_END = r"(?=[^\S\n]*(?:\$|\*\*|\\\)|\\\])?[^\S\n]*(?:[.,;:!?]|\n|$))"
_NAMED = (
    r"[^\S\n]*,?\s*which\s+is\s+the\s+(?:final\s+)?(?:answer|result|solution)\b"  # "…, which is the answer"
)
_STATEMENTS = tuple(
    re.compile(lead + _RESULT + trail, re.IGNORECASE)
    for lead, trail in (
        # "The final answer within the specified format is 4."
        (r"\bfinal\s+answer\b[^\n]{0,60}?\bis\s+", _CLAUSE_END),
        # "So, 0 / 4 is 1." / "Therefore, x equals 7."
        (r"\b(?:so|thus|therefore|hence)\b,?[^\n]{0,80}?\b(?:is|equals)\s+(?:equal\s+to\s+)?", _CLAUSE_END),
        (r"\bsimply\s+", _CLAUSE_END),  # "So, 0 / 4 is simply 0." / "… or simply 4."
        (r"\bsolution\s+is\s+", _CLAUSE_END),  # "In this example, the solution is 0."
        (r"\bis\s+", _NAMED),  # "7 + 9 is 16, which is the final answer."
    )
)
_EQUALS = re.compile(r"(?<![<>!=])=(?!=)")
_LHS = re.compile(r"(?:[\d.()+\-−*/×÷^\s]|(?<![A-Za-z])[A-Za-z](?![A-Za-z]))+$")  # an equation's left side
_EQUATION_RESULT = re.compile(r"\s*" + _RESULT + r"\s*(?:\$|\*\*|\\\)|\\\])?\s*(?:[.,;!]|$|\s)")


@dataclasses.dataclass(frozen=True)
class ExtractionConfig:
    """How to read one task's answers.

    Attributes:
        answer_type: what the task's answers are (see ``config.AnswerType``).
        fallback: ``none``, or ``last-number`` (numeric tasks, responses that ended by themselves).
        tags: read ``<answer>`` tags first (reasoning-gym's native prompt asks for them).
        choices: a letter task's number of options (letters A..); 0 accepts A–J.
    """

    answer_type: AnswerType = "number"
    fallback: Fallback = "none"
    tags: bool = False
    choices: int = 0

    @property
    def letters(self) -> str:
        return "ABCDEFGHIJ"[: self.choices or 10]


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


def _as_type(raw: str, config: ExtractionConfig) -> str | None:
    """A stated answer in the task's type, or None when it is not one (e.g. a word where a letter is due)."""
    s = raw.strip()
    if config.answer_type == "letter":
        m = _LETTER_IN.match(_TEXT_WRAP.sub(r"\1", s).strip())
        return m.group(1) if m and m.group(1) in config.letters else None
    if config.answer_type in ("string", "list"):
        s = _TEXT_WRAP.sub(r"\1", s)
    elif config.answer_type == "number" and not re.search(r"\d", s):
        return None  # "answer here", a word: not a number
    elif config.answer_type == "expression" and not re.search(r"[\d\\^=+*/-]", s):
        return None
    if s.lower() == PLACEHOLDER:
        return None
    return s or None


def _phrase_span(text: str, end: int, finished: bool) -> str | None:
    """The statement after a final-answer phrase: the rest of its line (or the next line when the phrase ends
    its own, unless that line is a numbered or bulleted step), cut at the first sentence end."""
    if text[end:].startswith("\n") and not _STEP.match(text, end + 1):
        end += 1
    stop = text.find("\n", end)
    line = text[end:] if stop < 0 else text[end:stop]
    if stop < 0 and not finished and not re.search(r"[.!}$*]\s*$", line):
        return None  # the token cap cut this line: its answer may be cut too
    line = re.split(r"(?<=[^\d\s])\.(?:\s|$)|\.\s", line, maxsplit=1)[0]
    line = line.strip().strip("*`\"'").strip()
    line = re.sub(r"[.,;:!]+$", "", line).strip().strip("*`\"'").strip()
    return line or None


def _from_phrase(span: str, config: ExtractionConfig) -> str | None:
    if config.answer_type in NUMERIC:
        math = _MATH.search(span)
        if math:
            return next(g for g in math.groups() if g is not None).strip() or None
        if config.answer_type == "number":
            number = _NUMBER.search(span)
            return number.group(0).rstrip(".,") if number else None
    return _as_type(span, config)


def _final_result(text: str, question: str) -> Answer | None:
    """The final-result fallback: the last result stated in words, else the number ending the last equation."""
    statements = [m for pattern in _STATEMENTS for m in pattern.finditer(text)]
    if statements:
        last = max(statements, key=lambda m: m.start("n"))
        return Answer(last.group("n").replace("−", "-").rstrip(","), "statement")
    equals = list(_EQUALS.finditer(text))
    if not equals:
        return None
    last = equals[-1]
    result = _EQUATION_RESULT.match(text, last.end())
    if result is None:  # cut off ("3 + 4 =") or not a number: an earlier step is not the answer either
        return None
    lhs = _LHS.search(text, max(0, last.start() - 200), last.start())  # bounded: no quadratic scan
    equation = re.sub(r"\s+", "", f"{lhs.group(0) if lhs else ''}={result.group('n')}").strip(".")
    if question and equation in re.sub(r"\s+", "", question):
        return None  # the question's own equation, restated
    return Answer(result.group("n").replace("−", "-").rstrip(","), "equation")


def extract_answer(
    text: str, config: ExtractionConfig = ExtractionConfig(), finished: bool = True, question: str = ""
) -> Answer | None:
    """The final answer a response states, or None when it states none.

    ``finished``: the response ended by itself (finish ``eos``); False for one cut at the token cap, which then
    answers only by a tag, a box or a final-answer phrase whose line was complete. ``question``: the question's
    text, so that the final-result fallback never reads an equation the question states.
    """
    if config.tags:
        for content in reversed(_TAG.findall(text)):
            found = _as_type(content, config)
            if found:
                return Answer(found, "tag")
    for content in reversed(boxed_contents(text)):
        found = _as_type(content, config) if content.strip() else None
        if found:
            return Answer(found, "boxed")
    for match in reversed(list(_PHRASE.finditer(text))):
        span = _phrase_span(text, match.end(), finished)
        found = _from_phrase(span, config) if span else None
        if found:
            return Answer(found, "phrase")
    if not finished:
        return None
    if config.answer_type == "letter":
        hits = [a or b for a, b in _PAREN_LETTER.findall(text) if (a or b) in config.letters]
        return Answer(hits[-1], "letter") if hits else None
    if config.answer_type in NUMERIC and config.fallback == "last-number":
        numbers = _NUMBER.findall(_STEP_MARKER.sub(" ", text))
        if numbers:
            return Answer(numbers[-1].rstrip(".,"), "last-number")
    if config.answer_type in NUMERIC and config.fallback == "final-result":
        return _final_result(text, question)
    return None


def vote_key(answer: str) -> str:
    """A canonical form so that equal answers vote together: "-4.0", "−4", "$-4$" and "-4." share a key.

    Numbers (including a/b and \\frac{a}{b}) become their value; other text is stripped of spacing, $ and
    \\text{…} wrappers. Not full symbolic equivalence — that is ``answers_equivalent`` — but what voting needs.
    """
    s = answer.strip().replace("−", "-").replace("$", "")
    s = _TEXT_WRAP.sub(r"\1", s)
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

    parsed_gold = parse(f"${gold}$", parsing_timeout=timeout)
    parsed_pred = parse(f"${pred}$", parsing_timeout=timeout)
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
            # Shut it down before the interpreter tears its modules down (else a noisy weakref callback).
            atexit.register(_pool.shutdown, wait=True, cancel_futures=True)
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
