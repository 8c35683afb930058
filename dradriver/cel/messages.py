"""CEL error messages as Kubernetes users know them, from cel-cpp's errors.

Invariants:
- cel-cpp's status codes (``INVALID_ARGUMENT: ``, `` [NOT_FOUND]``) never reach a user.
- A missing map key reads like cel-go's (``no such key: k``) with Kubernetes' hint to use
  optional chaining or ``has()``.
- cel-cpp's iteration budget (:data:`ITERATION_BUDGET` comprehension iterations per
  evaluation, nested loops sharing it; not configurable from Python) is named as this
  adapter's stand-in for the CEL cost limit.
- :func:`failure_message` words any exception an evaluation raised; it never raises.
"""

from __future__ import annotations

import re

__all__ = ["ITERATION_BUDGET", "compile_message", "failure_message", "runtime_message"]

ITERATION_BUDGET = 10_000

_NO_SUCH_KEY_HINT = (
    ". consider using CEL optional chaining (.? followed by orValue()) or guarding the "
    "check with has() for optional fields"
)

_STATUS_PREFIX = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX = re.compile(r"\s*\[[A-Z_]+\]\s*$")
_NOT_FOUND = re.compile(r'Key not found in map\s*:\s*"?(?P<key>[^"]*)"?')


def compile_message(text: str) -> str:
    """A cel-cpp compile error without status-code noise."""
    text = _STATUS_SUFFIX.sub("", _STATUS_PREFIX.sub("", text.strip()))
    text = text.replace(" (in container '')", "")
    return text.removeprefix("ERROR: ")


def runtime_message(text: str) -> str:
    """A cel-cpp runtime error worded like cel-go's, with Kubernetes' hint for missing keys."""
    text = _STATUS_SUFFIX.sub("", _STATUS_PREFIX.sub("", text.strip()))
    missing = _NOT_FOUND.search(text)
    if missing is not None:
        return f"no such key: {missing['key']}{_NO_SUCH_KEY_HINT}"
    if "Iteration budget exceeded" in text:
        return (
            f"iteration budget exceeded: more than {ITERATION_BUDGET} comprehension "
            "iterations in one evaluation (this adapter's stand-in for the CEL cost limit)"
        )
    return text


def failure_message(error: BaseException) -> str:
    """The reason recorded when evaluating raised ``error`` (the device does not match)."""
    if isinstance(error, RecursionError):
        return f"CEL evaluation failed: recursion limit exceeded ({error})"
    if isinstance(error, MemoryError):
        return f"CEL evaluation failed: out of memory{': ' + str(error) if str(error) else ''}"
    if isinstance(error, RuntimeError):
        return runtime_message(str(error))
    return f"CEL evaluation failed: {type(error).__name__}: {error}"
