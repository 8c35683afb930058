"""Protobuf message types that carry Kubernetes' Quantity and Semver through cel-expr-python.

cel-expr-python (cel-cpp underneath) cannot pass opaque Python objects through CEL
("Unimplemented type"), so the two Kubernetes value types are protobuf messages built at
import time in a private descriptor pool (the pool is handed to ``cel.NewEnv``):

* ``kubernetes.Quantity { string nanos = 1; }`` - the exact value as an integer count of
  10⁻⁹ units written in decimal. Message equality is then numeric equality, like Go's
  ``Quantity.Equal`` (``quantity("1Gi") == quantity("1024Mi")``).
* ``kubernetes.Semver { int64 major, minor, patch; string pre; }`` - build metadata is
  left out, so equality ignores it like Go's ``Version.EQ``.

The type names are reserved: a selector that names them directly is refused at compile
time (Go has no such constructors).
"""

from __future__ import annotations

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
    "quantity_message",
    "quantity_nanos",
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
    semver = fdp.message_type.add(name="Semver")
    for number, name in enumerate(("major", "minor", "patch"), start=1):
        semver.field.add(name=name, number=number, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    semver.field.add(name="pre", number=4, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
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


def quantity_message(nanos: int) -> Message:
    return QuantityMessage(nanos=str(nanos))


def quantity_nanos(message: Any) -> int:
    return int(message.nanos or "0")


def semver_message(version: Semver) -> Message:
    return SemverMessage(
        major=version.major, minor=version.minor, patch=version.patch, pre=version.pre
    )


def semver_value(message: Any) -> Semver:
    return Semver(int(message.major), int(message.minor), int(message.patch), str(message.pre))


def is_quantity(value: object) -> bool:
    return isinstance(value, QuantityMessage)


def is_semver(value: object) -> bool:
    return isinstance(value, SemverMessage)
