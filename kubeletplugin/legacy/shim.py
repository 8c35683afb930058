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
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import grpc

from dradriver.deviceplugin.server import (
    ContainerAllocation,
    DeviceNodeSpec,
    DevicePluginEndpoint,
    DevicePluginError,
    DevicePluginManager,
    MountSpec,
    PluginDevice,
    socket_name,
)
from dradriver.devices.config import DevicePluginConfig
from dradriver.devices.model import MAX_TAINTS_PER_DEVICE, Device, DeviceTaint
from dradriver.devices.topology import (
    Topology,
    device_topology,
    natural_key,
    preferred_allocation,
)
from dradriver.host.cdi import (
    CDIDevice,
    CDIError,
    CDIRegistry,
    HostDeviceNodeError,
    check_host_device_nodes,
)
from dradriver.host.containeredits import ContainerEdits
from dradriver.host.hooks import Hook, HookError, run_hook
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import (
    ClaimHolder,
    DeviceBusy,
    DeviceRef,
    LedgerError,
    PluginHold,
    PluginHolder,
)
from dradriver.log import get_logger
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.legacy.errors import DevicePluginSetupError
from kubeletplugin.legacy.podresources import Assignment
from kubeletplugin.metrics import PluginMetrics

log = get_logger("kubeletplugin.deviceplugin")

CDI_CLASS = "deviceplugin"
HELD_TAINT_NAME = "held-by-device-plugin"
# Allocate names devices, not containers; pod-resources tells us the container later.
UNKNOWN_CONTAINER = "unknown"


def held_taint_key(driver: str) -> str:
    return f"{driver}/{HELD_TAINT_NAME}"


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
    ) -> None:
        self.config = config
        self.driver_name = driver_name
        self.inventory = inventory
        self.ledger = ledger
        self.cdi = CDIRegistry(cdi_dir, driver_name, CDI_CLASS)
        self.metrics = metrics or PluginMetrics()
        self.pre_start_hook: Hook | None = None
        if config.pre_start is not None:
            self.pre_start_hook = Hook(
                "preStart",
                command=tuple(config.pre_start.command or ()),
                python=config.pre_start.python or "",
                timeout=config.pre_start_timeout,
            )
        self.backends = [ResourceBackend(self, r.resource_name) for r in config.resources]
        endpoints = [
            DevicePluginEndpoint(b, plugin_dir, socket_name(b.resource_name, instance, plugin_dir))
            for b in self.backends
        ]
        self.manager = DevicePluginManager(plugin_dir, endpoints, watch_interval=watch_interval)
        self.manager.on_registered = self._registered
        for e in endpoints:
            e.service.on_call = self._rpc_observer(e.resource_name)
        # Called when the devices DRA must not use change (shared mode): republish slices.
        self.on_dra_view_change: Callable[[], None] | None = None
        self._in_flight: set[str] = set()
        self._owners: dict[str, Assignment] = {}
        self._hidden_from_dra: frozenset[str] = frozenset()
        self._warned_overlap: set[str] = set()
        # The ledger was lost or corrupt: the first reconcile_cdi rebuilds holds from specs.
        self._rebuild_pending = ledger.needs_rebuild
        self.check_overlaps()

    # ----- devices per resource ------------------------------------------------

    @property
    def pool(self) -> str:
        return self.inventory.pool

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def resource_names(self) -> list[str]:
        return [b.resource_name for b in self.backends]

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

    def _topology(self, names: Collection[str]) -> dict[str, Topology]:
        out = {}
        for name in names:
            device = self.inventory.devices.get(name)
            if device is not None:
                out[name] = device_topology(device, self.driver_name)
        return out

    def _dra_held(self) -> set[str]:
        """Devices a DRA claim uses on this node (admin access does not take a device)."""
        return {
            d.device
            for c in self.ledger.claims()
            for d in c.devices
            if d.pool == self.pool and not d.admin_access
        }

    def _plugin_held(self) -> dict[str, PluginHold]:
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
        dra_held = {
            d.device
            for c in data.claims
            for d in c.devices
            if d.pool == self.pool and not d.admin_access
        }
        plugin_held = {
            r.device for h in data.plugin_holds for r in h.devices if r.pool == self.pool
        }
        holds_per_resource: dict[str, int] = {}
        for h in data.plugin_holds:
            holds_per_resource[h.resource] = holds_per_resource.get(h.resource, 0) + 1
        for resource, devices in self.assignment().items():
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
            self.metrics.dp_holds.labels(resource).set(holds_per_resource.get(resource, 0))
            self.metrics.dp_registered.labels(resource).set(
                1 if endpoint.registered.is_set() else 0
            )
        hidden = frozenset(plugin_held) if self.mode == "shared" else frozenset()
        if hidden != self._hidden_from_dra:
            self._hidden_from_dra = hidden
            if self.on_dra_view_change is not None:
                self.on_dra_view_change()

    def dra_devices(self, devices: Sequence[Device]) -> list[Device]:
        """The devices to publish in the node's ResourceSlices, as this mode dictates."""
        if self.mode == "partitioned":
            return [d for d in devices if self.resource_of(d) is None]
        held = self._plugin_held()
        taint = DeviceTaint(key=held_taint_key(self.driver_name), effect="NoSchedule")
        out = []
        for device in devices:
            if device.name not in held:
                out.append(device)
            elif (
                self.config.hide_from_dra == "taint"
                and len(device.api_taints(self.driver_name)) < MAX_TAINTS_PER_DEVICE
            ):
                out.append(device.model_copy(update={"taints": (*device.taints, taint)}))
        return out

    # ----- the DRA side's questions (kubeletplugin.nodedriver.DRAGate) -----------------

    def refuse_for_dra(self, device: str) -> str | None:
        if self.mode != "partitioned":
            return None
        found = self.inventory.devices.get(device)
        resource = self.resource_of(found) if found is not None else None
        if resource is None:
            return None
        return (
            f"device {self.pool}/{device} is served through the device plugin as {resource} "
            "(devicePlugin.mode: partitioned), so DRA does not prepare it and it is not in this "
            "node's ResourceSlices; delete the claim (or its pod) so the scheduler allocates "
            "another device, or remove the device from devicePlugin.resources"
        )

    def explain_busy(self, error: DeviceBusy) -> str:
        parts = []
        through_plugin = False
        for ref, holders in error.conflicts:
            for holder in holders:
                if isinstance(holder, PluginHolder):
                    through_plugin = True
                    owner = self._owners.get(holder.pod_uid)
                    who = (
                        owner.describe()
                        if owner is not None
                        else f"a container not yet listed by the kubelet (allocation "
                        f"{holder.pod_uid})"
                    )
                    parts.append(
                        f"device {ref} is in use through the device plugin ({holder.resource}) "
                        f"by {who}"
                    )
                else:
                    parts.append(f"device {ref} is held by {holder.describe()}")
        text = f"cannot prepare {error.requester}: " + "; ".join(parts)
        if through_plugin:
            text += (
                "; the kubelet retries, and the claim is prepared once that pod has ended "
                f"(a device in use through the device plugin is tainted "
                f"{held_taint_key(self.driver_name)} in the ResourceSlices; this claim was "
                "allocated before the taint was published)"
            )
        return text

    def claims_changed(self) -> None:
        self.refresh()

    # ----- RPCs ----------------------------------------------------------------

    def preferred(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        topology = self._topology([*available, *must_include])
        return preferred_allocation(available, must_include, size, topology, avoid=self._dra_held())

    def _check_devices(self, resource: str, device_ids: Sequence[str]) -> list[Device]:
        if not device_ids:
            raise DevicePluginError(
                f"Allocate for {resource} names no devices", grpc.StatusCode.INVALID_ARGUMENT
            )
        devices = []
        for device_id in device_ids:
            device = self.inventory.devices.get(device_id)
            if device is None:
                raise DevicePluginError(
                    f"{resource} device {device_id} is not on node {self.pool} any more; the "
                    "kubelet gets the new device list from ListAndWatch, recreate the pod",
                    grpc.StatusCode.NOT_FOUND,
                )
            if self.resource_of(device) != resource:
                raise DevicePluginError(
                    f"device {device_id} does not belong to resource {resource} "
                    "(devicePlugin.resources)",
                    grpc.StatusCode.INVALID_ARGUMENT,
                )
            devices.append(device)
        return devices

    def _busy(self, resource: str, device_ids: Sequence[str], error: DeviceBusy) -> str:
        held = "; ".join(
            f"device {ref} is held by " + "; ".join(h.describe() for h in holders)
            for ref, holders in error.conflicts
        )
        return (
            f"cannot allocate {resource} devices {','.join(device_ids)}: {held}. The kubelet "
            "counted the device as free because the update marking it Unhealthy was still on "
            "its way; this pod fails admission, recreate it (a Deployment or Job does) and "
            "the kubelet picks another device"
        )

    def _begin_hold(self, resource: str, alloc_id: str, refs: list[DeviceRef]) -> None:
        try:
            self.ledger.begin_plugin_hold(resource, alloc_id, UNKNOWN_CONTAINER, refs)
            return
        except DeviceBusy as e:
            busy = e
        # The kubelet gives a device of a resource to one container at a time: a hold of
        # the same resource on a device it hands out again belongs to a container that is
        # gone, whose end the pod-resources poll has not noticed yet. Anything else (a DRA
        # claim, another resource, an Allocate in progress) keeps the device.
        holders = [h for _, hs in busy.conflicts for h in hs]
        if not all(
            isinstance(h, PluginHolder)
            and h.resource == resource
            and h.pod_uid not in self._in_flight
            for h in holders
        ):
            raise busy
        stale = {(h.pod_uid, h.container) for h in holders if isinstance(h, PluginHolder)}
        for pod_uid, container in sorted(stale):
            hold = self.ledger.get_plugin_hold(pod_uid, container)
            if hold is not None:
                self.release(hold, "superseded", "the kubelet gave its devices to a new container")
        self.ledger.begin_plugin_hold(resource, alloc_id, UNKNOWN_CONTAINER, refs)

    def _edits(self, resource: str, alloc_id: str, device: Device) -> ContainerEdits:
        env = {"DRADRIVER_RESOURCE": resource, "DRADRIVER_ALLOCATION": alloc_id}
        return device.edits.merged(ContainerEdits(env=env))

    def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerAllocation:
        """Record the hold, write the CDI spec, answer with CDI IDs and the edits."""
        try:
            devices = self._check_devices(resource, device_ids)
        except DevicePluginError:
            self.metrics.dp_allocation_errors.labels(resource, "invalid").inc()
            raise
        alloc_id = f"alloc-{uuid.uuid4().hex[:12]}"
        cdi_devices = [CDIDevice(d.name, self._edits(resource, alloc_id, d)) for d in devices]
        try:
            check_host_device_nodes(cdi_devices)  # before the hold: nothing to undo
        except HostDeviceNodeError as e:
            self.metrics.dp_allocation_errors.labels(resource, "invalid").inc()
            raise DevicePluginError(
                f"cannot allocate {resource} devices {','.join(device_ids)}: {e}"
            ) from e
        refs = [DeviceRef(pool=self.pool, device=d.name) for d in devices]
        self._in_flight.add(alloc_id)
        try:
            try:
                self._begin_hold(resource, alloc_id, refs)
            except DeviceBusy as e:
                self.metrics.dp_allocation_errors.labels(resource, "busy").inc()
                message = self._busy(resource, device_ids, e)
                log.warning(
                    "Allocate refused: device held through DRA", resource=resource, error=message
                )
                raise DevicePluginError(message) from e
            except LedgerError as e:
                self.metrics.dp_allocation_errors.labels(resource, "internal").inc()
                raise DevicePluginError(
                    f"cannot record the {resource} allocation in the node ledger: {e}",
                    grpc.StatusCode.INTERNAL,
                ) from e
            try:
                ids = self.cdi.write_claim(alloc_id, cdi_devices)
                self.ledger.complete_plugin_hold(alloc_id, UNKNOWN_CONTAINER)
            except (CDIError, OSError, LedgerError) as e:
                self.metrics.dp_allocation_errors.labels(resource, "internal").inc()
                self.cdi.remove_claim(alloc_id)
                self.ledger.release_plugin_hold(alloc_id, UNKNOWN_CONTAINER)
                raise DevicePluginError(
                    f"cannot write the CDI spec for {resource} devices {','.join(device_ids)} "
                    f"in {self.cdi.cdi_dir}: {e}",
                    grpc.StatusCode.INTERNAL,
                ) from e
        finally:
            self._in_flight.discard(alloc_id)
        self.metrics.dp_allocations.labels(resource).inc()
        log.info(
            "allocated through the device plugin",
            resource=resource,
            allocation=alloc_id,
            devices=",".join(device_ids),
        )
        self.refresh()
        edits = ContainerEdits()
        for cdi_device in cdi_devices:
            edits = edits.merged(cdi_device.edits)
        return ContainerAllocation(
            cdi_ids=[ids[d.name] for d in devices],
            envs=dict(edits.env),
            mounts=[
                MountSpec(m.container_path, m.host_path, read_only="ro" in m.options)
                for m in edits.mounts
            ],
            devices=[
                DeviceNodeSpec(n.path, n.host_path or n.path, n.permissions or "rwm")
                for n in edits.device_nodes
            ],
            annotations={f"{self.driver_name}/allocation": alloc_id},
        )

    def _allocation_of(self, resource: str, device_ids: Sequence[str]) -> str:
        wanted = set(device_ids)
        for hold in self.ledger.plugin_holds():
            if hold.resource == resource and wanted <= {r.device for r in hold.devices}:
                return hold.pod_uid
        return ""

    async def pre_start(self, resource: str, device_ids: Sequence[str]) -> None:
        """Run the preStart hook for each device, within the kubelet's deadline."""
        hook = self.pre_start_hook
        if hook is None:
            return
        allocation = self._allocation_of(resource, device_ids)
        base = {
            "DRADRIVER_API": "device-plugin",
            "DRADRIVER_DRIVER": self.driver_name,
            "DRADRIVER_RESOURCE": resource,
            "DRADRIVER_POOL": self.pool,
            "DRADRIVER_DEVICES": ",".join(device_ids),
            "DRADRIVER_ALLOCATION": allocation,
        }
        started = time.monotonic()
        current = ""
        try:
            async with asyncio.timeout(self.config.pre_start_timeout):
                for device_id in device_ids:
                    current = device_id
                    await run_hook(hook, {**base, "DRADRIVER_DEVICE": device_id})
        except (HookError, TimeoutError) as e:
            self.metrics.dp_prestart.labels(resource, "error").inc()
            reason = (
                str(e)
                if isinstance(e, HookError)
                else f"preStart hooks did not finish within {self.config.pre_start_timeout:.0f}s"
            )
            message = (
                f"preStart hook for {resource} device {current} failed, so the container does "
                f"not start: {reason}. The kubelet retries the start with back-off; fix the "
                "device or the hook (devicePlugin.preStart)"
            )
            log.warning(
                "PreStartContainer failed",
                resource=resource,
                devices=",".join(device_ids),
                error=message,
            )
            raise DevicePluginError(message) from e
        self.metrics.dp_prestart.labels(resource, "ok").inc()
        log.info(
            "preStart hook done",
            resource=resource,
            devices=",".join(device_ids),
            allocation=allocation,
            seconds=f"{time.monotonic() - started:.3f}",
        )

    # ----- holds (kubeletplugin.legacy.podresources.HoldKeeper) ------------------------------

    def plugin_holds(self) -> list[PluginHold]:
        return self.ledger.plugin_holds()

    def in_flight(self) -> Collection[str]:
        return set(self._in_flight)

    def observed(self, live: Mapping[str, Assignment]) -> None:
        self._owners = dict(live)

    def owner(self, alloc_id: str) -> Assignment | None:
        return self._owners.get(alloc_id)

    def release(self, hold: PluginHold, kind: str, reason: str) -> None:
        owner = self._owners.pop(hold.pod_uid, None)
        self.cdi.remove_claim(hold.pod_uid)
        self.ledger.release_plugin_hold(hold.pod_uid, hold.container)
        self.metrics.dp_releases.labels(hold.resource, kind).inc()
        log.info(
            "device-plugin hold released",
            resource=hold.resource,
            allocation=hold.pod_uid,
            devices=",".join(r.device for r in hold.devices),
            owner=owner.describe() if owner is not None else "-",
            reason=reason,
        )
        self.refresh()

    def _orphan_spec_for(self, assignment: Assignment) -> str | None:
        """An allocation spec on disk without a hold, for exactly these devices."""
        known = {h.pod_uid for h in self.ledger.plugin_holds()}
        for alloc_id in sorted(self.cdi.claim_uids_on_disk() - known):
            try:
                spec = self.cdi.read_claim(alloc_id)
            except CDIError:
                continue
            prefix = f"{alloc_id}-"
            names = {
                str(d.get("name", "")).removeprefix(prefix) for d in (spec or {}).get("devices", [])
            }
            if names == set(assignment.devices):
                return alloc_id
        return None

    def adopt(self, assignment: Assignment) -> None:
        """Record devices the kubelet reports in use that no hold covers."""
        resource = assignment.resource
        devices = []
        for name in sorted(assignment.devices, key=natural_key):
            device = self.inventory.devices.get(name)
            if device is None or self.resource_of(device) != resource:
                log.warning(
                    "the kubelet reports a device-plugin device this node does not serve",
                    resource=resource,
                    device=name,
                    owner=assignment.describe(),
                )
                continue
            devices.append(device)
        if not devices:
            return
        alloc_id = self._orphan_spec_for(assignment) or f"adopted-{uuid.uuid4().hex[:12]}"
        refs = [DeviceRef(pool=self.pool, device=d.name) for d in devices]
        try:
            self.ledger.begin_plugin_hold(resource, alloc_id, UNKNOWN_CONTAINER, refs)
        except DeviceBusy as e:
            conflicts = " | ".join(
                f"{ref}: " + "; ".join(h.describe() for h in hs) for ref, hs in e.conflicts
            )
            claims = {ref for ref, hs in e.conflicts for h in hs if isinstance(h, ClaimHolder)}
            if not claims:
                # Recorded meanwhile (another plugin instance during a rolling update).
                log.debug("device-plugin assignment already held", conflicts=conflicts)
                return
            self.metrics.dp_conflicts.inc(len(claims))
            log.error(
                "DOUBLE ALLOCATION: a device in use through the device plugin is held by a "
                "DRA claim in the ledger; stop one of the two pods",
                resource=resource,
                owner=assignment.describe(),
                conflicts=conflicts,
            )
            return
        if self.cdi.read_claim(alloc_id) is None:
            self.cdi.write_claim(
                alloc_id, [CDIDevice(d.name, self._edits(resource, alloc_id, d)) for d in devices]
            )
        self.ledger.complete_plugin_hold(alloc_id, UNKNOWN_CONTAINER)
        self._owners[alloc_id] = assignment
        log.warning(
            "adopted a device-plugin assignment the ledger did not record",
            resource=resource,
            allocation=alloc_id,
            owner=assignment.describe(),
            devices=",".join(d.name for d in devices),
        )
        self.refresh()

    def reconcile_cdi(self) -> dict[str, int]:
        """At start: rewrite missing allocation specs (a reboot wipes /var/run/cdi). A spec
        without a hold is deleted, unless the ledger was lost: then the spec is what
        survives of an allocation a container may use, and its hold is rebuilt from it."""
        counts = {"holds": 0, "regenerated": 0, "rebuilt": 0, "orphans": 0}
        holds = self.ledger.plugin_holds()
        for hold in holds:
            counts["holds"] += 1
            if self.cdi.read_claim(hold.pod_uid) is not None:
                continue
            devices = [self.inventory.devices.get(r.device) for r in hold.devices]
            present = [d for d in devices if d is not None]
            if not present:
                continue
            self.cdi.write_claim(
                hold.pod_uid,
                [CDIDevice(d.name, self._edits(hold.resource, hold.pod_uid, d)) for d in present],
            )
            counts["regenerated"] += 1
        orphans = self.cdi.claim_uids_on_disk() - {h.pod_uid for h in holds}
        rebuild, self._rebuild_pending = self._rebuild_pending, False
        for alloc_id in sorted(orphans):
            if not rebuild:
                self.cdi.remove_claim(alloc_id)
                counts["orphans"] += 1
            elif self._rebuild_hold(alloc_id):
                counts["rebuilt"] += 1
        log.info("reconciled device-plugin state", **counts)
        return counts

    def _rebuild_hold(self, alloc_id: str) -> bool:
        """Hold the devices an allocation spec names (``<alloc id>-<device>``, with the
        resource in DRADRIVER_RESOURCE); the pod-resources poll releases the hold once no
        container reports them."""
        try:
            spec = self.cdi.read_claim(alloc_id)
        except CDIError as e:
            log.warning("keeping an unreadable allocation spec", allocation=alloc_id, error=str(e))
            return False
        resources: set[str] = set()
        refs: list[DeviceRef] = []
        for item in (spec or {}).get("devices", []):
            env = item.get("containerEdits", {}).get("env", [])
            resources.update(e.split("=", 1)[1] for e in env if e.startswith("DRADRIVER_RESOURCE="))
            name = str(item.get("name", "")).removeprefix(f"{alloc_id}-")
            refs.append(DeviceRef(pool=self.pool, device=name))
        if len(resources) != 1 or not resources <= set(self.resource_names):
            log.warning(
                "keeping an allocation spec of no resource served here", allocation=alloc_id
            )
            return False
        try:
            self.ledger.begin_plugin_hold(resources.pop(), alloc_id, UNKNOWN_CONTAINER, refs)
        except (DeviceBusy, LedgerError) as e:
            self.metrics.dp_conflicts.inc()
            log.error(
                "DOUBLE ALLOCATION: an allocation spec names a device someone else holds",
                allocation=alloc_id,
                error=str(e),
            )
            return False
        self.ledger.complete_plugin_hold(alloc_id, UNKNOWN_CONTAINER)
        log.warning("rebuilt a device-plugin hold from its CDI spec", allocation=alloc_id)
        return True

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
