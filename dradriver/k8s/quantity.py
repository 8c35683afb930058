"""Kubernetes resource quantities ("1Gi", "100m", "4", "1e3"): syntax check and exact value.

The grammar is the one of ``k8s.io/apimachinery/pkg/api/resource.Quantity``::

    <quantity> ::= <sign><number><suffix>
    <number>   ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>   ::= Ki | Mi | Gi | Ti | Pi | Ei            (binary SI)
                 | n | u | m | "" | k | M | G | T | P | E  (decimal SI)
                 | e<sign><digits> | E<sign><digits>      (decimal exponent)

Values are exact :class:`~decimal.Decimal` numbers, so "1024Mi" == "1Gi" and
"0.5" == "500m" compare equal; the allocator sums and compares these.
"""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal
from typing import Annotated

from pydantic import BeforeValidator

_QUANTITY = re.compile(r"(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE](?P<exp>[+-]?\d+)")

_BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12}
_DECIMAL_SUFFIXES.update({"P": 15, "E": 18})

# Enough digits for any int64 scaled by the largest suffix, with no rounding.
_EXACT = Context(prec=200)
_MAX_EXPONENT = 1000

_HINT = (
    "expected a number with an optional suffix (Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, "
    'P, E) or exponent (e3), e.g. "1Gi", "100m", "4"'
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""

    def __init__(self, text: str, reason: str = _HINT) -> None:
        super().__init__(f"invalid quantity {text!r}: {reason}")
        self.text = text


def parse_quantity(text: str) -> Decimal:
    """The exact value of a quantity string; raises :class:`QuantityError`."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError(text)
    number = Decimal(match["number"])
    suffix = match["suffix"]
    if suffix in _BINARY_SUFFIXES:
        return _EXACT.multiply(number, Decimal(1024) ** _BINARY_SUFFIXES[suffix])
    if suffix in _DECIMAL_SUFFIXES:
        return number.scaleb(_DECIMAL_SUFFIXES[suffix], _EXACT)
    exponent = _EXPONENT.fullmatch(suffix)
    if exponent is None:
        raise QuantityError(text, f"unknown suffix {suffix!r}; {_HINT}")
    power = int(exponent["exp"])
    if abs(power) > _MAX_EXPONENT:
        raise QuantityError(text, f"exponent {power} is out of range")
    return number.scaleb(power, _EXACT)


def quantity_as_int(text: str) -> int:
    """The value rounded up to an integer, like Go's ``Quantity.Value()``."""
    return math.ceil(parse_quantity(text))


def validate_quantity(text: str) -> str:
    """``text`` unchanged if it is a quantity; raises :class:`QuantityError`."""
    parse_quantity(text)
    return text


def _quantity_input(value: object) -> str:
    # YAML turns `4` and `0.5` into numbers; a quantity is always kept as its string.
    if isinstance(value, bool):
        raise QuantityError(str(value).lower(), "a boolean is not a quantity")
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError(f"a quantity must be a string or a number, not {type(value).__name__}")
    return validate_quantity(value)


Quantity = Annotated[str, BeforeValidator(_quantity_input)]
"""A validated quantity string, as a pydantic field type (numbers are accepted as input)."""
