"""What a driver wants published for one ResourceSlice pool, whoever publishes it.

A :class:`SlicePool` is the desired state of one pool (the upstream Go helper's
``resourceslice.Pool``): its name, where its devices can be used (exactly one of
:class:`NodeName`, :class:`PoolNodeSelector`, :class:`AllNodes`,
:class:`PerDeviceNodeSelection`), its devices and counter sets in wire form
(resource.k8s.io/v1 JSON, in publishing order), the owner the slices are
garbage-collected with, and how its slices are named, labelled, sized and
generation-numbered. The kubelet plugin's node pool comes from :func:`node_pool`;
the controller builds one per NetworkDevicePool.
:mod:`~dradriver.resourceslice.builder` turns a pool into ResourceSlices and
:mod:`~dradriver.resourceslice.publisher` keeps the apiserver's slices equal to it.

A pool is checked when it is made (:class:`SliceError`), so an invalid one never
reaches the publisher. Its device and counter-set dicts are shared with the slices
built from it: treat them as read-only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dradriver.devices.model import CounterSet, Device
from dradriver.k8s import names
from dradriver.k8s.limits import MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
from dradriver.k8s.objects import Obj
from dradriver.log import get_logger

log = get_logger("devices.slices")

_DEVICE_NODE_FIELDS = ("nodeName", "nodeSelector", "allNodes")


class SliceError(ValueError):
    """The devices and counter sets cannot be published as one pool."""


# --- where the devices can be used --------------------------------------------------------


@dataclass(frozen=True)
class NodeName:
    """Node-local devices: every slice carries ``nodeName``."""

    name: str

    def spec(self) -> Obj:
        return {"nodeName": self.name}


@dataclass(frozen=True)
class PoolNodeSelector:
    """Devices reachable from the nodes a core NodeSelector (exactly one term) matches."""

    selector: Mapping[str, Any]

    def spec(self) -> Obj:
        return {"nodeSelector": dict(self.selector)}


@dataclass(frozen=True)
class AllNodes:
    """Devices reachable from every node."""

    def spec(self) -> Obj:
        return {"allNodes": True}


@dataclass(frozen=True)
class PerDeviceNodeSelection:
    """Each device says where it can be used (its own ``nodeName``, ``nodeSelector`` or
    ``allNodes``)."""

    def spec(self) -> Obj:
        return {"perDeviceNodeSelection": True}


NodeSelection = NodeName | PoolNodeSelector | AllNodes | PerDeviceNodeSelection


@dataclass(frozen=True)
class Owner:
    """The object a pool's slices are owned by (``controller: true``), so they go with it.

    A Node's UID may be left empty: the publisher looks it up.
    """

    api_version: str
    kind: str
    name: str
    uid: str = ""

    @classmethod
    def node(cls, name: str) -> Owner:
        return cls("v1", "Node", name)

    @property
    def is_node(self) -> bool:
        return (self.api_version, self.kind) == ("v1", "Node")

    def reference(self, uid: str = "") -> Obj:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": uid or self.uid,
            "controller": True,
        }


# --- the pool -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SlicePool:
    """One pool as the driver wants it published.

    ``devices_per_slice`` None fills each slice as far as the API allows (128 devices, or
    64 once a device in it has taints or consumes counters: :mod:`dradriver.k8s.limits`);
    a fixed size (at most the lower limit) keeps every device in its slice when taints
    come and go, so a taint rewrites one slice in place. The publisher keeps the pool
    generation of the slices it finds and bumps it when the layout changes;
    ``min_generation`` is the lowest generation to publish (a higher one than the slices
    carry bumps it too).
    """

    driver: str
    name: str
    node_selection: NodeSelection
    slice_name_prefix: str
    devices: tuple[Obj, ...] = ()
    counter_sets: tuple[Obj, ...] = ()
    owner: Owner | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    devices_per_slice: int | None = None
    min_generation: int = 0

    def __post_init__(self) -> None:
        try:
            names.validate_driver_name(self.driver)
        except ValueError as err:
            raise SliceError(str(err)) from err
        _check_pool_name(self.name)
        if not self.slice_name_prefix:
            raise SliceError(f"pool {self.name!r} needs a slice name prefix")
        if self.min_generation < 0:
            raise SliceError(f"pool generation must be >= 0, not {self.min_generation}")
        limit = MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
        if self.devices_per_slice is not None and not 1 <= self.devices_per_slice <= limit:
            raise SliceError(f"devices per slice must be between 1 and {limit}")
        _check_devices(self.devices, self.counter_sets, self.node_selection)


def _check_pool_name(name: str) -> None:
    # The API's rule: DNS subdomains separated by slashes, at most 253 characters.
    if not name or len(name) > names.DNS_SUBDOMAIN_MAX_LENGTH:
        raise SliceError(f"pool name {name!r} must have 1 to 253 characters")
    if not all(names.DNS_SUBDOMAIN_RE.fullmatch(segment) for segment in name.split("/")):
        raise SliceError(f"pool name {name!r} is not DNS subdomains separated by '/'")


def _check_devices(
    devices: Sequence[Obj], counter_sets: Sequence[Obj], selection: NodeSelection
) -> None:
    declared: dict[str, set[str]] = {}
    for counter_set in counter_sets:
        if counter_set["name"] in declared:
            raise SliceError(f"counter set {counter_set['name']!r} is given twice")
        declared[counter_set["name"]] = set(counter_set.get("counters") or {})
    seen: set[str] = set()
    per_device = isinstance(selection, PerDeviceNodeSelection)
    for device in devices:
        name = device["name"]
        if name in seen:
            raise SliceError(f"device name {name!r} is given twice")
        seen.add(name)
        for consumption in device.get("consumesCounters") or []:
            known = declared.get(consumption["counterSet"])
            if known is None:
                raise SliceError(
                    f"device {name!r} consumes counters of the unknown counter set "
                    f"{consumption['counterSet']!r}"
                )
            unknown = sorted(set(consumption.get("counters") or {}) - known)
            if unknown:
                raise SliceError(
                    f"device {name!r} consumes counters {unknown} that counter set "
                    f"{consumption['counterSet']!r} does not have"
                )
        placed = sum(1 for f in _DEVICE_NODE_FIELDS if device.get(f))
        if per_device and placed != 1:
            raise SliceError(
                f"device {name!r} needs exactly one of nodeName, nodeSelector, allNodes "
                "(the pool uses per-device node selection)"
            )
        if not per_device and placed:
            raise SliceError(
                f"device {name!r} has its own node selection, but the pool does not use "
                "per-device node selection"
            )


# --- the kubelet plugin's pool ------------------------------------------------------------


def node_slice_prefix(node: str, driver: str) -> str:
    """Node slices are ``<node>-<driver, dots as dashes>-<index>``."""
    return f"{node}-{driver.replace('.', '-')}"


def node_pool(
    driver: str, node: str, devices: Sequence[Device], counter_sets: Sequence[CounterSet]
) -> SlicePool:
    """A node's devices as one pool named after the node, owned by the Node.

    Devices are published sorted by name, so the allocator's first fit follows names.
    """
    try:
        names.validate_driver_name(driver)
        names.validate_dns_subdomain(node, "node name")
    except ValueError as err:
        raise SliceError(str(err)) from err
    api_devices = tuple(d.to_api(driver) for d in sorted(devices, key=lambda d: d.name))
    _warn_inconsistent_types(api_devices)
    return SlicePool(
        driver=driver,
        name=node,
        node_selection=NodeName(node),
        slice_name_prefix=node_slice_prefix(node, driver),
        devices=api_devices,
        counter_sets=tuple(c.to_api() for c in sorted(counter_sets, key=lambda c: c.name)),
        owner=Owner.node(node),
    )


def _warn_inconsistent_types(api_devices: Sequence[Obj]) -> None:
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


# Deprecated names, kept while kubeletplugin.inventory and controller.networkpools use
# them; new code names SlicePool and PoolNodeSelector (distinct from the allocator's
# AllocatorPool and the API's NodeSelector).
Pool = SlicePool
NodeSelector = PoolNodeSelector
