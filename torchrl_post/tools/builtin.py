"""Built-in tools: an exact calculator, and a Python executor that runs code only in the sandbox."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from torchrl_post.tools.sandbox import SandboxLimits, run_sandboxed

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > 64):
            raise ValueError("only small integer powers")
        return Fraction(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def calculator(expression: str) -> str:
    """Exact arithmetic on numbers with + - * / // % ** and parentheses, e.g. calculator("123456 + 654321")
    -> "777777"; a bad expression returns "error: ..." (an observation, not an exception)."""
    try:
        value = _eval(ast.parse(expression, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as e:
        return f"error: {e}"
    return str(value.numerator) if value.denominator == 1 else str(float(value))


def python(code: str) -> str:
    """Run `code` in the sandbox (no network, limited CPU, memory, processes, time); returns its output."""
    result = run_sandboxed(code, SandboxLimits())
    if result.timed_out:
        return "error: timed out"
    text = result.stdout + (result.stderr[-1000:] if result.returncode else "")
    return text + ("\n[output truncated]" if result.truncated else "")
