"""The allocator's view of one device and of one pool: parsed once per slice, read by every
search.

A :class:`CandidateDevice` parses what every search needs (identity, placement, taints,
counters) when it is made, and attributes and capacity on first use: most devices of a
large inventory are never asked. Its ``index`` is its position in the inventory that
numbered it last (:class:`~dradriver.allocator.inventory.SliceInventory`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from dradriver.allocator.nodes import NodeInfo, selector_matches
from dradriver.allocator.state import DeviceID, by_qualified_name, qualify
from dradriver.cel import DeviceInput
from dradriver.k8s.objects import Obj
from dradriver.k8s.quantity import QuantityError, parse_quantity

__all__ = [
    "AllocatorPool",
    "CandidateDevice",
    "Capacity",
    "QuantityValue",
    "counters_of",
    "device_placement",
]


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
        "_attributes",
        "_capacity",
        "_input",
        "allow_multiple",
        "binding_conditions",
        "binding_failure_conditions",
        "binds_to_node",
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
        self._attributes: dict[str, tuple[str, Any]] | None = None
        self._capacity: dict[str, Capacity] | None = None
        self.consumes: list[tuple[str, dict[str, Decimal]]] = []
        for entry in raw.get("consumesCounters") or []:
            self.consumes.append((str(entry.get("counterSet", "")), counters_of(entry)))

    def __repr__(self) -> str:
        return f"CandidateDevice({'/'.join(self.id)})"

    # Attributes and capacity are read on demand (constraints, capacity requests): most
    # devices of a large inventory are never asked, and the index is rebuilt on every
    # slice change.

    @property
    def attributes(self) -> dict[str, tuple[str, Any]]:
        """Typed attribute values by name: (kind, value)."""
        if self._attributes is None:
            self._attributes = _attributes(self.raw)
        return self._attributes

    @property
    def capacity(self) -> dict[str, Capacity]:
        """Capacities by fully-qualified name."""
        if self._capacity is None:
            self._capacity = _capacities(self.raw, self.driver)
        return self._capacity

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


def counters_of(entry: Mapping[str, Any]) -> dict[str, Decimal]:
    """The ``counters`` of a counter set or of a device's ``consumesCounters`` entry; a
    value that is not a quantity counts as 0."""
    counters: dict[str, Decimal] = {}
    for counter, value in (entry.get("counters") or {}).items():
        try:
            counters[counter] = parse_quantity(str((value or {}).get("value", "0")))
        except QuantityError:
            counters[counter] = Decimal(0)
    return counters


def _attributes(raw: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    attributes: dict[str, tuple[str, Any]] = {}
    for name, value in (raw.get("attributes") or {}).items():
        for kind in ("string", "int", "bool", "version"):
            if kind in value:
                attributes[name] = (kind, value[kind])
                break
        else:
            for kind in ("strings", "ints", "bools", "versions"):
                if kind in value:
                    attributes[name] = (kind, tuple(value[kind] or ()))
                    break
    return attributes


def _capacities(raw: Mapping[str, Any], driver: str) -> dict[str, Capacity]:
    return by_qualified_name(
        raw.get("capacity"), driver, lambda name, cap: _capacity(name, driver, cap)
    )


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


def device_placement(spec: Mapping[str, Any], device: Mapping[str, Any]) -> Obj:
    source = device if spec.get("perDeviceNodeSelection") else spec
    if source.get("nodeName"):
        return {"kind": "node", "node": source["nodeName"], "selector": None}
    if source.get("allNodes"):
        return {"kind": "all", "selector": None}
    if source.get("nodeSelector") is not None:
        return {"kind": "selector", "selector": source["nodeSelector"]}
    return {"kind": "unknown", "selector": None}
