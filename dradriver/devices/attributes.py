"""Typed device attribute values: int, bool, string and version (semver).

In configuration a plain YAML value becomes an int, bool or string attribute; a version
needs the explicit form ``{version: "1.2.3"}``. The API forms ``{int: 1}``, ``{bool: true}``
and ``{string: "x"}`` are accepted too. :meth:`to_api` gives the resource.k8s.io/v1
``DeviceAttribute`` JSON, with exactly one member set.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, field_validator

ATTRIBUTE_VALUE_MAX_LENGTH = 64
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Strict semver 2.0.0, the same expression the apiserver uses.
_NUMERIC = r"(0|[1-9]\d*)"
_PRERELEASE = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD = r"[0-9a-zA-Z-]+"
_SEMVER = re.compile(
    rf"{_NUMERIC}\.{_NUMERIC}\.{_NUMERIC}"
    rf"(-{_PRERELEASE}(\.{_PRERELEASE})*)?"
    rf"(\+{_BUILD}(\.{_BUILD})*)?"
)


def check_int64(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"int attribute {value} does not fit in a signed 64-bit integer")
    return value


def check_string(value: str) -> str:
    if len(value) > ATTRIBUTE_VALUE_MAX_LENGTH:
        raise ValueError(
            f"string attribute {value!r} is {len(value)} characters long; at most "
            f"{ATTRIBUTE_VALUE_MAX_LENGTH} are allowed"
        )
    return value


def check_version(value: str) -> str:
    if len(value) > ATTRIBUTE_VALUE_MAX_LENGTH:
        raise ValueError(
            f"version attribute {value!r} is {len(value)} characters long; at most "
            f"{ATTRIBUTE_VALUE_MAX_LENGTH} are allowed"
        )
    if not _SEMVER.fullmatch(value):
        raise ValueError(
            f"version attribute {value!r} is not a semantic version (semver.org 2.0.0), "
            'e.g. "1.2.3" or "1.2.3-rc.1"'
        )
    return value


class IntAttribute(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    api_key: ClassVar[str] = "int"

    value: int

    @field_validator("value")
    @classmethod
    def _int64(cls, value: int) -> int:
        return check_int64(value)

    def to_api(self) -> dict[str, Any]:
        return {"int": self.value}


class BoolAttribute(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    api_key: ClassVar[str] = "bool"

    value: bool

    def to_api(self) -> dict[str, Any]:
        return {"bool": self.value}


class StringAttribute(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    api_key: ClassVar[str] = "string"

    value: str

    @field_validator("value")
    @classmethod
    def _length(cls, value: str) -> str:
        return check_string(value)

    def to_api(self) -> dict[str, Any]:
        return {"string": self.value}


class VersionAttribute(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    api_key: ClassVar[str] = "version"

    value: str

    @field_validator("value")
    @classmethod
    def _semver(cls, value: str) -> str:
        return check_version(value)

    def to_api(self) -> dict[str, Any]:
        return {"version": self.value}


AttributeValue = IntAttribute | BoolAttribute | StringAttribute | VersionAttribute

_API_KEYS = ("int", "bool", "string", "version")


def attribute_value(raw: object) -> AttributeValue:
    """The attribute for a configuration value; raises ``ValueError`` naming the problem."""
    if isinstance(raw, IntAttribute | BoolAttribute | StringAttribute | VersionAttribute):
        return raw
    if isinstance(raw, bool):
        return BoolAttribute(value=raw)
    if isinstance(raw, int):
        return IntAttribute(value=check_int64(raw))
    if isinstance(raw, str):
        return StringAttribute(value=check_string(raw))
    if isinstance(raw, dict):
        return _explicit_attribute(raw)
    if isinstance(raw, float):
        raise ValueError(
            f"{raw!r} is a number with a fraction; attributes are int, bool, string or "
            "{version: ...}: quote it to make it a string"
        )
    raise ValueError(
        f"an attribute value must be an int, bool, string or {{version: ...}}, "
        f"not {type(raw).__name__}"
    )


def _explicit_attribute(raw: dict[Any, Any]) -> AttributeValue:
    keys = list(raw)
    if len(keys) != 1 or keys[0] not in _API_KEYS:
        raise ValueError(
            f"an attribute given as a mapping must have exactly one key out of "
            f"{', '.join(_API_KEYS)}; got {', '.join(map(str, keys)) or 'none'}"
        )
    kind = keys[0]
    value = raw[kind]
    if kind == "version":
        if not isinstance(value, str):
            raise ValueError(f'version attribute must be a string like "1.2.3", not {value!r}')
        return VersionAttribute(value=check_version(value))
    if kind == "string":
        if not isinstance(value, str):
            raise ValueError(f"string attribute must be a string, not {value!r}")
        return StringAttribute(value=check_string(value))
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"bool attribute must be true or false, not {value!r}")
        return BoolAttribute(value=value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"int attribute must be an integer, not {value!r}")
    return IntAttribute(value=check_int64(value))


AttributeInput = Annotated[AttributeValue, BeforeValidator(attribute_value)]
"""Pydantic field type: an attribute value, converted from its configuration form."""
