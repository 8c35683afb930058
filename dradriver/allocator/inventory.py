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
do not depend on what is allocated. With a :class:`~dradriver.allocator.pools.PoolCache`,
a new inventory reuses the pools whose slices are unchanged (that module's invariants).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dradriver.allocator.devices import AllocatorPool, CandidateDevice, Capacity, QuantityValue
from dradriver.allocator.nodes import NodeInfo
from dradriver.allocator.pools import PoolCache, build_pool
from dradriver.allocator.state import DeviceID
from dradriver.cel import EvalResult, Selector
from dradriver.k8s.objects import name_of

__all__ = [
    "AllocatorPool",
    "CandidateDevice",
    "Capacity",
    "PoolCache",
    "QuantityValue",
    "SliceInventory",
]


class SliceInventory:
    """Slices and classes indexed for allocation (immutable; rebuild when they change).

    ``pools``: reuse the pools of unchanged slices built for an earlier inventory; that
    inventory must not be used any more (:mod:`dradriver.allocator.pools`).
    """

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]],
        classes: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]] = (),
        pools: PoolCache | None = None,
    ) -> None:
        if isinstance(classes, Mapping):
            self.classes: dict[str, Mapping[str, Any]] = dict(classes)
        else:
            self.classes = {name_of(c): c for c in classes}
        ordered = sorted(slices, key=name_of)
        groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for item in ordered:
            spec = item.get("spec") or {}
            key = (str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", "")))
            groups.setdefault(key, []).append(item)
        self.pools: list[AllocatorPool] = []
        self.stale: list[CandidateDevice] = []
        for (driver, pool_name), members in groups.items():
            if pools is None:
                pool, stale = build_pool(driver, pool_name, members)
            else:
                pool, stale = pools.pool(driver, pool_name, members)
            self.pools.append(pool)
            self.stale.extend(stale)
        if pools is not None:
            pools.keep(groups)
        self.pools.sort(key=lambda p: p.has_binding_conditions)  # stable: keeps name order
        self.devices: list[CandidateDevice] = []
        for pool in self.pools:
            for device in pool.devices:
                device.index = len(self.devices)
                self.devices.append(device)
        self.by_id: dict[DeviceID, CandidateDevice] = {d.id: d for d in self.devices}
        # Pool positions: of the pools with devices local to each node, and of those that
        # reach beyond one node (allNodes, node selectors).
        self._pools_of_node: dict[str, list[int]] = {}
        self._wide_pools: list[int] = []
        for position, pool in enumerate(self.pools):
            for name in pool.node_names:
                self._pools_of_node.setdefault(name, []).append(position)
            if pool.reaches_all or pool.node_selectors:
                self._wide_pools.append(position)
        self._visible: dict[tuple[str, ...] | None, list[CandidateDevice]] = {}
        self._visible_pools: dict[tuple[str, ...] | None, list[AllocatorPool]] = {}
        self._results: dict[str, list[EvalResult | None]] = {}

    def device(self, device_id: DeviceID) -> CandidateDevice | None:
        return self.by_id.get(device_id)

    @staticmethod
    def _node_key(node: NodeInfo | None) -> tuple[str, ...] | None:
        return None if node is None else node.key

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
            # Only the pools that name the node or reach beyond one node: not every pool
            # (one per node in a large cluster) for every node.
            near = self._pools_of_node.get(node.name, []) if node is not None else []
            positions = sorted({*near, *self._wide_pools})
            found = [
                p
                for p in (self.pools[i] for i in positions)
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
