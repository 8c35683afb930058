"""Quantities inside CEL: exact values in units of 10⁻⁹ and their canonical strings.

Kubernetes' ``resource.Quantity`` keeps values exactly, rounded *up* to 10⁻⁹; a value
written with a binary suffix is capped at 2⁶³-1. The CEL adapter carries a quantity as the
integer number of nano-units, so equality and ordering are exact integer operations
(``quantity("200M") == quantity("0.2G")``, ``50M < 50Mi``).

:func:`format_quantity` gives the canonical string Kubernetes would print for a value
(largest suffix with an integral mantissa), used where the allocator has to write a
computed quantity (consumed capacity after rounding to a request policy step).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from dradriver.k8s.quantity import QuantityError, parse_quantity

__all__ = [
    "NANO",
    "QuantityError",
    "display_quantity",
    "format_quantity",
    "is_binary_quantity",
    "nanos_to_decimal",
    "parse_nanos",
]

NANO = 10**9
INT64_MAX = 2**63 - 1
_BINARY_SUFFIX = re.compile(r".*[KMGTPE]i")
_BINARY = {1: "Ki", 2: "Mi", 3: "Gi", 4: "Ti", 5: "Pi", 6: "Ei"}
_DECIMAL = {18: "E", 15: "P", 12: "T", 9: "G", 6: "M", 3: "k", 0: "", -3: "m", -6: "u", -9: "n"}


def is_binary_quantity(text: str) -> bool:
    """Whether ``text`` uses a binary suffix (Ki, Mi, ...)."""
    return _BINARY_SUFFIX.fullmatch(text) is not None


def parse_nanos(text: str) -> int:
    """The value of quantity ``text`` in nano-units, rounded up; raises :class:`QuantityError`."""
    value = parse_quantity(text)
    if is_binary_quantity(text) and value > INT64_MAX:
        value = Decimal(INT64_MAX)
    return math.ceil(value * NANO)


def nanos_to_decimal(nanos: int) -> Decimal:
    return Decimal(nanos).scaleb(-9)


def format_quantity(value: Decimal, binary: bool = False) -> str:
    """The canonical quantity string of ``value`` (rounded up to 10⁻⁹)."""
    nanos = math.ceil(value * NANO)
    if nanos == 0:
        return "0"
    if binary and nanos % NANO == 0 and abs(nanos) >= 1024 * NANO:
        whole, exponent = nanos // NANO, 0
        while exponent < 6 and whole % 1024 == 0:
            whole //= 1024
            exponent += 1
        if exponent:
            return f"{whole}{_BINARY[exponent]}"
    for exponent, suffix in _DECIMAL.items():
        scale = 10 ** (exponent + 9)
        if nanos % scale == 0:
            return f"{nanos // scale}{suffix}"
    return f"{nanos}n"  # unreachable: exponent -9 always divides


def display_quantity(value: Decimal) -> str:
    """The shorter of the decimal and binary canonical forms ("2G", "4Gi"), for messages."""
    decimal, binary = format_quantity(value), format_quantity(value, binary=True)
    return binary if len(binary) < len(decimal) else decimal
