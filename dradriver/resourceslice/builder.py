"""ResourceSlices for a :class:`~dradriver.resourceslice.pool.SlicePool`, split to fit the API.

Layout (Kubernetes 1.35+ rules, /work/shared/reference/resource-v1.md §5.1 and §5.5):

* counter sets go in slices of their own (a slice holds ``devices`` or ``sharedCounters``,
  never both), at most ``MAX_COUNTER_SETS_PER_SLICE`` per slice; they come first;
* devices, in the pool's order, fill the following slices: a slice holds at most
  ``MAX_DEVICES_PER_SLICE`` devices, or ``MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS``
  if any of its devices has taints (the unhealthy taint counts) or ``consumesCounters``
  (the API's limits, :mod:`dradriver.k8s.limits`); a pool with a fixed
  ``devices_per_slice`` (network pools: 64) is cut into that many;
* an empty pool is one slice without devices ("the driver is up, it has no devices");
* every slice carries the pool's node selection, the same ``pool.generation`` and
  ``pool.resourceSliceCount`` = the number of slices, the pool's labels and its owner.

Slice names are deterministic: ``<prefix>-<index, 5 digits>`` (node pools:
``<node>-<driver, dots as dashes>``; network pools: ``network-<pool>-<driver>``), so the
allocator's name order (first fit) is the order built here. Names that would be longer
than 253 characters get a shortened prefix plus a hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from dradriver.k8s import names
from dradriver.k8s.limits import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS,
)
from dradriver.k8s.objects import Obj
from dradriver.k8s.quantity import QuantityError, parse_quantity
from dradriver.resourceslice.pool import SliceError, SlicePool

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"

_INDEX_DIGITS = 5
_HASH_DIGITS = 8


def slice_name(prefix: str, index: int) -> str:
    """``<prefix>-<index>``, a DNS subdomain of <= 253 characters."""
    suffix = f"-{index:0{_INDEX_DIGITS}d}"
    if len(prefix) + len(suffix) <= names.DNS_SUBDOMAIN_MAX_LENGTH:
        return prefix + suffix
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:_HASH_DIGITS]
    room = names.DNS_SUBDOMAIN_MAX_LENGTH - len(suffix) - len(digest) - 1
    return f"{prefix[:room].rstrip('-.')}-{digest}{suffix}"


def _restricted(device: Obj) -> bool:
    return bool(device.get("taints") or device.get("consumesCounters"))


def device_limit(api_devices: Sequence[Obj]) -> int:
    """How many devices a slice holding ``api_devices`` may have."""
    if any(_restricted(d) for d in api_devices):
        return MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
    return MAX_DEVICES_PER_SLICE


def _device_chunks(api_devices: Sequence[Obj]) -> list[list[Obj]]:
    """Devices in order, each slice filled as far as its own limit allows."""
    chunks: list[list[Obj]] = []
    current: list[Obj] = []
    restricted = False
    for device in api_devices:
        device_restricted = _restricted(device)
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


def build_slices(pool: SlicePool, generation: int, owner_uid: str = "") -> list[Obj]:
    """The ResourceSlice objects (``apiVersion``, ``kind``, ``metadata``, ``spec``) of ``pool``.

    ``owner_uid`` stands in for the owner's UID when the pool does not carry it (the
    publisher looks up a Node's); without any UID the slices get no owner reference.
    """
    if generation < 0:
        raise SliceError(f"pool generation must be >= 0, not {generation}")
    sets = pool.counter_sets
    bodies: list[Obj] = [
        {"sharedCounters": list(sets[i : i + MAX_COUNTER_SETS_PER_SLICE])}
        for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    size = pool.devices_per_slice
    chunks = (
        [list(pool.devices[i : i + size]) for i in range(0, len(pool.devices), size)]
        if size
        else _device_chunks(pool.devices)
    )
    bodies += [{"devices": chunk} for chunk in chunks]
    if not bodies:
        bodies = [{}]

    header = {"name": pool.name, "generation": generation, "resourceSliceCount": len(bodies)}
    metadata: Obj = {}
    if pool.labels:
        metadata["labels"] = dict(pool.labels)
    if pool.owner is not None and (owner_uid or pool.owner.uid):
        metadata["ownerReferences"] = [pool.owner.reference(owner_uid)]
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": slice_name(pool.slice_name_prefix, index), **metadata},
            "spec": {
                "driver": pool.driver,
                "pool": dict(header),
                **pool.node_selection.spec(),
                **body,
            },
        }
        for index, body in enumerate(bodies)
    ]


def slice_layout(spec: Obj) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Which devices and counter sets a slice holds: what a generation bump is about."""
    return (
        tuple(d.get("name", "") for d in spec.get("devices") or []),
        tuple(c.get("name", "") for c in spec.get("sharedCounters") or []),
    )


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


def _canonical_placement(obj: Obj) -> tuple[Any, ...]:
    # Node selection of a slice, or of a device in a per-device pool.
    return (obj.get("nodeName") or None, obj.get("nodeSelector") or None, bool(obj.get("allNodes")))


def _canonical_device(device: Obj) -> dict[str, Any]:
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
        "placement": _canonical_placement(device),
        "bindsToNode": bool(device.get("bindsToNode")),
        "bindingConditions": list(device.get("bindingConditions") or []),
        "bindingFailureConditions": list(device.get("bindingFailureConditions") or []),
    }


def _canonical_spec(spec: Obj) -> dict[str, Any]:
    pool = spec.get("pool") or {}
    return {
        "driver": spec.get("driver"),
        "placement": _canonical_placement(spec),
        "perDeviceNodeSelection": bool(spec.get("perDeviceNodeSelection")),
        "pool": (pool.get("name"), pool.get("resourceSliceCount")),
        "devices": [_canonical_device(d) for d in spec.get("devices") or []],
        "sharedCounters": [
            (c.get("name"), _canonical_counters(c.get("counters")))
            for c in spec.get("sharedCounters") or []
        ],
    }


def slices_equal(desired_spec: Obj, existing_spec: Obj) -> bool:
    """Whether ``existing_spec`` (wire JSON, camelCase) already says what ``desired_spec`` says.

    Compares the fields :func:`build_slices` sets; ignores ``pool.generation``, fields
    the apiserver adds (taint ``timeAdded``), the spelling of quantities and empty vs absent
    lists and maps.
    """
    return _canonical_spec(desired_spec) == _canonical_spec(existing_spec)


def _owners(metadata: Obj) -> list[tuple[Any, ...]]:
    return sorted(
        (r.get("apiVersion"), r.get("kind"), r.get("name"), r.get("uid"), bool(r.get("controller")))
        for r in metadata.get("ownerReferences") or []
    )


def same_slice(desired: Obj, existing: Obj) -> bool:
    """:func:`slices_equal`, and the slice has our owner references and labels (others may
    add labels of their own)."""
    want, have = desired.get("metadata") or {}, existing.get("metadata") or {}
    labels = have.get("labels") or {}
    return (
        slices_equal(desired.get("spec") or {}, existing.get("spec") or {})
        and _owners(want) == _owners(have)
        and all(labels.get(k) == v for k, v in (want.get("labels") or {}).items())
    )
