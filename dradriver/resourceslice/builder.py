"""ResourceSlices for a node's devices: one pool named after the node, split to fit the API.

Layout (Kubernetes 1.35+ rules, /work/shared/reference/resource-v1.md §5.1 and §5.5):

* counter sets go in slices of their own (a slice holds ``devices`` or ``sharedCounters``,
  never both), at most ``MAX_COUNTER_SETS_PER_SLICE`` per slice; they come first;
* devices, sorted by name, fill the following slices in order: a slice holds at most
  ``MAX_DEVICES_PER_SLICE`` devices, or ``MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS``
  if any of its devices has taints (the unhealthy taint counts) or ``consumesCounters``
  (the API's limits, :mod:`dradriver.k8s.limits`);
* an empty pool is one slice without devices ("the driver is up, it has no devices");
* every slice carries ``nodeName``, the same ``pool.generation`` and
  ``pool.resourceSliceCount`` = the number of slices.

Slice names are deterministic: ``<node>-<driver, dots as dashes>-<index, 5 digits>``, so the
allocator's name order (first fit) is the order built here. Names that would be longer than
253 characters get a shortened prefix plus a hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from dradriver.devices import names
from dradriver.devices.model import CounterSet, Device
from dradriver.devices.quantity import QuantityError, parse_quantity
from dradriver.k8s.limits import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS,
)
from dradriver.log import get_logger

log = get_logger("devices.slices")

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"

_INDEX_DIGITS = 5
_HASH_DIGITS = 8


class SliceError(ValueError):
    """The devices and counter sets cannot be published as one pool."""


def slice_name(node: str, driver: str, index: int) -> str:
    """``<node>-<driver with dots as dashes>-<index>``, a DNS subdomain of <= 253 characters."""
    prefix = f"{node}-{driver.replace('.', '-')}"
    suffix = f"-{index:0{_INDEX_DIGITS}d}"
    if len(prefix) + len(suffix) <= names.DNS_SUBDOMAIN_MAX_LENGTH:
        return prefix + suffix
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:_HASH_DIGITS]
    room = names.DNS_SUBDOMAIN_MAX_LENGTH - len(suffix) - len(digest) - 1
    return f"{prefix[:room].rstrip('-.')}-{digest}{suffix}"


def device_limit(api_devices: Sequence[dict[str, Any]]) -> int:
    """How many devices a slice holding ``api_devices`` may have."""
    if any(d.get("taints") or d.get("consumesCounters") for d in api_devices):
        return MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
    return MAX_DEVICES_PER_SLICE


def _device_chunks(api_devices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Devices in order, each slice filled as far as its own limit allows."""
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    restricted = False
    for device in api_devices:
        device_restricted = bool(device.get("taints") or device.get("consumesCounters"))
        limit = (
            MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
            if restricted or device_restricted
            else MAX_DEVICES_PER_SLICE
        )
        if len(current) + 1 > limit:
            chunks.append(current)
            current, restricted = [], False
        current.append(device)
        restricted = restricted or device_restricted
    if current:
        chunks.append(current)
    return chunks


def _check_pool(devices: Sequence[Device], counter_sets: Sequence[CounterSet]) -> None:
    declared: dict[str, set[str]] = {}
    for counter_set in counter_sets:
        if counter_set.name in declared:
            raise SliceError(f"counter set {counter_set.name!r} is given twice")
        declared[counter_set.name] = set(counter_set.counters)
    seen: set[str] = set()
    for device in devices:
        if device.name in seen:
            raise SliceError(f"device name {device.name!r} is given twice")
        seen.add(device.name)
        for consumption in device.consumes_counters:
            known = declared.get(consumption.counter_set)
            if known is None:
                raise SliceError(
                    f"device {device.name!r} consumes counters of the unknown counter set "
                    f"{consumption.counter_set!r}"
                )
            unknown = sorted(set(consumption.counters) - known)
            if unknown:
                raise SliceError(
                    f"device {device.name!r} consumes counters {unknown} that counter set "
                    f"{consumption.counter_set!r} does not have"
                )


def _warn_inconsistent_types(api_devices: list[dict[str, Any]]) -> None:
    """Constraints compare type and value, so one attribute name should have one type."""
    types: dict[str, tuple[str, str]] = {}
    for device in api_devices:
        for name, value in device.get("attributes", {}).items():
            kind = next(iter(value))
            first = types.setdefault(name, (kind, device["name"]))
            if first[0] != kind:
                log.warning(
                    "attribute has different types on different devices",
                    attribute=name,
                    device=device["name"],
                    type=kind,
                    other_device=first[1],
                    other_type=first[0],
                )


def build_node_slices(
    driver: str,
    node: str,
    devices: Sequence[Device],
    counter_sets: Sequence[CounterSet],
    generation: int,
) -> list[dict[str, Any]]:
    """The ResourceSlice objects (``apiVersion``, ``kind``, ``metadata.name``, ``spec``)."""
    try:
        names.validate_driver_name(driver)
        names.validate_dns_subdomain(node, "node name")
    except ValueError as err:
        raise SliceError(str(err)) from err
    if generation < 0:
        raise SliceError(f"pool generation must be >= 0, not {generation}")
    _check_pool(devices, counter_sets)

    api_devices = [d.to_api(driver) for d in sorted(devices, key=lambda d: d.name)]
    _warn_inconsistent_types(api_devices)
    sorted_sets = sorted(counter_sets, key=lambda c: c.name)
    bodies: list[dict[str, Any]] = [
        {"sharedCounters": [c.to_api() for c in sorted_sets[i : i + MAX_COUNTER_SETS_PER_SLICE]]}
        for i in range(0, len(sorted_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    bodies += [{"devices": chunk} for chunk in _device_chunks(api_devices)]
    if not bodies:
        bodies = [{}]

    pool = {"name": node, "generation": generation, "resourceSliceCount": len(bodies)}
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": slice_name(node, driver, index)},
            "spec": {"driver": driver, "pool": dict(pool), "nodeName": node, **body},
        }
        for index, body in enumerate(bodies)
    ]


# --------------------------------------------------------------------------------------------
# Comparing with what the apiserver has
# --------------------------------------------------------------------------------------------


def _quantity(value: Any) -> Decimal | str:
    # The apiserver rewrites quantities to canonical form ("1024Mi" -> "1Gi"): compare values.
    try:
        return parse_quantity(str(value))
    except QuantityError:
        return str(value)


def _canonical_counters(counters: Any) -> dict[str, Any]:
    return {name: _quantity((c or {}).get("value")) for name, c in (counters or {}).items()}


def _canonical_policy(policy: Any) -> dict[str, Any] | None:
    if not policy:
        return None
    valid_range = policy.get("validRange") or {}
    return {
        "default": _quantity(policy["default"]) if policy.get("default") is not None else None,
        "validValues": [_quantity(v) for v in policy.get("validValues") or []],
        "validRange": {k: _quantity(v) for k, v in valid_range.items() if v is not None},
    }


def _canonical_device(device: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": device.get("name"),
        "attributes": {
            name: {k: v for k, v in (value or {}).items() if v is not None}
            for name, value in (device.get("attributes") or {}).items()
        },
        "capacity": {
            name: (_quantity(c.get("value")), _canonical_policy(c.get("requestPolicy")))
            for name, c in (device.get("capacity") or {}).items()
        },
        "consumesCounters": [
            (c.get("counterSet"), _canonical_counters(c.get("counters")))
            for c in device.get("consumesCounters") or []
        ],
        # The apiserver adds timeAdded to taints; we never set it.
        "taints": [
            (t.get("key"), t.get("value") or "", t.get("effect"))
            for t in device.get("taints") or []
        ],
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations")),
    }


def _canonical_spec(spec: dict[str, Any]) -> dict[str, Any]:
    pool = spec.get("pool") or {}
    return {
        "driver": spec.get("driver"),
        "nodeName": spec.get("nodeName"),
        "pool": (pool.get("name"), pool.get("resourceSliceCount")),
        "devices": [_canonical_device(d) for d in spec.get("devices") or []],
        "sharedCounters": [
            (c.get("name"), _canonical_counters(c.get("counters")))
            for c in spec.get("sharedCounters") or []
        ],
    }


def slices_equal(desired_spec: dict[str, Any], existing_spec: dict[str, Any]) -> bool:
    """Whether ``existing_spec`` (wire JSON, camelCase) already says what ``desired_spec`` says.

    Compares the fields :func:`build_node_slices` sets; ignores ``pool.generation``, fields
    the apiserver adds (taint ``timeAdded``), the spelling of quantities and empty vs absent
    lists and maps.
    """
    return _canonical_spec(desired_spec) == _canonical_spec(existing_spec)
