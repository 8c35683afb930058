"""This node's devices as the sources see them now, and what changed since last time."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dradriver.devices.model import CounterSet, Device
from dradriver.log import get_logger
from dradriver.plugin.interface import DeviceHealth
from dradriver.resourceslice.pool import Pool, node_pool

log = get_logger("kubeletplugin.inventory")


class NodeInventory:
    """Devices by name; ``refresh`` re-runs discovery (health included)."""

    def __init__(self, pool: str, discover: Callable[[], list[Device]]) -> None:
        self.pool = pool
        self._discover = discover
        self.devices: dict[str, Device] = {}
        self.refresh()

    def refresh(self) -> bool:
        """Discover again; True if any device appeared, vanished or changed (health too)."""
        found = {d.name: d for d in self._discover()}
        changed = found != self.devices
        if changed:
            for name in sorted(found.keys() - self.devices.keys()):
                log.info("device appeared", device=name)
            for name in sorted(self.devices.keys() - found.keys()):
                log.warning("device vanished", device=name)
            for name in sorted(found.keys() & self.devices.keys()):
                if found[name].healthy != self.devices[name].healthy:
                    log.warning("device health changed", device=name, healthy=found[name].healthy)
        self.devices = found
        return changed

    def resource_pool(
        self,
        driver: str,
        counter_sets: Sequence[CounterSet],
        shown: Callable[[list[Device]], list[Device]] | None = None,
    ) -> Pool:
        """What this node publishes: its devices (those ``shown`` leaves to DRA, when the
        device-plugin shim takes some) as the node's pool; SliceError if they cannot be."""
        devices = list(self.devices.values())
        if shown is not None:
            devices = shown(devices)
        return node_pool(driver, self.pool, devices, counter_sets)

    def health(self) -> list[DeviceHealth]:
        return [
            DeviceHealth(
                self.pool,
                d.name,
                d.healthy,
                "" if d.healthy else "device file missing or device gone",
            )
            for d in sorted(self.devices.values(), key=lambda d: d.name)
        ]

    def unhealthy(self) -> int:
        return sum(1 for d in self.devices.values() if not d.healthy)
