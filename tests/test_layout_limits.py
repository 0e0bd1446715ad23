"""The layout's limits as design (docs/architecture.md, COMMON's house rules): no function in ``src/`` runs past 60
lines, no module past 400, and every ``type: ignore`` left in ``src/`` names its error code and says why.

A function's length is counted as ``ast`` gives it, from its ``def`` line to its last line (decorators aside);
nested functions count inside their parent too. A module grows past the limit by a new concern: split it by that
concern into a module of its own, not by cutting it at line 400.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

SRC = Path(__file__).parent.parent / "src" / "depthlens"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400
# ``# type: ignore[code, …]`` then, after it, a comment saying why (``# vllm's worker has no stubs``)
IGNORE = re.compile(r"type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)")


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(SRC.parent.parent).as_posix()


def test_no_function_runs_past_60_lines():
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{_name(path)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, (
        f"functions over {MAX_FUNCTION_LINES} lines (name each step as a helper of its own):\n"
        + "\n".join(long)
    )


def test_no_module_runs_past_400_lines():
    long = []
    for path in _modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            long.append(f"{_name(path)}: {lines} lines")
    assert not long, (
        f"modules over {MAX_MODULE_LINES} lines (split each by concern, one module per concern):\n"
        + "\n".join(long)
    )


def _ignores(source: str) -> list[tuple[int, str]]:
    """Each ``type: ignore`` comment of ``source``: its line and the comment's text from ``type:`` on."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and re.search(r"type:\s*ignore", token.string):
            found.append((token.start[0], token.string[token.string.index("type:") :]))
    return found


def test_every_type_ignore_names_its_code_and_says_why():
    bare = []
    for path in _modules():
        for line, comment in _ignores(path.read_text(encoding="utf-8")):
            match = IGNORE.match(comment)
            assert match is not None
            codes, rest = match.group("codes"), match.group("rest").strip()
            why = rest.lstrip("#").strip()
            if not codes or codes == "[]" or not rest.startswith("#") or len(why) < 8:
                bare.append(f"{_name(path)}:{line}: # {comment}")
    assert not bare, (
        "type: ignore without its error code or without a reason after it "
        "(`# type: ignore[attr-defined]  # vllm's worker has no stubs`):\n" + "\n".join(bare)
    )


def test_the_checks_see_what_they_count():
    """The counting itself: a 61-line function, a bare ignore and a coded one with its reason."""
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    tree = ast.parse(f"def f():\n{body}\n")
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 == 61
    source = (
        "a = 1  # type: ignore\nb = 2  # type: ignore[assignment]  # the stub says int, numpy gives int64\n"
    )
    comments = [IGNORE.match(c) for _, c in _ignores(source)]
    assert [m.group("codes") if m else None for m in comments] == [None, "[assignment]"]
    assert comments[1] is not None and comments[1].group("rest").strip().startswith("# the stub")
