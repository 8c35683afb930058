"""The Kubernetes CEL functions a DRA selector can call, as a cel-expr-python extension.

Implemented (Kubernetes ``k8s.io/apiserver/pkg/cel/library``):

* Quantity: ``quantity(s)``, ``isQuantity(s)``, ``sign(q)`` (global), ``q.asInteger()``,
  ``q.isInteger()``, ``q.asApproximateFloat()``, ``q.add(q|int)``, ``q.sub(q|int)``,
  ``q.compareTo(q)``, ``q.isGreaterThan(q)``, ``q.isLessThan(q)``; ``==`` is exact.
* Semver: ``semver(s)``, ``semver(s, normalize)``, ``isSemver(s)``, ``isSemver(s,
  normalize)``, ``v.major()``, ``v.minor()``, ``v.patch()``, ``v.compareTo(v)``,
  ``v.isGreaterThan(v)``, ``v.isLessThan(v)``; ``==`` ignores build metadata.
* DRA: ``x.includes(v)`` on a list attribute (at most 48 elements) or a scalar.
* k8s Lists: ``l.isSorted()``, ``l.sum()``, ``l.min()``, ``l.max()``, ``l.indexOf(v)``,
  ``l.lastIndexOf(v)``.
* k8s Regex: ``s.find(re)``, ``s.findAll(re)``, ``s.findAll(re, limit)`` with RE2 syntax
  and Go's ``regexp`` semantics, on the linear-time RE2 engine (``google-re2``): a
  pathological pattern such as ``^(a+)+$`` cannot backtrack. Patterns RE2 rejects
  (backreferences, lookaround) are a compile error when literal (:func:`regex_problem`,
  used by :mod:`dradriver.cel.env`) and an evaluation error otherwise. ``matches`` is
  cel-cpp's own, also RE2.

Not implemented (a selector using them fails to compile with "undeclared reference"):
the k8s URL, IP, CIDR and Format libraries, and Authz (unusable in DRA anyway).

cel-cpp keys runtime overloads by value *kind*, so two message-typed overloads with the
same name collide; ``compareTo``/``isGreaterThan``/``isLessThan``/``includes`` are one
``(dyn, dyn)`` member overload each that dispatches here and raises ``TypeError`` ("no such
overload") for mixed types. This loses the compile-time type check for those four names
only (``quantity("1").compareTo(1)`` compiles; Go refuses it).

Every Python callback leaks its argument tuple and result in cel-expr-python 0.1.3, so
each call is counted (:data:`CALLBACKS`); see :mod:`dradriver.cel.env` for how the adapter
bounds the number of calls.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import cel_expr_python.cel as cel
import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

from dradriver.cel import _types
from dradriver.cel.quantity import INT64_MAX, QuantityError, nanos_to_decimal, parse_nanos
from dradriver.cel.semver import Semver, SemverError, compare_semver, parse_semver

__all__ = ["CALLBACKS", "CALLBACK_FUNCTIONS", "REGEX_FUNCTIONS", "extension", "regex_problem"]

MAX_LIST_INCLUDES = 48
INT64_MIN = -(2**63)


class _Counter:
    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0


CALLBACKS = _Counter()
"""How many Python callbacks CEL has made in this process (each one leaks a little)."""


@functools.lru_cache(maxsize=4096)
def _nanos(text: str) -> int:
    return parse_nanos(text)


@functools.lru_cache(maxsize=4096)
def _semver(text: str, normalize: bool) -> Semver:
    return parse_semver(text, normalize)


def _quantity(text: str) -> Any:
    try:
        return _types.quantity_message(_nanos(text))
    except QuantityError as e:
        raise ValueError(str(e)) from None


def _is_quantity(text: str) -> bool:
    try:
        _nanos(text)
    except QuantityError:
        return False
    return True


def _sign(q: Any) -> int:
    n = _types.quantity_nanos(q)
    return (n > 0) - (n < 0)


def _as_integer(q: Any) -> int:
    n = _types.quantity_nanos(q)
    if n % _NANO or not INT64_MIN <= n // _NANO <= INT64_MAX:
        raise ValueError("cannot convert value to integer")
    return n // _NANO


def _is_integer(q: Any) -> bool:
    n = _types.quantity_nanos(q)
    return n % _NANO == 0 and INT64_MIN <= n // _NANO <= INT64_MAX


def _as_float(q: Any) -> float:
    value = nanos_to_decimal(_types.quantity_nanos(q))
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


_NANO = 10**9


def _add(q: Any, other: Any) -> Any:
    delta = other * _NANO if isinstance(other, int) else _types.quantity_nanos(other)
    return _types.quantity_message(_types.quantity_nanos(q) + delta)


def _sub(q: Any, other: Any) -> Any:
    delta = other * _NANO if isinstance(other, int) else _types.quantity_nanos(other)
    return _types.quantity_message(_types.quantity_nanos(q) - delta)


def _compare(a: Any, b: Any) -> int:
    if _types.is_quantity(a) and _types.is_quantity(b):
        x, y = _types.quantity_nanos(a), _types.quantity_nanos(b)
        return (x > y) - (x < y)
    if _types.is_semver(a) and _types.is_semver(b):
        return compare_semver(_types.semver_value(a), _types.semver_value(b))
    raise TypeError("no such overload")


def _compare_to(a: Any, b: Any) -> int:
    return _compare(a, b)


def _is_greater_than(a: Any, b: Any) -> bool:
    return _compare(a, b) > 0


def _is_less_than(a: Any, b: Any) -> bool:
    return _compare(a, b) < 0


def _semver_fn(text: str, normalize: bool = False) -> Any:
    try:
        return _types.semver_message(_semver(text, normalize))
    except SemverError as e:
        raise ValueError(str(e)) from None


def _is_semver(text: str, normalize: bool = False) -> bool:
    try:
        _semver(text, normalize)
    except SemverError:
        return False
    return True


def _major(v: Any) -> int:
    return int(v.major)


def _minor(v: Any) -> int:
    return int(v.minor)


def _patch(v: Any) -> int:
    return int(v.patch)


def _includes(container: Any, value: Any) -> bool:
    if isinstance(container, list):
        if len(container) > MAX_LIST_INCLUDES:
            raise ValueError(
                f"includes() on a list of {len(container)} elements; at most "
                f"{MAX_LIST_INCLUDES} are allowed"
            )
        return any(_equal(item, value) for item in container)
    return _equal(container, value)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return bool(a == b)


def _sort_key(value: Any) -> Any:
    if _types.is_quantity(value):
        return (0, Decimal(_types.quantity_nanos(value)))
    if _types.is_semver(value):
        return (1, functools.cmp_to_key(compare_semver)(_types.semver_value(value)))
    if isinstance(value, bool):
        return (2, value)
    if isinstance(value, int | float):
        return (3, value)
    if isinstance(value, str | bytes):
        return (4 if isinstance(value, str) else 5, value)
    raise TypeError("no such overload")


def _homogeneous(values: list[Any]) -> list[Any]:
    keys = [_sort_key(v) for v in values]
    if len({k[0] for k in keys}) > 1:
        raise TypeError("no such overload: list elements of different types")
    return keys


def _is_sorted(values: list[Any]) -> bool:
    keys = _homogeneous(values)
    return all(keys[i] <= keys[i + 1] for i in range(len(keys) - 1))


def _sum(values: list[Any]) -> Any:
    if not values:
        return 0
    if all(_types.is_quantity(v) for v in values):
        return _types.quantity_message(sum(_types.quantity_nanos(v) for v in values))
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values) or all(
        isinstance(v, float) for v in values
    ):
        return sum(values)
    raise TypeError("no such overload")


def _extreme(values: list[Any], pick: Callable[[list[int]], int], name: str) -> Any:
    if not values:
        raise ValueError(f"{name} called on empty list")
    keys = _homogeneous(values)
    index = pick(sorted(range(len(values)), key=lambda i: keys[i]))
    return values[index]


def _min(values: list[Any]) -> Any:
    return _extreme(values, lambda order: order[0], "min")


def _max(values: list[Any]) -> Any:
    return _extreme(values, lambda order: order[-1], "max")


def _index_of(values: list[Any], value: Any) -> int:
    for i, item in enumerate(values):
        if _equal(item, value):
            return i
    return -1


def _last_index_of(values: list[Any], value: Any) -> int:
    for i in range(len(values) - 1, -1, -1):
        if _equal(values[i], value):
            return i
    return -1


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would log every invalid pattern to stderr

REGEX_FUNCTIONS = frozenset({"matches", "find", "findAll"})
"""Functions whose pattern argument is an RE2 regular expression."""


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as e:
        detail = e.args[0] if e.args else e
        if isinstance(detail, bytes):
            detail = detail.decode(errors="replace")
        return f"invalid regular expression {pattern!r} (RE2 syntax): {detail}"


def regex_problem(pattern: str) -> str | None:
    """Why RE2 (Kubernetes' regular expression syntax) rejects ``pattern``, or None."""
    compiled = _compiled(pattern)
    return compiled if isinstance(compiled, str) else None


def _regex(pattern: str) -> Any:
    compiled = _compiled(pattern)
    if isinstance(compiled, str):
        raise ValueError(compiled)
    return compiled


def _find(text: str, pattern: str) -> str:
    match = _regex(pattern).search(text)
    return match.group(0) if match else ""


def _find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    """Go's ``Regexp.FindAllString``: an empty match right after a match is skipped."""
    regex = _regex(pattern)
    found: list[str] = []
    pos, prev_end, end = 0, -1, len(text)
    while (limit < 0 or len(found) < limit) and pos <= end:
        match = regex.search(text, pos)
        if match is None:
            break
        start, stop = match.span()
        accept = True
        if stop == start:  # an empty match: step one character on
            accept = start != prev_end
            pos = stop + 1
        else:
            pos = stop
        prev_end = stop
        if accept:
            found.append(match.group(0))
    return found


def _counted(fn: Callable[..., Any]) -> Callable[..., Any]:
    calls = CALLBACKS

    def call(*args: Any) -> Any:
        calls.calls += 1
        return fn(*args)

    call.__name__ = fn.__name__
    return call


def _overload(
    overload_id: str,
    result: cel.Type,
    params: list[cel.Type],
    impl: Callable[..., Any],
    member: bool = False,
) -> cel.Overload:
    return cel.Overload(overload_id, result, params, is_member=member, impl=_counted(impl))


def extension() -> cel.CelExtension:
    """The extension declaring and implementing every function above."""
    t = cel.Type
    q = t(_types.QUANTITY_TYPE)
    v = t(_types.SEMVER_TYPE)
    dyn_list = t.List(t.DYN)
    decls = {
        "quantity": [_overload("quantity_string", q, [t.STRING], _quantity)],
        "isQuantity": [_overload("is_quantity_string", t.BOOL, [t.STRING], _is_quantity)],
        "sign": [_overload("quantity_sign", t.INT, [q], _sign)],
        "asInteger": [_overload("quantity_as_integer", t.INT, [q], _as_integer, True)],
        "isInteger": [_overload("quantity_is_integer", t.BOOL, [q], _is_integer, True)],
        "asApproximateFloat": [
            _overload("quantity_as_approximate_float", t.DOUBLE, [q], _as_float, True)
        ],
        "add": [
            _overload("quantity_add", q, [q, q], _add, True),
            _overload("quantity_add_int", q, [q, t.INT], _add, True),
        ],
        "sub": [
            _overload("quantity_sub", q, [q, q], _sub, True),
            _overload("quantity_sub_int", q, [q, t.INT], _sub, True),
        ],
        "compareTo": [_overload("compare_to_dyn", t.INT, [t.DYN, t.DYN], _compare_to, True)],
        "isGreaterThan": [
            _overload("is_greater_than_dyn", t.BOOL, [t.DYN, t.DYN], _is_greater_than, True)
        ],
        "isLessThan": [_overload("is_less_than_dyn", t.BOOL, [t.DYN, t.DYN], _is_less_than, True)],
        "semver": [
            _overload("semver_string", v, [t.STRING], _semver_fn),
            _overload("semver_string_bool", v, [t.STRING, t.BOOL], _semver_fn),
        ],
        "isSemver": [
            _overload("is_semver_string", t.BOOL, [t.STRING], _is_semver),
            _overload("is_semver_string_bool", t.BOOL, [t.STRING, t.BOOL], _is_semver),
        ],
        "major": [_overload("semver_major", t.INT, [v], _major, True)],
        "minor": [_overload("semver_minor", t.INT, [v], _minor, True)],
        "patch": [_overload("semver_patch", t.INT, [v], _patch, True)],
        "includes": [_overload("includes_dyn", t.BOOL, [t.DYN, t.DYN], _includes, True)],
        "isSorted": [_overload("list_is_sorted", t.BOOL, [dyn_list], _is_sorted, True)],
        "sum": [_overload("list_sum", t.DYN, [dyn_list], _sum, True)],
        "min": [_overload("list_min", t.DYN, [dyn_list], _min, True)],
        "max": [_overload("list_max", t.DYN, [dyn_list], _max, True)],
        "indexOf": [_overload("list_index_of", t.INT, [dyn_list, t.DYN], _index_of, True)],
        "lastIndexOf": [
            _overload("list_last_index_of", t.INT, [dyn_list, t.DYN], _last_index_of, True)
        ],
        "find": [_overload("string_find", t.STRING, [t.STRING, t.STRING], _find, True)],
        "findAll": [
            _overload("string_find_all", t.List(t.STRING), [t.STRING, t.STRING], _find_all, True),
            _overload(
                "string_find_all_limit",
                t.List(t.STRING),
                [t.STRING, t.STRING, t.INT],
                _find_all,
                True,
            ),
        ],
    }
    return cel.CelExtension(
        "kubernetes.dra", [cel.FunctionDecl(name, overloads) for name, overloads in decls.items()]
    )


CALLBACK_FUNCTIONS = frozenset(
    {
        "quantity",
        "isQuantity",
        "sign",
        "asInteger",
        "isInteger",
        "asApproximateFloat",
        "add",
        "sub",
        "compareTo",
        "isGreaterThan",
        "isLessThan",
        "semver",
        "isSemver",
        "major",
        "minor",
        "patch",
        "includes",
        "isSorted",
        "sum",
        "min",
        "max",
        "indexOf",
        "lastIndexOf",
        "find",
        "findAll",
    }
)
"""Function names implemented in Python (a call of any of them may go through a callback)."""
