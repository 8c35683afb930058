"""One device as the CEL ``device`` variable of a DRA selector.

Invariants:
- The variable has ``driver``, ``attributes`` and ``capacity`` (each a map from domain to a
  map from name to value; an unqualified name goes under the driver's domain) and
  ``allowMultipleAllocations`` (cel.md §5).
- Attribute values are CEL strings, bools, ints, Semver messages (``version``) or lists of
  those (DRAListTypeAttributes); capacities are Quantity messages.
- A value that cannot be converted (a version that is not strict semver, an unknown value
  type, a capacity that is not a quantity) is left out and recorded in ``error``, which
  makes every evaluation on this device fail, as in Go.
- :attr:`DeviceInput.fingerprint` depends only on what a selector can see (driver,
  attributes, capacity, allowMultipleAllocations).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from dradriver.cel import _types
from dradriver.cel.quantity import QuantityError, parse_nanos
from dradriver.cel.semver import SemverError, parse_semver

__all__ = ["DeviceInput", "device_input"]


class DeviceInput:
    """One device as the ``device`` variable, built once and used for every selector.

    ``device`` is a resource.k8s.io/v1 ``Device`` JSON dict of a slice of ``driver``.
    Unqualified attribute and capacity names go under the driver's domain. A version
    attribute that is not strict semver makes every evaluation fail (``error``), as in Go.
    List attributes (``ints``/``bools``/``strings``/``versions``, DRAListTypeAttributes)
    become CEL lists.
    """

    __slots__ = ("_fingerprint", "data", "device", "driver", "error")

    def __init__(self, driver: str, device: Mapping[str, Any]) -> None:
        self.driver = driver
        self.device = device
        self.error: str | None = None
        self._fingerprint: str | None = None
        attributes: dict[str, dict[str, Any]] = {}
        capacity: dict[str, dict[str, Any]] = {}
        for name, raw in (device.get("attributes") or {}).items():
            domain, ident = _split(name, driver)
            try:
                value = _attribute_value(raw)
            except ValueError as e:
                self.error = f"attribute {name}: {e}"
                continue
            attributes.setdefault(domain, {})[ident] = value
        for name, raw in (device.get("capacity") or {}).items():
            domain, ident = _split(name, driver)
            try:
                nanos = parse_nanos(str((raw or {}).get("value", "0")))
            except QuantityError as e:
                self.error = f"capacity {name}: {e}"
                continue
            capacity.setdefault(domain, {})[ident] = _types.quantity_message(nanos)
        self.data: dict[str, Any] = {
            "driver": driver,
            "attributes": attributes,
            "capacity": capacity,
            "allowMultipleAllocations": bool(device.get("allowMultipleAllocations")),
        }

    @property
    def variables(self) -> dict[str, Any]:
        """The CEL variables for an evaluation (``{"device": ...}``)."""
        return {"device": self.data}

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            blob = json.dumps(
                [
                    self.driver,
                    self.device.get("attributes"),
                    self.device.get("capacity"),
                    bool(self.device.get("allowMultipleAllocations")),
                ],
                sort_keys=True,
                separators=(",", ":"),
            )
            self._fingerprint = hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()
        return self._fingerprint


def device_input(driver: str, device: Mapping[str, Any]) -> DeviceInput:
    return DeviceInput(driver, device)


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def _attribute_value(raw: Mapping[str, Any]) -> Any:
    if "string" in raw:
        return str(raw["string"])
    if "bool" in raw:
        return bool(raw["bool"])
    if "int" in raw:
        return int(raw["int"])
    if "version" in raw:
        return _version(raw["version"])
    for key in ("strings", "bools", "ints"):
        if key in raw:
            return list(raw[key] or [])
    if "versions" in raw:
        return [_version(v) for v in raw["versions"] or []]
    raise ValueError(f"unsupported attribute value {dict(raw)!r}")


def _version(text: object) -> Any:
    try:
        return _types.semver_message(parse_semver(str(text)))
    except SemverError as e:
        raise ValueError(str(e)) from None
