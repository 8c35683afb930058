"""Which nodes still have a free device of their own, kept current as devices are taken.

Invariant: after :meth:`FreeNodes.sync` with a state, :meth:`FreeNodes.names` are, in name
order, exactly the nodes with at least one *own* device (local to that node in a usable
pool) that is not taken exclusively in that state, and the nodes with a device in a pool
that is not usable (an attempt on them explains why); a device that allows multiple
allocations always counts as free (its shares and capacity are the search's to judge).

Why: an immediate claim tries the nodes in name order until one fits. In a cluster filled
first-fit from the front, almost every node before the first free one is full, so trying
each of them cost every claim work that grew with the number of nodes. A node with no free
own device can add nothing to what the attempt without a node already had (see
:meth:`dradriver.allocator.Allocator.allocate` for when that is enough to skip it), and
this index finds the nodes that can, in time that grows with the devices taken or let go
since the last claim, not with the nodes.
"""

from __future__ import annotations

import bisect

from dradriver.allocator.inventory import SliceInventory
from dradriver.allocator.state import AllocatedState, DeviceID

__all__ = ["FreeNodes"]


class FreeNodes:
    """Free own devices per node of one inventory (module docstring)."""

    def __init__(self, inventory: SliceInventory) -> None:
        self._node_of: dict[DeviceID, str] = {}
        self._shareable: set[DeviceID] = set()
        self._pinned: dict[str, int] = {}  # nodes always tried: an unusable pool's
        self.binds_to_node = False
        """Whether a usable pool has a device that binds to a node (usable only with one)."""
        for pool in inventory.pools:
            if not pool.usable:
                for name in pool.node_names:
                    self._pinned[name] = 1
                continue
            for device in pool.devices:
                self.binds_to_node = self.binds_to_node or device.binds_to_node
                if device.placement.get("kind") == "node":
                    self._node_of[device.id] = str(device.placement.get("node"))
                    if device.allow_multiple:
                        self._shareable.add(device.id)
        self._taken: set[DeviceID] = set()
        self._free: dict[str, int] = {}
        self._names: list[str] = []
        self._state: AllocatedState | None = None
        self._revision = -1

    def sync(self, state: AllocatedState) -> None:
        """Catch up with ``state``: only its changes since the last sync, if it is the
        same state and still remembers them; else everything."""
        changes = state.changes_since(self._revision) if state is self._state else None
        if changes is None:
            self._rebuild(state)
        else:
            for device in changes:
                self._update(device, state)
        self._state, self._revision = state, state.revision

    def names(self) -> list[str]:
        """The nodes with a free own device, in name order (do not change the list)."""
        return self._names

    def _rebuild(self, state: AllocatedState) -> None:
        self._taken = {
            d for d in self._node_of if d not in self._shareable and d in state.dedicated
        }
        self._free = dict(self._pinned)
        for device, node in self._node_of.items():
            self._free.setdefault(node, 0)
            if device not in self._taken:
                self._free[node] += 1
        self._names = sorted(node for node, free in self._free.items() if free)

    def _update(self, device: DeviceID, state: AllocatedState) -> None:
        node = self._node_of.get(device)
        if node is None or device in self._shareable:
            return
        taken = device in state.dedicated
        if taken == (device in self._taken):
            return
        before = self._free[node]
        if taken:
            self._taken.add(device)
            self._free[node] = before - 1
            if before == 1:
                del self._names[bisect.bisect_left(self._names, node)]
        else:
            self._taken.discard(device)
            self._free[node] = before + 1
            if before == 0:
                bisect.insort(self._names, node)
