"""Which driver a selector pins: the one driver every device it can match belongs to.

Invariant: :func:`pinned_driver` answers ``D`` only when the expression is, at its top
level, a conjunction (``&&``, any nesting and parentheses) one of whose terms is
``device.driver == "D"`` (either side, ``device["driver"]`` too). CEL's ``&&`` is true only
when every term is true, so every device the selector matches has driver ``D``, whatever
the other terms say. Nothing else counts: a comparison under ``||``, ``!``, a ternary or a
macro, an attribute domain, a class name. So another vendor's selector cannot pass for one
that pins ``D`` (``device.driver == "D" || true`` pins nothing).

Read from the checked syntax tree (:func:`dradriver.cel.env.syntax_tree`), not the text.
"""

from __future__ import annotations

from functools import lru_cache

from dradriver.cel import ast
from dradriver.cel.env import CompileError, syntax_tree

__all__ = ["pinned_driver"]


def _is_driver(node: ast.Expr) -> bool:
    """``device.driver`` or ``device["driver"]`` (the variable, not a comprehension's:
    only top-level conjunction terms are read, where no macro variable is in scope)."""
    if isinstance(node, ast.Select):
        return (
            not node.test_only
            and node.field == "driver"
            and isinstance(node.operand, ast.Ident)
            and node.operand.name == "device"
        )
    if isinstance(node, ast.Call) and node.function == "_[_]" and node.target is None:
        base, key = node.args
        return (
            isinstance(base, ast.Ident)
            and base.name == "device"
            and isinstance(key, ast.Const)
            and key.value == "driver"
        )
    return False


def _pins(node: ast.Expr) -> set[str]:
    """The drivers the top-level conjunction ``node`` pins (more than one: matches nothing)."""
    if not isinstance(node, ast.Call) or node.target is not None:
        return set()
    if node.function == "_&&_":
        return set().union(*(_pins(a) for a in node.args))
    if node.function == "_==_" and len(node.args) == 2:
        left, right = node.args
        for variable, literal in ((left, right), (right, left)):
            if (
                _is_driver(variable)
                and isinstance(literal, ast.Const)
                and isinstance(literal.value, str)
            ):
                return {literal.value}
    return set()


@lru_cache(maxsize=1024)
def pinned_driver(expression: str) -> str | None:
    """The driver every device matching ``expression`` has, or None (none pinned, two
    different ones, or the expression does not compile)."""
    try:
        tree = syntax_tree(expression)
    except CompileError:
        return None
    drivers = _pins(tree.expr)
    return next(iter(drivers)) if len(drivers) == 1 else None
