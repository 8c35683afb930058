"""Device topology (NUMA node, PCIe root) and topology-aware choice of devices.

Topology comes from the standard device attributes ``resource.kubernetes.io/numaNode``
(int; set by the pci source from sysfs, or in configuration for other devices) and
``resource.kubernetes.io/pcieRoot`` (string). The driver's own ``numaNode`` (what the pci
source published before the standard name existed) is still read from configuration when
the standard one is absent, so older configuration files keep their topology.
:func:`preferred_allocation` answers the kubelet's GetPreferredAllocation: the
must-include devices first, then devices on the same PCIe root, then on the same NUMA
node, and when a new group has to be opened, the tightest one that still fits the rest of
the request (so large groups stay whole for large requests).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from dradriver.devices.attributes import IntAttribute, StringAttribute
from dradriver.devices.model import Device

NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
LEGACY_NUMA_ATTRIBUTE = "numaNode"
MAX_NUMA_NODES = 1024
"""Linux's MAX_NUMNODES bound (CONFIG_NODES_SHIFT is at most 10 on every architecture)."""


@dataclass(frozen=True)
class Topology:
    numa: int | None = None
    pcie_root: str | None = None


NO_TOPOLOGY = Topology()


def device_topology(device: Device, driver: str) -> Topology:
    attributes = device.qualified_attributes(driver)
    numa = attributes.get(NUMA_NODE_ATTRIBUTE) or attributes.get(
        f"{driver}/{LEGACY_NUMA_ATTRIBUTE}"
    )
    root = attributes.get(PCIE_ROOT_ATTRIBUTE)
    return Topology(
        numa=numa.value if isinstance(numa, IntAttribute) else None,
        pcie_root=root.value if isinstance(root, StringAttribute) else None,
    )


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """``dev-2`` sorts before ``dev-10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part
    )


class _Queue:
    """Positions of one group's devices in natural order; taken ones are skipped lazily."""

    __slots__ = ("left", "next", "positions")

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.next = 0
        self.left = 0

    def head(self, taken: list[bool]) -> int | None:
        while self.next < len(self.positions) and taken[self.positions[self.next]]:
            self.next += 1
        return self.positions[self.next] if self.next < len(self.positions) else None


class _Universe:
    """The devices one phase may pick from, grouped by PCIe root, NUMA node and both."""

    def __init__(self, devices: list[str], topo: Callable[[str], Topology]) -> None:
        self.devices = devices
        self.taken = [False] * len(devices)
        self.everything = _Queue()
        self.by_root: dict[str, _Queue] = {}
        self.by_numa: dict[int, _Queue] = {}
        self.by_numa_root: dict[int, dict[str, _Queue]] = {}
        self.queues_of: list[list[_Queue]] = []
        for pos, device in enumerate(devices):
            t = topo(device)
            queues = [self.everything]
            if t.pcie_root is not None:
                queues.append(self.by_root.setdefault(t.pcie_root, _Queue()))
            if t.numa is not None:
                queues.append(self.by_numa.setdefault(t.numa, _Queue()))
                if t.pcie_root is not None:
                    pairs = self.by_numa_root.setdefault(t.numa, {})
                    queues.append(pairs.setdefault(t.pcie_root, _Queue()))
            for q in queues:
                q.positions.append(pos)
                q.left += 1
            self.queues_of.append(queues)

    def take(self, pos: int) -> None:
        self.taken[pos] = True
        for q in self.queues_of[pos]:
            q.left -= 1

    def head(self, q: _Queue) -> int:
        pos = q.head(self.taken)
        assert pos is not None  # only asked of groups with devices left
        return pos

    def largest_root_first(self, numa: int | None) -> int:
        """The first device of the largest PCIe root (of one NUMA node, or of all)."""
        groups = self.by_root if numa is None else self.by_numa_root.get(numa, {})
        rooted = [(-q.left, self.head(q)) for q in groups.values() if q.left]
        if rooted:
            return min(rooted)[1]
        return self.head(self.everything if numa is None else self.by_numa[numa])

    def start_block(self, numas: Collection[int] | None, need: int) -> int:
        """The tightest PCIe root, then the tightest NUMA node, that fits the rest; among
        all devices, or only those on ``numas``."""
        if numas is None:
            roots = [(q.left, self.head(q)) for q in self.by_root.values() if q.left]
            nodes = [(q.left, self.head(q), n) for n, q in self.by_numa.items() if q.left]
        else:
            per_root: dict[str, tuple[int, int]] = {}
            for n in numas:
                for r, q in self.by_numa_root.get(n, {}).items():
                    if q.left:
                        left, first = per_root.get(r, (0, len(self.devices)))
                        per_root[r] = (left + q.left, min(first, self.head(q)))
            roots = list(per_root.values())
            nodes = [
                (node.left, self.head(node), n)
                for n in numas
                if (node := self.by_numa.get(n)) is not None and node.left
            ]
        fitting = [group for group in roots if group[0] >= need]
        if fitting:
            return min(fitting)[1]
        fitting_nodes = [group for group in nodes if group[0] >= need]
        if fitting_nodes:
            return self.largest_root_first(min(fitting_nodes)[2])
        if nodes:  # nothing fits: span as few NUMA nodes as possible
            return self.largest_root_first(min(nodes, key=lambda g: (-g[0], g[1]))[2])
        return self.largest_root_first(None)


def preferred_allocation(
    available: Collection[str],
    must_include: Sequence[str],
    size: int,
    topology: Mapping[str, Topology],
    avoid: Collection[str] = (),
) -> list[str]:
    """``size`` device IDs out of ``available``, ``must_include`` first, topology-aware.

    Devices in ``avoid`` (held through the other API) are used only when nothing else is left.
    Each pick costs the number of topology groups, not the number of devices, so the
    answer takes O(n log n + size * groups) steps.
    """

    def topo(d: str) -> Topology:
        return topology.get(d, NO_TOPOLOGY)

    chosen = list(dict.fromkeys(must_include))
    roots = {t.pcie_root for t in map(topo, chosen) if t.pcie_root is not None}
    numas = {t.numa for t in map(topo, chosen) if t.numa is not None}
    pool = sorted(set(available) - set(chosen), key=natural_key)
    avoided = set(avoid)
    phases = ([d for d in pool if d not in avoided], [d for d in pool if d in avoided])
    for devices in phases:
        if len(chosen) >= size:
            break
        universe = _Universe(devices, topo)
        # Heads of the chosen devices' PCIe roots, fixed lazily when stale.
        heap = [(universe.head(q), r) for r, q in universe.by_root.items() if r in roots and q.left]
        heapq.heapify(heap)
        while len(chosen) < size and universe.everything.left:
            pick = None
            while heap:
                pos, r = heap[0]
                current = universe.by_root[r].head(universe.taken)
                if current is None:
                    heapq.heappop(heap)
                elif current != pos:
                    heapq.heapreplace(heap, (current, r))
                else:
                    pick = pos
                    break
            if pick is None:
                need = size - len(chosen)
                on_numas = [n for n in numas if (node := universe.by_numa.get(n)) and node.left]
                pick = universe.start_block(on_numas if on_numas else None, need)
            universe.take(pick)
            device = universe.devices[pick]
            chosen.append(device)
            t = topo(device)
            if t.pcie_root is not None and t.pcie_root not in roots:
                roots.add(t.pcie_root)
                group = universe.by_root[t.pcie_root]
                if group.left:
                    heapq.heappush(heap, (universe.head(group), t.pcie_root))
            if t.numa is not None:
                numas.add(t.numa)
    return chosen
