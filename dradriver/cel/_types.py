"""Protobuf message types that carry Kubernetes' Quantity and Semver through cel-expr-python.

cel-expr-python (cel-cpp underneath) cannot pass opaque Python objects through CEL
("Unimplemented type"), so the two Kubernetes value types are protobuf messages built at
import time in a private descriptor pool (the pool is handed to ``cel.NewEnv``):

* ``kubernetes.Quantity { string nanos = 1; string key = 2; }`` - the exact value as an
  integer count of 10⁻⁹ units written in decimal. Message equality is then numeric
  equality, like Go's ``Quantity.Equal`` (``quantity("1Gi") == quantity("1024Mi")``).
* ``kubernetes.Semver { int64 major, minor, patch; string pre; string key = 5; }`` - build
  metadata is left out, so equality ignores it like Go's ``Version.EQ``.

``key`` is derived from the value (so it does not change equality) and sorts as the values
do: comparing two keys with CEL's string ``<`` is ``compareTo`` (:func:`quantity_key`,
:func:`semver_key`). :mod:`dradriver.cel.rewrite` uses it to compare in CEL itself, without
a Python callback (each callback leaks in cel-expr-python 0.1.3).

The type names are reserved: a selector that names them directly is refused at compile
time (Go has no such constructors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from dradriver.cel.semver import Semver

__all__ = [
    "POOL",
    "QUANTITY_TYPE",
    "SEMVER_TYPE",
    "QuantityMessage",
    "SemverMessage",
    "is_quantity",
    "is_semver",
    "quantity_key",
    "quantity_message",
    "quantity_nanos",
    "semver_key",
    "semver_message",
    "semver_value",
]

QUANTITY_TYPE = "kubernetes.Quantity"
SEMVER_TYPE = "kubernetes.Semver"


def _build_pool() -> descriptor_pool.DescriptorPool:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="dradriver/cel/kubernetes_values.proto", package="kubernetes", syntax="proto3"
    )
    f = descriptor_pb2.FieldDescriptorProto
    quantity = fdp.message_type.add(name="Quantity")
    quantity.field.add(name="nanos", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    quantity.field.add(name="key", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    semver = fdp.message_type.add(name="Semver")
    for number, name in enumerate(("major", "minor", "patch"), start=1):
        semver.field.add(name=name, number=number, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    semver.field.add(name="pre", number=4, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    semver.field.add(name="key", number=5, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return pool


POOL = _build_pool()
QuantityMessage: type[Message] = message_factory.GetMessageClass(
    POOL.FindMessageTypeByName(QUANTITY_TYPE)
)
SemverMessage: type[Message] = message_factory.GetMessageClass(
    POOL.FindMessageTypeByName(SEMVER_TYPE)
)
# The generated classes take their fields as keywords; the stubs' ``Message`` declares no
# such keywords (types-protobuf 7.35.1.20261122 and later), so the constructors are called
# through these, typed by what they return.
_new_quantity: Callable[..., Message] = QuantityMessage
_new_semver: Callable[..., Message] = SemverMessage


_COMPLEMENT = str.maketrans("0123456789", "9876543210")


def _number_key(n: int) -> str:
    """A prefix-free key of a non-negative integer that sorts numerically."""
    digits = str(n)
    size = str(len(digits))
    return f"{len(size)}{size}{digits}"


def quantity_key(nanos: int) -> str:
    """Sorts like the quantity: negatives first ("0" + complemented), then the rest."""
    if nanos >= 0:
        return "1" + _number_key(nanos)
    return "0" + _number_key(-nanos).translate(_COMPLEMENT)


def semver_key(version: Semver) -> str:
    """Sorts by SemVer precedence: major, minor, patch, then the pre-release identifiers
    (numeric ones numerically and below alphanumeric ones, a shorter list first, no
    pre-release highest)."""
    parts = [_number_key(version.major), _number_key(version.minor), _number_key(version.patch)]
    if not version.pre:
        parts.append("~")  # above "0"/"1", the first character of every identifier below
    for ident in version.pre.split(".") if version.pre else ():
        if ident.isdigit():
            parts.append("0" + _number_key(int(ident)))
        else:
            parts.append("1" + ident + "!")  # "!" sorts below [0-9A-Za-z-]
    return "".join(parts)


def quantity_message(nanos: int) -> Message:
    return _new_quantity(nanos=str(nanos), key=quantity_key(nanos))


def quantity_nanos(message: Any) -> int:
    return int(message.nanos or "0")


def semver_message(version: Semver) -> Message:
    return _new_semver(
        major=version.major,
        minor=version.minor,
        patch=version.patch,
        pre=version.pre,
        key=semver_key(version),
    )


def semver_value(message: Any) -> Semver:
    return Semver(int(message.major), int(message.minor), int(message.patch), str(message.pre))


def is_quantity(value: object) -> bool:
    return isinstance(value, QuantityMessage)


def is_semver(value: object) -> bool:
    return isinstance(value, SemverMessage)
