"""What the cost estimator knows about values, and how it adds up costs.

Invariants:
- A :class:`Shape` is a value's kind and, for strings, bytes and containers, bounds on its
  size (``lo``..``hi``); ``hi`` is at most :data:`UNBOUNDED`, which stands for "cannot be
  bounded" (2^64 - 1, as in cel-go).
- Cost arithmetic saturates at :data:`UNBOUNDED`: adding to or multiplying an unbounded
  cost stays unbounded, never wraps or grows past it.
- A device's shape (:data:`DEVICE`) follows Kubernetes' ResourceSlice validation: at most
  32 attributes and capacities, domains of at most 63 and names of at most 32 characters,
  string and version values of at most 64 characters, list values of at most 48 elements,
  ``driver`` at most 63 characters.
- :func:`join_shapes` covers both its inputs (never smaller bounds than either).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = [
    "ATTRIBUTE",
    "BOOL",
    "DEVICE",
    "DOUBLE",
    "DYN",
    "INT",
    "MAX_LIST_VALUE_LENGTH",
    "MAX_STRING_VALUE_LENGTH",
    "NULL",
    "QUANTITY",
    "REGEX_LENGTH",
    "SEMVER",
    "STRING_TRAVERSAL",
    "UINT",
    "UNBOUNDED",
    "Shape",
    "bounds",
    "cost_add",
    "cost_ceil",
    "cost_mul",
    "element_of",
    "field_shape",
    "join_shapes",
    "list_shape",
    "map_shape",
    "string_shape",
    "traversal",
]

UNBOUNDED = 2**64 - 1

MAX_DEVICE_ENTRIES = 32  # attributes + capacities per device
MAX_DOMAIN_LENGTH = 63
MAX_ID_LENGTH = 32
MAX_STRING_VALUE_LENGTH = 64
MAX_LIST_VALUE_LENGTH = 48
MAX_DRIVER_LENGTH = 63

STRING_TRAVERSAL = 0.1
REGEX_LENGTH = 0.25


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


def string_shape(hi: int, lo: int = 0) -> Shape:
    return Shape("string", lo, min(hi, UNBOUNDED))


def list_shape(hi: int, elem: Shape, lo: int = 0) -> Shape:
    return Shape("list", lo, min(hi, UNBOUNDED), elem=elem)


def map_shape(hi: int, key: Shape, value: Shape) -> Shape:
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
        ("driver", string_shape(MAX_DRIVER_LENGTH)),
        (
            "attributes",
            map_shape(
                MAX_DEVICE_ENTRIES,
                string_shape(MAX_DOMAIN_LENGTH),
                map_shape(MAX_DEVICE_ENTRIES, string_shape(MAX_ID_LENGTH), ATTRIBUTE),
            ),
        ),
        (
            "capacity",
            map_shape(
                MAX_DEVICE_ENTRIES,
                string_shape(MAX_DOMAIN_LENGTH),
                map_shape(MAX_DEVICE_ENTRIES, string_shape(MAX_ID_LENGTH), QUANTITY),
            ),
        ),
        ("allowMultipleAllocations", BOOL),
    ),
)


def cost_ceil(x: float) -> int:
    return UNBOUNDED if x >= UNBOUNDED else math.ceil(x)


def cost_add(*costs: int) -> int:
    return min(sum(costs), UNBOUNDED)


def cost_mul(a: int, b: int) -> int:
    return min(a * b, UNBOUNDED)


def traversal(size: int) -> int:
    """The cost of going over ``size`` characters once."""
    return cost_ceil(size * STRING_TRAVERSAL)


def join_shapes(a: Shape, b: Shape) -> Shape:
    """A shape covering both (the branches of ``?:``, list elements)."""
    if a == b:
        return a
    if a.kind == b.kind and a.kind in ("string", "bytes"):
        return Shape(a.kind, min(a.lo, b.lo), max(a.hi, b.hi))
    if a.kind == b.kind == "list" and a.elem is not None and b.elem is not None:
        return list_shape(max(a.hi, b.hi), join_shapes(a.elem, b.elem), min(a.lo, b.lo))
    if a.kind == b.kind == "map":
        return map_shape(
            max(a.hi, b.hi),
            join_shapes(a.key or DYN, b.key or DYN),
            join_shapes(a.elem or DYN, b.elem or DYN),
        )
    if not a.sized and not b.sized and a.kind == b.kind:
        return a
    hi = max(a.hi if a.sized else 0, b.hi if b.sized else 0)
    elems = [s for s in (a.elem, b.elem) if s is not None]
    elem = elems[0] if len(elems) == 1 else join_shapes(*elems) if elems else None
    return Shape("dyn", 0, hi, elem=elem)


def element_of(shape: Shape) -> Shape:
    """A list's element, a map's value (anything when unknown)."""
    return shape.elem if shape.elem is not None else DYN


def bounds(shape: Shape) -> tuple[int, int]:
    """(lo, hi) of a value's size; (0, :data:`UNBOUNDED`) for a value without a size."""
    return (shape.lo, shape.hi) if shape.sized else (0, UNBOUNDED)


def field_shape(operand: Shape, name: str) -> Shape:
    """The shape of ``operand.name`` (a device field, a map entry, a message field)."""
    if operand.kind == "device":
        for field_name, shape in operand.fields:
            if field_name == name:
                return shape
        return DYN
    if operand.kind in ("map", "dyn") and operand.elem is not None:
        return operand.elem
    if operand.kind == "message":
        return string_shape(MAX_STRING_VALUE_LENGTH)  # Quantity.nanos, Semver.pre; ints
    return DYN
