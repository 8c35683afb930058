"""The checked syntax tree of a compiled selector, read from cel-cpp's serialized form.

cel-expr-python exposes no syntax tree, but ``Expression.serialize()`` returns a
``google.protobuf.Any`` holding a ``cel.expr.CheckedExpr`` (cel-spec ``checked.proto`` /
``syntax.proto``). This module decodes the parts the static checks need (the expression
tree with macros already expanded into comprehensions, and the overloads the checker
resolved) with a small protobuf wire-format reader, so it needs neither the cel-spec
protos nor a protobuf recursion limit. Fields it does not know are skipped.

Used by :mod:`dradriver.cel.cost` (estimated cost) and :mod:`dradriver.cel.env` (regular
expression literals).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = [
    "Call",
    "Checked",
    "Comprehension",
    "Const",
    "CreateList",
    "CreateStruct",
    "DecodeError",
    "Expr",
    "Ident",
    "Select",
    "decode",
    "walk",
]


class DecodeError(ValueError):
    """The serialized expression is not what this reader expects."""


@dataclass(frozen=True, slots=True)
class Const:
    id: int
    value: object  # None, bool, int, float, str or bytes


@dataclass(frozen=True, slots=True)
class Ident:
    id: int
    name: str


@dataclass(frozen=True, slots=True)
class Select:
    id: int
    operand: Expr
    field: str
    test_only: bool


@dataclass(frozen=True, slots=True)
class Call:
    id: int
    function: str
    target: Expr | None
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class CreateList:
    id: int
    elements: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class CreateStruct:
    """A map literal (``message_name`` empty; keys are expressions) or a message."""

    id: int
    message_name: str
    entries: tuple[tuple[Expr | str, Expr], ...]


@dataclass(frozen=True, slots=True)
class Comprehension:
    id: int
    iter_var: str
    iter_var2: str
    iter_range: Expr
    accu_var: str
    accu_init: Expr
    loop_condition: Expr
    loop_step: Expr
    result: Expr


Expr = Const | Ident | Select | Call | CreateList | CreateStruct | Comprehension


@dataclass(frozen=True, slots=True)
class Checked:
    expr: Expr
    overloads: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Expression id -> the overload ids the type checker resolved for that call."""


# --- wire format ------------------------------------------------------------------------

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise DecodeError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field of one message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire == _FIXED64:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == _FIXED32:
            value, pos = data[pos : pos + 4], pos + 4
        elif wire == _LENGTH:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        else:
            raise DecodeError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise DecodeError("truncated field")
        yield number, wire, value


def _by_number(data: bytes) -> dict[int, list[int | bytes]]:
    out: dict[int, list[int | bytes]] = {}
    for number, _, value in _fields(data):
        out.setdefault(number, []).append(value)
    return out


def _bytes(fields: dict[int, list[int | bytes]], number: int) -> bytes:
    values = fields.get(number)
    if not values:
        return b""
    value = values[-1]
    if not isinstance(value, bytes):
        raise DecodeError(f"field {number}: expected a length-delimited value")
    return value


def _int(fields: dict[int, list[int | bytes]], number: int) -> int:
    values = fields.get(number)
    if not values:
        return 0
    value = values[-1]
    if not isinstance(value, int):
        raise DecodeError(f"field {number}: expected a varint")
    return value


def _str(fields: dict[int, list[int | bytes]], number: int) -> str:
    return _bytes(fields, number).decode()


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# --- cel.expr messages ------------------------------------------------------------------


def _constant(node_id: int, data: bytes) -> Const:
    for number, _, value in _fields(data):
        if number == 1:
            return Const(node_id, None)
        if number == 2 and isinstance(value, int):
            return Const(node_id, bool(value))
        if number == 3 and isinstance(value, int):
            return Const(node_id, _signed(value))
        if number == 4 and isinstance(value, int):
            return Const(node_id, value)
        if number == 5 and isinstance(value, bytes):
            return Const(node_id, struct.unpack("<d", value)[0])
        if number == 6 and isinstance(value, bytes):
            return Const(node_id, value.decode())
        if number == 7 and isinstance(value, bytes):
            return Const(node_id, bytes(value))
    return Const(node_id, None)


def _expr(data: bytes) -> Expr:
    fields = _by_number(data)
    node_id = _int(fields, 2)
    if 3 in fields:
        return _constant(node_id, _bytes(fields, 3))
    if 4 in fields:
        return Ident(node_id, _str(_by_number(_bytes(fields, 4)), 1))
    if 5 in fields:
        sel = _by_number(_bytes(fields, 5))
        return Select(node_id, _expr(_bytes(sel, 1)), _str(sel, 2), bool(_int(sel, 3)))
    if 6 in fields:
        call = _by_number(_bytes(fields, 6))
        target = _expr(_bytes(call, 1)) if 1 in call else None
        args = tuple(_expr(a) for a in call.get(3, []) if isinstance(a, bytes))
        return Call(node_id, _str(call, 2), target, args)
    if 7 in fields:
        lst = _by_number(_bytes(fields, 7))
        return CreateList(node_id, tuple(_expr(e) for e in lst.get(1, []) if isinstance(e, bytes)))
    if 8 in fields:
        st = _by_number(_bytes(fields, 8))
        entries: list[tuple[Expr | str, Expr]] = []
        for raw in st.get(2, []):
            if not isinstance(raw, bytes):
                raise DecodeError("struct entry: expected a message")
            entry = _by_number(raw)
            key: Expr | str = _expr(_bytes(entry, 3)) if 3 in entry else _str(entry, 2)
            entries.append((key, _expr(_bytes(entry, 4))))
        return CreateStruct(node_id, _str(st, 1), tuple(entries))
    if 9 in fields:
        c = _by_number(_bytes(fields, 9))
        return Comprehension(
            node_id,
            iter_var=_str(c, 1),
            iter_var2=_str(c, 8),
            iter_range=_expr(_bytes(c, 2)),
            accu_var=_str(c, 3),
            accu_init=_expr(_bytes(c, 4)),
            loop_condition=_expr(_bytes(c, 5)),
            loop_step=_expr(_bytes(c, 6)),
            result=_expr(_bytes(c, 7)),
        )
    return Const(node_id, None)  # an unset expression (e.g. an absent optional part)


def _reference_map(entries: list[int | bytes]) -> dict[int, tuple[str, ...]]:
    out: dict[int, tuple[str, ...]] = {}
    for raw in entries:
        if not isinstance(raw, bytes):
            continue
        entry = _by_number(raw)
        reference = _by_number(_bytes(entry, 2))
        ids = tuple(v.decode() for v in reference.get(3, []) if isinstance(v, bytes))
        if ids:
            out[_signed(_int(entry, 1))] = ids
    return out


_ANY_CHECKED = "type.googleapis.com/cel.expr.CheckedExpr"


def decode(serialized: bytes) -> Checked:
    """The tree of ``Expression.serialize()``; raises :class:`DecodeError`."""
    try:
        wrapper = _by_number(serialized)
        if _str(wrapper, 1) != _ANY_CHECKED:
            raise DecodeError(f"not a checked expression: {_str(wrapper, 1)!r}")
        checked = _by_number(_bytes(wrapper, 2))
        if 4 not in checked:
            raise DecodeError("checked expression without an expression")
        return Checked(_expr(_bytes(checked, 4)), _reference_map(checked.get(2, [])))
    except (UnicodeDecodeError, struct.error, IndexError) as e:
        raise DecodeError(str(e)) from None


def children(node: Expr) -> tuple[Expr, ...]:
    if isinstance(node, Select):
        return (node.operand,)
    if isinstance(node, Call):
        return ((node.target,) if node.target is not None else ()) + node.args
    if isinstance(node, CreateList):
        return node.elements
    if isinstance(node, CreateStruct):
        out: list[Expr] = []
        for key, value in node.entries:
            if not isinstance(key, str):
                out.append(key)
            out.append(value)
        return tuple(out)
    if isinstance(node, Comprehension):
        return (
            node.iter_range,
            node.accu_init,
            node.loop_condition,
            node.loop_step,
            node.result,
        )
    return ()


def walk(node: Expr) -> Iterator[Expr]:
    """Every node of the tree, parents first."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(children(current)))
