"""A conservative static cost estimate for DRA selectors, modelled on cel-go's estimator.

Kubernetes refuses a new DRA selector whose *estimated* worst-case cost exceeds
``CELSelectorExpressionMaxCost`` = 1 000 000 (cel.md §5.3). cel-expr-python has no
estimator, so this module walks the checked tree (:mod:`dradriver.cel.ast`, macros expanded)
and computes an upper bound in cel-go's units (``checker/cost.go`` and Kubernetes'
``library/cost.go``):

* identifiers and field selections cost 1, literals 0, list/map/message literals 10/30/40
  plus their parts; calls cost their arguments plus the function's own cost (1 unless
  listed below); ``&&``/``||`` cost both sides, ``?:`` the condition and the dearer branch;
* string work is charged at 0.1 per character (comparison, ``+``, ``contains``,
  ``lowerAscii`` …), ``replace`` also for the (possibly much longer) result; regular
  expressions (``matches``/``find``/``findAll``) at ``ceil(0.1·len(s)) · ceil(0.25·len(re))``;
* a comprehension (``all``, ``exists``, ``map``, ``filter``, two-variable forms, ``cel.bind``)
  costs its range and initial value plus, per element of the range, its condition and step:
  nested comprehensions multiply. List accumulators (``map``/``filter``) grow by the step
  once per element;
* ``lists.range(n)`` builds ``n`` elements (``n`` a literal; otherwise unbounded), list
  functions (``sort``, ``distinct``, ``flatten``, ``sets.*``, ``isSorted``, ``sum`` …) are charged
  per element.

Sizes come from the Kubernetes bounds of a device (ResourceSlice validation): at most 32
attributes and capacities per device (so at most 32 domains and 32 names per domain),
domains of at most 63 and names of at most 32 characters, string and version values of at
most 64 characters, list values of at most 48 elements; ``device.driver`` at most 63.
Anything whose size cannot be bounded (``lists.range`` of a computed number) is taken as
unbounded (2^64 - 1, as cel-go does), so iterating over it exceeds the limit.

Where this differs from cel-go it errs on the expensive side, so an expression accepted
here is within Kubernetes' limit; a few legitimate but loop-heavy selectors that Kubernetes
would accept may be refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dradriver.cel import ast

__all__ = [
    "MAX_COST",
    "UNBOUNDED",
    "estimate",
]

MAX_COST = 1_000_000
"""resource.k8s.io ``CELSelectorExpressionMaxCost``."""
UNBOUNDED = 2**64 - 1

MAX_DEVICE_ENTRIES = 32  # attributes + capacities per device
MAX_DOMAIN_LENGTH = 63
MAX_ID_LENGTH = 32
MAX_STRING_VALUE_LENGTH = 64
MAX_LIST_VALUE_LENGTH = 48
MAX_DRIVER_LENGTH = 63

STRING_TRAVERSAL = 0.1
REGEX_LENGTH = 0.25
LIST_CREATE = 10
MAP_CREATE = 30
STRUCT_CREATE = 40


@dataclass(frozen=True, slots=True)
class Shape:
    """What is known about a value: its kind and, for strings and containers, its size."""

    kind: str  # string bytes list map int uint double bool null message device dyn
    lo: int = 0
    hi: int = 0
    elem: Shape | None = None  # list element, map value
    key: Shape | None = None  # map key
    fields: tuple[tuple[str, Shape], ...] = field(default=())

    @property
    def sized(self) -> bool:
        return self.kind in ("string", "bytes", "list", "map", "dyn")


def _string(hi: int, lo: int = 0) -> Shape:
    return Shape("string", lo, min(hi, UNBOUNDED))


def _list(hi: int, elem: Shape, lo: int = 0) -> Shape:
    return Shape("list", lo, min(hi, UNBOUNDED), elem=elem)


def _map(hi: int, key: Shape, value: Shape) -> Shape:
    return Shape("map", 0, min(hi, UNBOUNDED), elem=value, key=key)


INT = Shape("int")
UINT = Shape("uint")
DOUBLE = Shape("double")
BOOL = Shape("bool")
NULL = Shape("null")
QUANTITY = Shape("message")
SEMVER = Shape("message")
_DYN_ELEM = Shape("dyn", 0, UNBOUNDED)
DYN = Shape("dyn", 0, UNBOUNDED, elem=_DYN_ELEM, key=_DYN_ELEM)

# An attribute value: int, bool, string (<= 64), version, or a list (<= 48) of those.
ATTRIBUTE = Shape(
    "dyn",
    0,
    max(MAX_STRING_VALUE_LENGTH, MAX_LIST_VALUE_LENGTH),
    elem=Shape("dyn", 0, MAX_STRING_VALUE_LENGTH),
)
DEVICE = Shape(
    "device",
    fields=(
        ("driver", _string(MAX_DRIVER_LENGTH)),
        (
            "attributes",
            _map(
                MAX_DEVICE_ENTRIES,
                _string(MAX_DOMAIN_LENGTH),
                _map(MAX_DEVICE_ENTRIES, _string(MAX_ID_LENGTH), ATTRIBUTE),
            ),
        ),
        (
            "capacity",
            _map(
                MAX_DEVICE_ENTRIES,
                _string(MAX_DOMAIN_LENGTH),
                _map(MAX_DEVICE_ENTRIES, _string(MAX_ID_LENGTH), QUANTITY),
            ),
        ),
        ("allowMultipleAllocations", BOOL),
    ),
)


def _ceil(x: float) -> int:
    return UNBOUNDED if x >= UNBOUNDED else math.ceil(x)


def _add(*costs: int) -> int:
    return min(sum(costs), UNBOUNDED)


def _mul(a: int, b: int) -> int:
    return min(a * b, UNBOUNDED)


def _traverse(size: int) -> int:
    return _ceil(size * STRING_TRAVERSAL)


def _join(a: Shape, b: Shape) -> Shape:
    """A shape covering both (the branches of ``?:``, list elements)."""
    if a == b:
        return a
    if a.kind == b.kind and a.kind in ("string", "bytes"):
        return Shape(a.kind, min(a.lo, b.lo), max(a.hi, b.hi))
    if a.kind == b.kind == "list" and a.elem is not None and b.elem is not None:
        return _list(max(a.hi, b.hi), _join(a.elem, b.elem), min(a.lo, b.lo))
    if a.kind == b.kind == "map":
        return _map(
            max(a.hi, b.hi),
            _join(a.key or DYN, b.key or DYN),
            _join(a.elem or DYN, b.elem or DYN),
        )
    if not a.sized and not b.sized and a.kind == b.kind:
        return a
    hi = max(a.hi if a.sized else 0, b.hi if b.sized else 0)
    elems = [s for s in (a.elem, b.elem) if s is not None]
    elem = elems[0] if len(elems) == 1 else _join(*elems) if elems else None
    return Shape("dyn", 0, hi, elem=elem)


def _element(shape: Shape) -> Shape:
    return shape.elem if shape.elem is not None else DYN


def _size(shape: Shape) -> tuple[int, int]:
    return (shape.lo, shape.hi) if shape.sized else (0, UNBOUNDED)


class _Estimator:
    def __init__(self, checked: ast.Checked) -> None:
        self.overloads = checked.overloads

    def estimate(self, node: ast.Expr, scope: dict[str, Shape]) -> tuple[int, Shape]:
        if isinstance(node, ast.Const):
            return 0, self._const(node.value)
        if isinstance(node, ast.Ident):
            return 1, scope.get(node.name, DEVICE if node.name == "device" else DYN)
        if isinstance(node, ast.Select):
            cost, operand = self.estimate(node.operand, scope)
            if node.test_only:
                return _add(cost, 1), BOOL
            return _add(cost, 1), self._field(operand, node.field)
        if isinstance(node, ast.CreateList):
            total, shape = LIST_CREATE, None
            for element in node.elements:
                cost, s = self.estimate(element, scope)
                total = _add(total, cost)
                shape = s if shape is None else _join(shape, s)
            n = len(node.elements)
            return total, _list(n, shape or DYN, lo=n)
        if isinstance(node, ast.CreateStruct):
            return self._struct(node, scope)
        if isinstance(node, ast.Comprehension):
            return self._comprehension(node, scope)
        return self._call(node, scope)

    @staticmethod
    def _const(value: object) -> Shape:
        if isinstance(value, bool):
            return BOOL
        if isinstance(value, int):
            return INT
        if isinstance(value, float):
            return DOUBLE
        if isinstance(value, str):
            return _string(len(value), len(value))
        if isinstance(value, bytes):
            return Shape("bytes", len(value), len(value))
        return NULL

    @staticmethod
    def _field(operand: Shape, name: str) -> Shape:
        if operand.kind == "device":
            for field_name, shape in operand.fields:
                if field_name == name:
                    return shape
            return DYN
        if operand.kind in ("map", "dyn") and operand.elem is not None:
            return operand.elem
        if operand.kind == "message":
            return _string(MAX_STRING_VALUE_LENGTH)  # Quantity.nanos, Semver.pre; ints
        return DYN

    def _struct(self, node: ast.CreateStruct, scope: dict[str, Shape]) -> tuple[int, Shape]:
        total = STRUCT_CREATE if node.message_name else MAP_CREATE
        key_shape: Shape | None = None
        value_shape: Shape | None = None
        for key, value in node.entries:
            if not isinstance(key, str):
                cost, k = self.estimate(key, scope)
                total = _add(total, cost)
                key_shape = k if key_shape is None else _join(key_shape, k)
            cost, v = self.estimate(value, scope)
            total = _add(total, cost)
            value_shape = v if value_shape is None else _join(value_shape, v)
        if node.message_name:
            return total, Shape("message")
        return total, _map(len(node.entries), key_shape or DYN, value_shape or DYN)

    def _comprehension(self, node: ast.Comprehension, scope: dict[str, Shape]) -> tuple[int, Shape]:
        range_cost, range_shape = self.estimate(node.iter_range, scope)
        init_cost, accu = self.estimate(node.accu_init, scope)
        iterations = _size(range_shape)[1]
        inner = dict(scope)
        if range_shape.kind == "map":
            first, second = range_shape.key or DYN, _element(range_shape)
        else:
            first, second = _element(range_shape), _element(range_shape)
        if node.iter_var2:
            inner[node.iter_var] = first if range_shape.kind == "map" else INT
            inner[node.iter_var2] = second
        else:
            inner[node.iter_var] = first
        inner[node.accu_var] = accu
        _, step_shape = self.estimate(node.loop_step, inner)
        if accu.kind == "list" and step_shape.kind == "list" and step_shape.hi > accu.hi:
            # map()/filter(): the accumulator grows by the step once per iteration.
            grown = _add(accu.hi, _mul(iterations, step_shape.hi - accu.hi))
            accu = _list(grown, _join(_element(accu), _element(step_shape)))
            inner[node.accu_var] = accu
        condition_cost, _ = self.estimate(node.loop_condition, inner)
        step_cost, _ = self.estimate(node.loop_step, inner)
        result_cost, result_shape = self.estimate(node.result, inner)
        loop = _mul(iterations, _add(condition_cost, step_cost))
        return _add(range_cost, init_cost, loop, result_cost), result_shape

    def _call(self, node: ast.Call, scope: dict[str, Shape]) -> tuple[int, Shape]:
        fn = node.function
        target: Shape | None = None
        total = 0
        if node.target is not None:
            total, target = self.estimate(node.target, scope)
        costs: list[int] = []
        args: list[Shape] = []
        for arg in node.args:
            cost, shape = self.estimate(arg, scope)
            costs.append(cost)
            args.append(shape)
        if fn == "_?_:_" and len(costs) == 3:
            return _add(total, costs[0], max(costs[1], costs[2])), _join(args[1], args[2])
        total = _add(total, *costs)
        own, shape = self._function(node, fn, target, args)
        return _add(total, own), shape

    def _function(
        self, node: ast.Call, fn: str, target: Shape | None, args: list[Shape]
    ) -> tuple[int, Shape]:
        # Member calls: the receiver first, like the global form.
        operands = ([target] if target is not None else []) + args
        first = operands[0] if operands else DYN
        overloads = self.overloads.get(node.id, ())

        if fn in ("_&&_", "_||_", "@not_strictly_false", "!_"):
            return 0 if fn in ("_&&_", "_||_") else 1, BOOL
        if fn in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_"):
            sizes = [_size(s)[1] for s in operands if s.sized]
            own = 1 + (_traverse(min(sizes)) if len(sizes) == len(operands) == 2 else 0)
            return own, BOOL
        if fn in ("_[_]", "_[?_]"):
            return 1, _element(first) if first.kind != "device" else DYN
        if fn == "_?._":
            selected = node.args[1] if len(node.args) == 2 else None
            name = selected.value if isinstance(selected, ast.Const) else None
            return 1, self._field(first, name) if isinstance(name, str) else DYN
        if fn == "@in":
            container = operands[1] if len(operands) == 2 else DYN
            if container.kind == "map":
                return 1, BOOL
            return 1 + _size(container)[1], BOOL
        if fn == "_+_" and len(operands) == 2:
            a, b = operands
            numeric = ("int", "uint", "double")
            if a.kind in numeric or b.kind in numeric or any("int" in o for o in overloads):
                return 1, a if a.kind in numeric else b
            lo, hi = a.lo + b.lo, _add(_size(a)[1], _size(b)[1])
            if a.kind == "list" or b.kind == "list":
                return 1, _list(hi, _join(_element(a), _element(b)), lo=lo)
            kind = a.kind if a.kind == b.kind and a.kind in ("string", "bytes") else "dyn"
            return _traverse(hi), Shape(kind, lo, hi, elem=a.elem or b.elem)
        if fn in ("_-_", "_*_", "_/_", "_%_", "-_"):
            return 1, first if first.kind in ("int", "uint", "double") else DYN
        if fn == "size":
            return 1, INT
        if fn in ("matches", "find", "findAll"):
            text = _size(first)[1]
            pattern = _size(operands[1])[1] if len(operands) > 1 else UNBOUNDED
            own = max(1, _mul(_traverse(text), _ceil(pattern * REGEX_LENGTH)))
            if fn == "matches":
                return own, BOOL
            if fn == "find":
                return own, _string(text)
            return own, _list(_add(text, 1), _string(text))
        if fn in ("contains", "startsWith", "endsWith"):
            return 1 + _traverse(_size(first)[1]), BOOL
        if fn in ("lowerAscii", "upperAscii", "trim", "reverse") and first.kind != "list":
            return 1 + _traverse(_size(first)[1]), _string(_size(first)[1])
        if fn == "replace" and len(operands) >= 3:
            text, old, new = _size(operands[0])[1], _size(operands[1]), _size(operands[2])[1]
            if old[0] == 0:  # "" is replaced between every character
                grown = _add(text, _mul(_add(text, 1), new))
            else:
                count = text // old[0]
                grown = _add(text, _mul(count, max(0, new - old[0])))
            return 1 + _traverse(_add(text, grown)), _string(grown)
        if fn == "split":
            text = _size(first)[1]
            return 1 + _traverse(text), _list(_add(text, 1), _string(text))
        if fn in ("substring", "charAt", "indexOf", "lastIndexOf") and first.kind != "list":
            size = _size(first)[1]
            needle = _size(operands[1])[1] if len(operands) > 1 and operands[1].sized else 1
            own = 1 + _traverse(_mul(size, needle) if "indexOf" in fn.lower() else size)
            return own, INT if "ndexOf" in fn else _string(size)
        if fn == "join":
            n, elem = _size(first)[1], _size(_element(first))[1]
            sep = _size(operands[1])[1] if len(operands) > 1 else 0
            size = _add(_mul(n, elem), _mul(n, sep))
            return 1 + _traverse(size), _string(size)
        if fn == "format":
            n = _size(operands[1])[1] if len(operands) > 1 else 0
            size = _add(_size(first)[1], _mul(n, max(64, _size(_element(operands[-1]))[1])))
            return 1 + _traverse(size), _string(size)
        if fn == "strings.quote":
            size = _add(_mul(2, _size(first)[1]), 2)
            return 1 + _traverse(size), _string(size)
        if fn == "lists.range":
            literal = node.args[0] if node.args else None
            if isinstance(literal, ast.Const) and isinstance(literal.value, int):
                n = max(0, literal.value)
                return _add(1, n), _list(n, INT, lo=n)
            return UNBOUNDED, _list(UNBOUNDED, INT)
        if fn in ("sort", "@sortByAssociatedKeys", "distinct"):
            n = _size(first)[1]
            own = _mul(n, n) if fn == "distinct" else _mul(n, max(1, n.bit_length()))
            return _add(1, own), first
        if fn in ("slice", "reverse", "flatten"):
            n = _size(first)[1]
            if fn == "flatten":
                inner = _element(first)
                n = _mul(n, _size(inner)[1]) if inner.kind in ("list", "dyn") else n
                return _add(1, n), _list(n, _element(inner))
            return _add(1, n), first
        if fn in ("sets.contains", "sets.equivalent", "sets.intersects"):
            return _add(1, _mul(_size(first)[1], _size(args[-1])[1])), BOOL
        if fn in ("isSorted", "sum", "min", "max", "indexOf", "lastIndexOf"):
            shape = BOOL if fn == "isSorted" else INT if "ndexOf" in fn else _element(first)
            return _add(1, _size(first)[1]), shape
        if fn == "includes":
            return 1 + MAX_LIST_VALUE_LENGTH, BOOL
        if fn in ("quantity", "isQuantity", "semver", "isSemver"):
            shape = BOOL if fn.startswith("is") else QUANTITY if fn == "quantity" else SEMVER
            return 1 + _traverse(_size(first)[1]), shape
        if fn in ("compareTo", "sign", "asInteger", "major", "minor", "patch"):
            return 1, INT
        if fn in ("isGreaterThan", "isLessThan", "isInteger", "hasValue"):
            return 1, BOOL
        if fn == "asApproximateFloat":
            return 1, DOUBLE
        if fn in ("add", "sub"):
            return 1, QUANTITY
        if fn in ("orValue", "value", "optional.of", "optional.ofNonZeroValue"):
            inner = first if fn != "orValue" else _join(first, args[0] if args else DYN)
            return 1, inner
        if fn == "optional.none":
            return 1, DYN
        if fn == "string":
            size = _size(first)[1] if first.kind in ("string", "bytes") else 32
            return 1 + _traverse(size), _string(size)
        if fn == "bytes":
            return 1 + _traverse(_size(first)[1]), Shape("bytes", 0, _size(first)[1])
        if fn in ("int", "uint", "double", "bool"):
            shapes = {"int": INT, "uint": UINT, "double": DOUBLE, "bool": BOOL}
            return 1 + (_traverse(first.hi) if first.sized else 0), shapes[fn]
        if fn == "dyn":
            return 1, first
        return 1, DYN


def estimate(checked: ast.Checked) -> int:
    """The estimated worst-case cost of one evaluation (at most :data:`UNBOUNDED`)."""
    cost, _ = _Estimator(checked).estimate(checked.expr, {})
    return min(cost, UNBOUNDED)
