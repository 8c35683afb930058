"""An index of ResourceSlices and DeviceClasses, built once and reused for many allocations.

Pools follow the scheduler's rules (structured/internal/*/pools_*.go):

* slices are grouped by (driver, pool name); only the highest ``pool.generation`` counts,
  older slices are stale and their devices are ignored;
* a pool is *complete* when the number of slices at that generation equals their
  ``pool.resourceSliceCount``; incomplete pools are not allocated from (and make an
  ``All`` request fail);
* a pool is *invalid* for duplicate device names, duplicate counter sets, or devices
  consuming counters that no counter set defines;
* first-fit order: pools by their first slice name, pools with binding conditions last;
  inside a pool, slices by name (those with binding conditions last), devices in order.

Node reachability comes from the slice (``nodeName``, ``nodeSelector``, ``allNodes``) or,
with ``perDeviceNodeSelection``, from each device.

Selector results are cached per (expression, device) for the inventory's lifetime: they
do not depend on what is allocated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from dradriver.allocator.nodes import NodeInfo, selector_matches
from dradriver.allocator.state import DeviceID, qualify
from dradriver.cel import DeviceInput, EvalResult, Selector
from dradriver.k8s.objects import Obj
from dradriver.k8s.quantity import QuantityError, parse_quantity

__all__ = ["AllocatorPool", "CandidateDevice", "Capacity", "QuantityValue", "SliceInventory"]


@dataclass(frozen=True)
class QuantityValue:
    """A quantity: exact value and the string it came from (kept for output)."""

    value: Decimal
    text: str

    @classmethod
    def parse(cls, text: object) -> QuantityValue:
        return cls(parse_quantity(str(text)), str(text))


@dataclass(frozen=True)
class Capacity:
    name: str  # as published: the spelling written to consumedCapacity in claim status
    qualified: str
    value: QuantityValue
    default: QuantityValue | None = None
    valid_values: tuple[QuantityValue, ...] = ()
    range_min: QuantityValue | None = None
    range_max: QuantityValue | None = None
    range_step: QuantityValue | None = None
    has_policy: bool = False


@dataclass(eq=False)
class AllocatorPool:
    """One pool (driver, name) at its newest generation, as the allocator sees it."""

    driver: str
    name: str
    generation: int
    slice_names: list[str] = field(default_factory=list)
    expected_slices: int = 0
    complete: bool = True
    invalid: str | None = None
    counters: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    has_binding_conditions: bool = False
    devices: list[CandidateDevice] = field(default_factory=list)
    node_names: set[str] = field(default_factory=set)
    """Nodes of node-local devices (a summary for quick reachability checks)."""
    reaches_all: bool = False
    node_selectors: list[Mapping[str, Any]] = field(default_factory=list)

    def may_reach(self, node: NodeInfo | None) -> bool:
        """Whether some device of the pool may be reachable from ``node``."""
        if node is None:
            return self.reaches_all or bool(self.node_selectors)
        if self.reaches_all or node.name in self.node_names:
            return True
        return any(selector_matches(s, node) for s in self.node_selectors)

    @property
    def usable(self) -> bool:
        return self.complete and self.invalid is None

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"

    def problem(self) -> str | None:
        if self.invalid is not None:
            return f"pool {self.id} is invalid: {self.invalid}"
        if not self.complete:
            return (
                f"pool {self.id} is incomplete: {len(self.slice_names)} of "
                f"{self.expected_slices} slices at generation {self.generation} are present "
                "(the driver is updating it)"
            )
        return None


class CandidateDevice:
    """One device of a current pool generation, with what the allocator needs precomputed."""

    __slots__ = (
        "_input",
        "allow_multiple",
        "attributes",
        "binding_conditions",
        "binding_failure_conditions",
        "binds_to_node",
        "capacity",
        "consumes",
        "driver",
        "id",
        "index",
        "name",
        "placement",
        "pool",
        "raw",
        "slice_name",
        "stale",
        "taints",
    )

    def __init__(
        self, pool: AllocatorPool, slice_name: str, raw: Mapping[str, Any], placement: Obj
    ):
        self.pool = pool
        self.driver = pool.driver
        self.slice_name = slice_name
        self.raw = raw
        self.name = str(raw.get("name", ""))
        self.id: DeviceID = (pool.driver, pool.name, self.name)
        self.index = -1
        self.stale: str | None = None
        self._input: DeviceInput | None = None
        self.placement = placement
        self.allow_multiple = bool(raw.get("allowMultipleAllocations"))
        self.binds_to_node = bool(raw.get("bindsToNode"))
        self.binding_conditions = list(raw.get("bindingConditions") or [])
        self.binding_failure_conditions = list(raw.get("bindingFailureConditions") or [])
        self.taints = [
            t for t in raw.get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")
        ]
        self.attributes: dict[str, tuple[str, Any]] = {}
        for name, value in (raw.get("attributes") or {}).items():
            for kind in ("string", "int", "bool", "version"):
                if kind in value:
                    self.attributes[name] = (kind, value[kind])
                    break
            else:
                for kind in ("strings", "ints", "bools", "versions"):
                    if kind in value:
                        self.attributes[name] = (kind, tuple(value[kind] or ()))
                        break
        self.capacity: dict[str, Capacity] = {}
        for name, cap in (raw.get("capacity") or {}).items():
            qualified = qualify(name, self.driver)
            if "/" not in name and qualified in self.capacity:
                continue  # spelled both ways: the driver-qualified entry wins (as in Go)
            try:
                self.capacity[qualified] = _capacity(name, self.driver, cap)
            except QuantityError:
                continue
        self.consumes: list[tuple[str, dict[str, Decimal]]] = []
        for entry in raw.get("consumesCounters") or []:
            counters: dict[str, Decimal] = {}
            for counter, value in (entry.get("counters") or {}).items():
                try:
                    counters[counter] = parse_quantity(str((value or {}).get("value", "0")))
                except QuantityError:
                    counters[counter] = Decimal(0)
            self.consumes.append((str(entry.get("counterSet", "")), counters))

    def __repr__(self) -> str:
        return f"CandidateDevice({'/'.join(self.id)})"

    @property
    def input(self) -> DeviceInput:
        if self._input is None:
            self._input = DeviceInput(self.driver, self.raw)
        return self._input

    def attribute(self, qualified: str) -> tuple[str, Any] | None:
        """The value of a fully-qualified attribute name (the driver's domain may be omitted)."""
        found = self.attributes.get(qualified)
        if found is not None:
            return found
        domain, _, ident = qualified.partition("/")
        if domain == self.driver:
            return self.attributes.get(ident)
        return None

    def reachable(self, node: NodeInfo | None) -> bool:
        """Usable from ``node``; with no node, only devices not tied to one node."""
        kind = self.placement.get("kind")
        if node is None:
            return not self.binds_to_node and kind in ("all", "selector")
        if kind == "node":
            return bool(self.placement.get("node") == node.name)
        if kind == "all":
            return True
        if kind == "selector":
            return selector_matches(self.placement.get("selector"), node)
        return False

    def placement_text(self) -> str:
        kind = self.placement.get("kind")
        if kind == "node":
            return f"local to node {self.placement.get('node')}"
        if kind == "all":
            return "reachable from all nodes"
        if kind == "selector":
            return "reachable from nodes matching its node selector"
        return "has no node placement this allocator understands"


def _capacity(name: str, driver: str, raw: Mapping[str, Any]) -> Capacity:
    policy = raw.get("requestPolicy")
    value = QuantityValue.parse(raw.get("value", "0"))
    if not policy:
        return Capacity(name, qualify(name, driver), value)
    valid_range = policy.get("validRange") or {}

    def opt(v: object) -> QuantityValue | None:
        return None if v is None else QuantityValue.parse(v)

    return Capacity(
        name,
        qualify(name, driver),
        value,
        default=opt(policy.get("default")),
        valid_values=tuple(QuantityValue.parse(v) for v in policy.get("validValues") or []),
        range_min=opt(valid_range.get("min")),
        range_max=opt(valid_range.get("max")),
        range_step=opt(valid_range.get("step")),
        has_policy=True,
    )


def _placement(spec: Mapping[str, Any], device: Mapping[str, Any]) -> Obj:
    source = device if spec.get("perDeviceNodeSelection") else spec
    if source.get("nodeName"):
        return {"kind": "node", "node": source["nodeName"], "selector": None}
    if source.get("allNodes"):
        return {"kind": "all", "selector": None}
    if source.get("nodeSelector") is not None:
        return {"kind": "selector", "selector": source["nodeSelector"]}
    return {"kind": "unknown", "selector": None}


class SliceInventory:
    """Slices and classes indexed for allocation (immutable; rebuild when they change)."""

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]],
        classes: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]] = (),
    ) -> None:
        if isinstance(classes, Mapping):
            self.classes: dict[str, Mapping[str, Any]] = dict(classes)
        else:
            self.classes = {str((c.get("metadata") or {}).get("name", "")): c for c in classes}
        ordered = sorted(slices, key=lambda s: str((s.get("metadata") or {}).get("name", "")))
        groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for item in ordered:
            spec = item.get("spec") or {}
            key = (str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", "")))
            groups.setdefault(key, []).append(item)
        self.pools: list[AllocatorPool] = []
        self.stale: list[CandidateDevice] = []
        for (driver, pool_name), members in groups.items():
            self.pools.append(self._pool(driver, pool_name, members))
        self.pools.sort(key=lambda p: p.has_binding_conditions)  # stable: keeps name order
        self.devices: list[CandidateDevice] = []
        for pool in self.pools:
            for device in pool.devices:
                device.index = len(self.devices)
                self.devices.append(device)
        self.by_id: dict[DeviceID, CandidateDevice] = {d.id: d for d in self.devices}
        self._visible: dict[tuple[str, ...] | None, list[CandidateDevice]] = {}
        self._visible_pools: dict[tuple[str, ...] | None, list[AllocatorPool]] = {}
        self._results: dict[str, list[EvalResult | None]] = {}

    def _pool(self, driver: str, name: str, members: list[Mapping[str, Any]]) -> AllocatorPool:
        def generation(s: Mapping[str, Any]) -> int:
            return int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)

        newest = max(generation(s) for s in members)
        pool = AllocatorPool(driver, name, newest)
        current = [s for s in members if generation(s) == newest]
        counts = {
            int(((s.get("spec") or {}).get("pool") or {}).get("resourceSliceCount") or 0)
            for s in current
        }
        pool.slice_names = [str((s.get("metadata") or {}).get("name", "")) for s in current]
        pool.expected_slices = max(counts)
        pool.complete = len(counts) == 1 and pool.expected_slices == len(current)
        for s in members:
            if generation(s) < newest:
                spec = s.get("spec") or {}
                for raw in spec.get("devices") or []:
                    dev = CandidateDevice(
                        pool, str((s.get("metadata") or {}).get("name", "")), raw, {}
                    )
                    dev.stale = (
                        f"slice {(s.get('metadata') or {}).get('name')} has pool generation "
                        f"{generation(s)}, the pool is at {newest}: stale, ignored"
                    )
                    self.stale.append(dev)

        def has_bc(s: Mapping[str, Any]) -> bool:
            return any(
                d.get("bindingConditions") for d in (s.get("spec") or {}).get("devices") or []
            )

        names: set[str] = set()
        for s in sorted(current, key=has_bc):
            spec = s.get("spec") or {}
            slice_name = str((s.get("metadata") or {}).get("name", ""))
            for counter_set in spec.get("sharedCounters") or []:
                set_name = str(counter_set.get("name", ""))
                if set_name in pool.counters:
                    pool.invalid = pool.invalid or f"duplicate counter set name {set_name}"
                counters: dict[str, Decimal] = {}
                for counter, value in (counter_set.get("counters") or {}).items():
                    try:
                        counters[counter] = parse_quantity(str((value or {}).get("value", "0")))
                    except QuantityError:
                        counters[counter] = Decimal(0)
                pool.counters[set_name] = counters
            for raw in spec.get("devices") or []:
                device = CandidateDevice(pool, slice_name, raw, _placement(spec, raw))
                if device.name in names:
                    pool.invalid = pool.invalid or f"duplicate device name {device.name}"
                names.add(device.name)
                pool.devices.append(device)
                if device.binding_conditions:
                    pool.has_binding_conditions = True
        for device in pool.devices:
            kind = device.placement.get("kind")
            if kind == "node":
                pool.node_names.add(str(device.placement.get("node")))
            elif kind == "all":
                pool.reaches_all = True
            elif kind == "selector":
                selector = device.placement.get("selector") or {}
                if selector not in pool.node_selectors:
                    pool.node_selectors.append(selector)
            for set_name, counters in device.consumes:
                if set_name not in pool.counters:
                    pool.invalid = pool.invalid or f"counter set {set_name} not found"
                    continue
                for counter in counters:
                    if counter not in pool.counters[set_name]:
                        pool.invalid = (
                            pool.invalid or f"counter {counter} not found in counter set {set_name}"
                        )
        return pool

    def device(self, device_id: DeviceID) -> CandidateDevice | None:
        return self.by_id.get(device_id)

    @staticmethod
    def _node_key(node: NodeInfo | None) -> tuple[str, ...] | None:
        if node is None:
            return None
        return (node.name, *sorted(f"{k}={v}" for k, v in node.labels.items()))

    def visible(self, node: NodeInfo | None) -> list[CandidateDevice]:
        """Devices of usable pools reachable from ``node``, in first-fit order."""
        key = self._node_key(node)
        found = self._visible.get(key)
        if found is None:
            found = [
                d
                for p in self.visible_pools(node)
                if p.usable
                for d in p.devices
                if d.reachable(node)
            ]
            self._visible[key] = found
        return found

    def visible_pools(self, node: NodeInfo | None) -> list[AllocatorPool]:
        """Pools with at least one device reachable from ``node`` (usable or not)."""
        key = self._node_key(node)
        found = self._visible_pools.get(key)
        if found is None:
            found = [
                p
                for p in self.pools
                if p.may_reach(node) and any(d.reachable(node) for d in p.devices)
            ]
            self._visible_pools[key] = found
        return found

    def evaluate(self, selector: Selector, device: CandidateDevice) -> EvalResult:
        """The selector's result for the device (memoised)."""
        results = self._results.get(selector.expression)
        if results is None:
            results = self._results[selector.expression] = [None] * len(self.devices)
        if device.index < 0:  # a stale device, only looked at by explanations
            return selector.evaluate(device.input)
        result = results[device.index]
        if result is None:
            result = results[device.index] = selector.evaluate(device.input)
        return result
