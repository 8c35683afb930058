"""Device topology (NUMA node, PCIe root) and topology-aware choice of devices.

Topology comes from device attributes: ``numaNode`` (int, under the driver's domain, set by
the pci source or in configuration) and the standard ``resource.kubernetes.io/pcieRoot``
(string). :func:`preferred_allocation` answers the kubelet's GetPreferredAllocation: the
must-include devices first, then devices on the same PCIe root, then on the same NUMA
node, and when a new group has to be opened, the tightest one that still fits the rest of
the request (so large groups stay whole for large requests).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass

from dradriver.devices.attributes import IntAttribute, StringAttribute
from dradriver.devices.model import Device

NUMA_ATTRIBUTE = "numaNode"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"


@dataclass(frozen=True)
class Topology:
    numa: int | None = None
    pcie_root: str | None = None


NO_TOPOLOGY = Topology()


def device_topology(device: Device, driver: str) -> Topology:
    attributes = device.qualified_attributes(driver)
    numa = attributes.get(f"{driver}/{NUMA_ATTRIBUTE}")
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


def _groups(devices: Sequence[str], key: Callable[[str], Hashable | None]) -> list[list[str]]:
    groups: dict[Hashable, list[str]] = {}
    for d in devices:
        k = key(d)
        if k is not None:
            groups.setdefault(k, []).append(d)
    return list(groups.values())


def preferred_allocation(
    available: Collection[str],
    must_include: Sequence[str],
    size: int,
    topology: Mapping[str, Topology],
    avoid: Collection[str] = (),
) -> list[str]:
    """``size`` device IDs out of ``available``, ``must_include`` first, topology-aware.

    Devices in ``avoid`` (held through the other API) are used only when nothing else is left.
    """

    def topo(d: str) -> Topology:
        return topology.get(d, NO_TOPOLOGY)

    def root(d: str) -> str | None:
        return topo(d).pcie_root

    def numa(d: str) -> int | None:
        return topo(d).numa

    def largest_root_first(group: list[str]) -> str:
        roots = _groups(group, root)
        return max(roots, key=len)[0] if roots else group[0]

    def start_block(pool: list[str], need: int) -> str:
        # The tightest PCIe root, then the tightest NUMA node, that fits the rest.
        fitting = [g for g in _groups(pool, root) if len(g) >= need]
        if fitting:
            return min(fitting, key=len)[0]
        by_numa = _groups(pool, numa)
        fitting = [g for g in by_numa if len(g) >= need]
        if fitting:
            return largest_root_first(min(fitting, key=len))
        if by_numa:  # nothing fits: span as few NUMA nodes as possible
            return largest_root_first(max(by_numa, key=len))
        return largest_root_first(pool)

    chosen = list(dict.fromkeys(must_include))
    pool = sorted(set(available) - set(chosen), key=natural_key)
    while len(chosen) < size and pool:
        need = size - len(chosen)
        usable = [d for d in pool if d not in avoid] or pool
        roots = {root(c) for c in chosen} - {None}
        numas = {numa(c) for c in chosen} - {None}
        same_root = [d for d in usable if root(d) in roots]
        same_numa = [d for d in usable if numa(d) in numas]
        if same_root:
            pick = same_root[0]
        elif same_numa:
            pick = start_block(same_numa, need)
        else:
            pick = start_block(usable, need)
        chosen.append(pick)
        pool.remove(pick)
    return chosen
