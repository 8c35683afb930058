"""The legacy device-plugin shim: this node's devices through the device-plugin API v1beta1.

Pods that ask for ``resources.limits: {dradriver.dev/<kind>: 1}`` get devices from the same
inventory DRA serves, with the same CDI edits, and the node ledger makes sure a device is
never held through both APIs:

* ``partitioned`` mode: ``devicePlugin.resources`` decide which devices each resource
  serves; those devices are left out of the node's ResourceSlices and DRA refuses them.
* ``shared`` mode: DRA publishes every device too. A device held through the device plugin
  is tainted ``<driver>/held-by-device-plugin`` (NoSchedule) or removed in the slices; a
  device held by a DRA claim is reported Unhealthy in ListAndWatch, which takes it out of
  the node's allocatable. The short window before the other side has seen the change ends
  in a clear error from the ledger (Allocate refused, or prepare refused and retried by the
  kubelet), never in two holders.

Allocate does not name the pod: each allocation is a ledger hold keyed by a generated
allocation ID, with a CDI spec of its own (kind ``<driver>/deviceplugin``, so it can never
collide with a claim's spec), and :mod:`kubeletplugin.legacy.podresources` releases it once the
kubelet's pod-resources API no longer shows a container holding those devices.

This module wires the parts together and is what the plugin's entry point uses:

* :mod:`~kubeletplugin.legacy.served`: which devices each resource serves, ListAndWatch
  and DRA's view of them (the two modes);
* :mod:`~kubeletplugin.legacy.allocate`: Allocate, PreStartContainer and
  GetPreferredAllocation, which take holds in the ledger;
* :mod:`~kubeletplugin.legacy.holds`: releasing, adopting and rebuilding those holds;
* :mod:`~kubeletplugin.legacy.gate`: what DRA asks before it prepares a device;
* :mod:`~kubeletplugin.legacy.allocspec`: the CDI spec of one allocation.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from dradriver.deviceplugin.endpoints import (
    DevicePluginEndpoint,
    DevicePluginManager,
    socket_name,
)
from dradriver.deviceplugin.server import ContainerAllocation
from dradriver.devices.config import DevicePluginConfig
from dradriver.devices.model import Device
from dradriver.host.cdi import CDIRegistry
from dradriver.host.hooks import Hook
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import DeviceBusy, PluginHold
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.legacy.allocate import Allocations, pre_start_hook
from kubeletplugin.legacy.allocspec import CDI_CLASS
from kubeletplugin.legacy.gate import DRAGateAnswers
from kubeletplugin.legacy.holds import UNKNOWN_CONTAINER, PluginHolds
from kubeletplugin.legacy.podresources import Assignment
from kubeletplugin.legacy.served import HELD_TAINT_NAME, ServedDevices, held_taint_key
from kubeletplugin.metrics import PluginMetrics

# Names that lived here before the shim was cut into its parts.
__all__ = [
    "CDI_CLASS",
    "HELD_TAINT_NAME",
    "UNKNOWN_CONTAINER",
    "DevicePluginShim",
    "ResourceBackend",
    "held_taint_key",
]


class ResourceBackend:
    """The :class:`~dradriver.deviceplugin.server.DevicePluginBackend` of one resource."""

    def __init__(self, shim: DevicePluginShim, resource_name: str) -> None:
        self._shim = shim
        self._resource = resource_name

    @property
    def resource_name(self) -> str:
        return self._resource

    @property
    def pre_start_required(self) -> bool:
        return self._shim.pre_start_hook is not None

    @property
    def preferred_allocation_available(self) -> bool:
        return self._shim.config.preferred_allocation

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        return self._shim.preferred(self._resource, available, must_include, size)

    async def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        return self._shim.allocate(self._resource, device_ids)

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        await self._shim.pre_start(self._resource, device_ids)


class DevicePluginShim:
    """One object for the plugin's entry point: the kubelet's endpoints, the
    :class:`~kubeletplugin.nodedriver.DRAGate` and the
    :class:`~kubeletplugin.legacy.podresources.HoldKeeper`, each answered by its part."""

    def __init__(
        self,
        *,
        config: DevicePluginConfig,
        driver_name: str,
        inventory: NodeInventory,
        ledger: Ledger,
        cdi_dir: Path,
        plugin_dir: Path,
        instance: str = "",
        metrics: PluginMetrics | None = None,
        watch_interval: float = 1.0,
        partitioned: Collection[str] = (),
    ) -> None:
        """``partitioned``: resources kept from DRA whatever ``config.mode`` says."""
        self.config = config
        self.driver_name = driver_name
        self.inventory = inventory
        self.ledger = ledger
        self.cdi = CDIRegistry(cdi_dir, driver_name, CDI_CLASS)
        self.metrics = metrics or PluginMetrics()
        self.backends = [ResourceBackend(self, r.resource_name) for r in config.resources]
        endpoints = [
            DevicePluginEndpoint(b, plugin_dir, socket_name(b.resource_name, instance, plugin_dir))
            for b in self.backends
        ]
        self.manager = DevicePluginManager(plugin_dir, endpoints, watch_interval=watch_interval)
        self.manager.on_registered = self._registered
        for e in endpoints:
            e.service.on_call = self._rpc_observer(e.resource_name)
        self.served = ServedDevices(
            config=config,
            driver_name=driver_name,
            inventory=inventory,
            ledger=ledger,
            manager=self.manager,
            metrics=self.metrics,
            partitioned=partitioned,
        )
        self.holds = PluginHolds(self.served, ledger, self.cdi, self.metrics)
        self.allocations = Allocations(
            served=self.served,
            holds=self.holds,
            cdi=self.cdi,
            metrics=self.metrics,
            hook=pre_start_hook(config),
        )
        self.gate = DRAGateAnswers(self.served, self.holds)
        self.served.check_overlaps()

    # ----- devices per resource (served) -------------------------------------------

    @property
    def pool(self) -> str:
        return self.served.pool

    @property
    def mode(self) -> str:
        return self.served.mode

    @property
    def resource_names(self) -> list[str]:
        return [b.resource_name for b in self.backends]

    @property
    def pre_start_hook(self) -> Hook | None:
        return self.allocations.hook

    @property
    def on_dra_view_change(self) -> Callable[[], None] | None:
        """Called when the devices DRA must not use change (shared mode): republish slices."""
        return self.served.on_dra_view_change

    @on_dra_view_change.setter
    def on_dra_view_change(self, callback: Callable[[], None] | None) -> None:
        self.served.on_dra_view_change = callback

    def check_overlaps(self) -> None:
        self.served.check_overlaps()

    def resource_of(self, device: Device) -> str | None:
        return self.served.resource_of(device)

    def assignment(self) -> dict[str, list[Device]]:
        return self.served.assignment()

    def refresh(self) -> None:
        self.served.refresh()

    def dra_devices(self, devices: Sequence[Device]) -> list[Device]:
        return self.served.dra_devices(devices)

    # ----- the DRA side's questions (kubeletplugin.nodedriver.DRAGate) -----------------

    def refuse_for_dra(self, device: str) -> str | None:
        return self.gate.refuse_for_dra(device)

    def explain_busy(self, error: DeviceBusy) -> str:
        return self.gate.explain_busy(error)

    def claims_changed(self) -> None:
        self.gate.claims_changed()

    # ----- RPCs (allocate) ----------------------------------------------------------

    def preferred(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        return self.allocations.preferred(resource, available, must_include, size)

    def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerAllocation:
        return self.allocations.allocate(resource, device_ids)

    async def pre_start(self, resource: str, device_ids: Sequence[str]) -> None:
        await self.allocations.pre_start(resource, device_ids)

    # ----- holds (kubeletplugin.legacy.podresources.HoldKeeper) ------------------------------

    def plugin_holds(self) -> list[PluginHold]:
        return self.holds.plugin_holds()

    def in_flight(self) -> Collection[str]:
        return self.allocations.in_flight()

    def observed(self, live: Mapping[str, Assignment]) -> None:
        self.holds.observed(live)

    def owner(self, alloc_id: str) -> Assignment | None:
        return self.holds.owner(alloc_id)

    def release(self, hold: PluginHold, kind: str, reason: str) -> None:
        self.holds.release(hold, kind, reason)

    def adopt(self, assignment: Assignment) -> None:
        self.holds.adopt(assignment)

    def reconcile_cdi(self) -> dict[str, int]:
        return self.holds.reconcile_cdi()

    # ----- lifecycle -----------------------------------------------------------

    def _registered(self, resource: str, reason: str) -> None:
        self.metrics.dp_registrations.labels(resource, reason).inc()
        self.metrics.dp_registered.labels(resource).set(1)

    def _rpc_observer(self, resource: str) -> Callable[[str, float, bool], None]:
        def observe(method: str, seconds: float, failed: bool) -> None:
            self.metrics.dp_rpc_seconds.labels(resource, method).observe(seconds)

        return observe

    def not_registered(self) -> list[str]:
        return self.manager.not_registered()

    async def start(self) -> None:
        self.refresh()
        await self.manager.start()

    async def stop(self) -> None:
        await self.manager.stop()
