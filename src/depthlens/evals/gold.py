"""Checking a generated question's reference answer before it is asked (docs/definitions.md §5, "References").

Some reasoning-gym generators state an answer the question's own expression does not equal: in reasoning-gym
0.1.25, ``basic_arithmetic`` without parentheses picks a new divisor (or falls back to multiplying) after it has
printed the old one, so "Calculate 4 / 1." carries the answer 2 and "Calculate 5 / 9." the answer 10 — about one
question in five at one-digit settings. Every response to such a question is graded against a wrong reference, so
depthlens evaluates the arithmetic itself, exactly (rationals, no ``eval``), and does not ask those questions.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,  # the displayed "/" means division; a floor-divided reference is not its value
}


def expression_value(text: str) -> Fraction | None:
    """The exact value of an arithmetic expression of numbers, + − × ÷ and parentheses; None for anything else
    (names, powers, calls, a division by zero) — such expressions are not checked."""
    try:
        tree = ast.parse(text.replace("×", "*").replace("÷", "/").replace("−", "-"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            inner = value(node.operand)
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not plain arithmetic: {ast.dump(node)[:40]}")

    try:
        return value(tree.body)
    except (ValueError, ZeroDivisionError, RecursionError):  # RecursionError: absurdly deep nesting
        return None


def reference_disagrees(metadata: dict[str, Any], answer: str) -> str | None:
    """Why a generated entry's stated ``answer`` cannot be trusted, or None when it can (or cannot be checked).

    Checked: entries whose metadata carries an arithmetic ``expression`` and whose answer is a number.
    """
    expression = metadata.get("expression")
    if not isinstance(expression, str):
        return None
    computed = expression_value(expression)
    try:
        stated = Fraction(answer.strip().replace("−", "-"))
    except (ValueError, ZeroDivisionError):
        return None
    if computed is None or computed == stated:
        return None
    shown = str(computed) if computed.denominator == 1 else f"{computed} ≈ {float(computed):.4g}"
    return f"{expression.strip()} is {shown}, but the stated answer is {answer.strip()}"
