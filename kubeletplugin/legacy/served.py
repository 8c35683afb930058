"""Which devices the device-plugin shim serves, and what each API sees of them.

Invariants:

* a device is served by at most one resource: the first in ``devicePlugin.resources``
  whose selector matches (overlaps are refused at start and warned about once later);
* ListAndWatch lists every device of a resource; one a DRA claim holds (admin access does
  not take a device) is Unhealthy, which takes it out of the node's allocatable;
* ``partitioned`` mode: the resources' devices are left out of the node's ResourceSlices;
  so are, in either mode, the devices of the resources named in ``partitioned`` (host
  profiles' extended resources the shim serves: kubeletplugin.extendedresources);
* ``shared`` mode: DRA publishes every device, except that one held through the device
  plugin is tainted ``<driver>/held-by-device-plugin`` (NoSchedule) or left out
  (``hideFromDRA``); a change of that set is announced through ``on_dra_view_change``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

from dradriver.deviceplugin.endpoints import DevicePluginManager
from dradriver.deviceplugin.server import PluginDevice
from dradriver.devices.config import DevicePluginConfig
from dradriver.devices.model import MAX_TAINTS_PER_DEVICE, Device, DeviceTaint
from dradriver.devices.topology import Topology, device_topology, natural_key
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import ClaimEntry, PluginHold
from dradriver.log import get_logger
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.legacy.errors import DevicePluginSetupError
from kubeletplugin.metrics import PluginMetrics

log = get_logger("kubeletplugin.deviceplugin")

HELD_TAINT_NAME = "held-by-device-plugin"


def held_taint_key(driver: str) -> str:
    return f"{driver}/{HELD_TAINT_NAME}"


def claim_held(claims: Iterable[ClaimEntry], pool: str) -> set[str]:
    """Devices of ``pool`` a DRA claim uses (admin access does not take a device)."""
    return {d.device for c in claims for d in c.devices if d.pool == pool and not d.admin_access}


class ServedDevices:
    """The resources' devices on this node and the two APIs' views of them."""

    def __init__(
        self,
        *,
        config: DevicePluginConfig,
        driver_name: str,
        inventory: NodeInventory,
        ledger: Ledger,
        manager: DevicePluginManager,
        metrics: PluginMetrics,
        partitioned: Collection[str] = (),
    ) -> None:
        self.config = config
        self.partitioned = frozenset(partitioned)
        """Resources served as in ``partitioned`` mode whatever ``devicePlugin.mode`` says."""
        self.driver_name = driver_name
        self.inventory = inventory
        self.ledger = ledger
        self.manager = manager
        self.metrics = metrics
        self.resource_names = [r.resource_name for r in config.resources]
        # Called when the devices DRA must not use change (shared mode): republish slices.
        self.on_dra_view_change: Callable[[], None] | None = None
        self._hidden_from_dra: frozenset[str] = frozenset()
        self._warned_overlap: set[str] = set()

    @property
    def pool(self) -> str:
        return self.inventory.pool

    @property
    def mode(self) -> str:
        return self.config.mode

    def is_partitioned(self, resource: str) -> bool:
        """Whether ``resource``'s devices are kept from DRA altogether."""
        return self.mode == "partitioned" or resource in self.partitioned

    def check_overlaps(self) -> None:
        overlaps = self.config.overlaps(self.inventory.devices.values(), self.driver_name)
        if overlaps:
            raise DevicePluginSetupError(
                "devicePlugin.resources: these devices are selected by more than one resource: "
                + "; ".join(overlaps)
                + ". A device can be served by one resource only; narrow the selectors"
            )

    def resource_of(self, device: Device) -> str | None:
        return self.config.resource_of(device, self.driver_name)

    def assignment(self) -> dict[str, list[Device]]:
        """Each resource's devices, in natural name order."""
        out: dict[str, list[Device]] = {r: [] for r in self.resource_names}
        for device in sorted(self.inventory.devices.values(), key=lambda d: natural_key(d.name)):
            resource = self.resource_of(device)
            if resource is None:
                continue
            out[resource].append(device)
            if device.name not in self._warned_overlap:
                hits = self.config.overlaps([device], self.driver_name)
                if hits:
                    self._warned_overlap.add(device.name)
                    log.warning(
                        "device matches several device-plugin resources; the first one serves it",
                        device=hits[0],
                    )
        return out

    def topology(self, names: Collection[str]) -> dict[str, Topology]:
        out = {}
        for name in names:
            device = self.inventory.devices.get(name)
            if device is not None:
                out[name] = device_topology(device, self.driver_name)
        return out

    def dra_held(self) -> set[str]:
        """Devices a DRA claim uses on this node (admin access does not take a device)."""
        return claim_held(self.ledger.claims(), self.pool)

    def plugin_held(self) -> dict[str, PluginHold]:
        return {
            r.device: h
            for h in self.ledger.plugin_holds()
            for r in h.devices
            if r.pool == self.pool
        }

    # ----- keeping both APIs' views current ---------------------------------------

    def refresh(self) -> None:
        """Push device lists (health and availability) to ListAndWatch; update DRA's view."""
        data = self.ledger.data()
        dra_held = claim_held(data.claims, self.pool)
        holds_per_resource: dict[str, int] = {}
        for h in data.plugin_holds:
            holds_per_resource[h.resource] = holds_per_resource.get(h.resource, 0) + 1
        for resource, devices in self.assignment().items():
            self._publish(resource, devices, dra_held, holds_per_resource.get(resource, 0))
        plugin_held = {
            r.device for h in data.plugin_holds for r in h.devices if r.pool == self.pool
        }
        hidden = frozenset(plugin_held) if self.mode == "shared" else frozenset()
        if hidden != self._hidden_from_dra:
            self._hidden_from_dra = hidden
            if self.on_dra_view_change is not None:
                self.on_dra_view_change()

    def _publish(
        self, resource: str, devices: Sequence[Device], dra_held: Collection[str], holds: int
    ) -> None:
        """One resource's ListAndWatch list and gauges."""
        listed = []
        for device in devices:
            numa = device_topology(device, self.driver_name).numa
            listed.append(
                PluginDevice(
                    id=device.name,
                    healthy=device.healthy and device.name not in dra_held,
                    numa_nodes=(numa,) if numa is not None else (),
                )
            )
        endpoint = self.manager.endpoint(resource)
        if endpoint.service.publish(listed):
            unhealthy = [d.id for d in listed if not d.healthy]
            log.info(
                "device list changed; sent to the kubelet",
                resource=resource,
                devices=len(listed),
                unhealthy=",".join(unhealthy) or "-",
            )
        healthy = sum(1 for d in listed if d.healthy)
        self.metrics.dp_devices.labels(resource, "Healthy").set(healthy)
        self.metrics.dp_devices.labels(resource, "Unhealthy").set(len(listed) - healthy)
        self.metrics.dp_holds.labels(resource).set(holds)
        self.metrics.dp_registered.labels(resource).set(1 if endpoint.registered.is_set() else 0)

    def dra_devices(self, devices: Sequence[Device]) -> list[Device]:
        """The devices to publish in the node's ResourceSlices, as this mode dictates."""
        if self.mode == "partitioned":
            return [d for d in devices if self.resource_of(d) is None]
        held = self.plugin_held()
        taint = DeviceTaint(key=held_taint_key(self.driver_name), effect="NoSchedule")
        out = []
        for device in devices:
            resource = self.resource_of(device)
            if resource is not None and resource in self.partitioned:
                continue
            if device.name not in held:
                out.append(device)
            elif (
                self.config.hide_from_dra == "taint"
                and len(device.api_taints(self.driver_name)) < MAX_TAINTS_PER_DEVICE
            ):
                out.append(device.model_copy(update={"taints": (*device.taints, taint)}))
        return out
