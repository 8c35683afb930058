"""Allocate, PreStartContainer and GetPreferredAllocation of the device-plugin shim.

Invariants:

* Allocate takes a ledger hold for the named devices under a fresh allocation ID before
  it writes the allocation's CDI spec, and undoes both when either fails: the kubelet
  never gets an answer for devices the ledger does not hold;
* a hold is never taken over from a DRA claim, from another resource, or from an
  Allocate still in flight; only a hold of the same resource, whose container must be
  gone because the kubelet hands that device out again, is released ("superseded");
* a refusal names the devices and the holder, and says what to do.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Collection, Sequence

import grpc

from dradriver.deviceplugin.server import (
    ContainerAllocation,
    DeviceNodeSpec,
    DevicePluginError,
    MountSpec,
)
from dradriver.devices.config import DevicePluginConfig
from dradriver.devices.model import Device
from dradriver.devices.topology import preferred_allocation
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
from dradriver.host.state.schema import DeviceBusy, DeviceRef, LedgerError, PluginHolder
from dradriver.log import get_logger
from kubeletplugin.legacy.allocspec import allocation_devices
from kubeletplugin.legacy.holds import UNKNOWN_CONTAINER, PluginHolds
from kubeletplugin.legacy.served import ServedDevices
from kubeletplugin.metrics import PluginMetrics

log = get_logger("kubeletplugin.deviceplugin")


def pre_start_hook(config: DevicePluginConfig) -> Hook | None:
    """The ``devicePlugin.preStart`` hook, if one is configured."""
    if config.pre_start is None:
        return None
    return Hook(
        "preStart",
        command=tuple(config.pre_start.command or ()),
        python=config.pre_start.python or "",
        timeout=config.pre_start_timeout,
    )


def busy_message(resource: str, device_ids: Sequence[str], error: DeviceBusy) -> str:
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


def container_allocation(
    driver_name: str,
    alloc_id: str,
    cdi_devices: Sequence[CDIDevice],
    cdi_ids: Sequence[str],
) -> ContainerAllocation:
    """The Allocate answer: the CDI IDs plus the same edits spelled out directly."""
    edits = ContainerEdits()
    for cdi_device in cdi_devices:
        edits = edits.merged(cdi_device.edits)
    return ContainerAllocation(
        cdi_ids=list(cdi_ids),
        envs=dict(edits.env),
        mounts=[
            MountSpec(m.container_path, m.host_path, read_only="ro" in m.options)
            for m in edits.mounts
        ],
        devices=[
            DeviceNodeSpec(n.path, n.host_path or n.path, n.permissions or "rwm")
            for n in edits.device_nodes
        ],
        annotations={f"{driver_name}/allocation": alloc_id},
    )


class Allocations:
    """The device-plugin RPCs that hand out devices, for every resource of the shim."""

    def __init__(
        self,
        *,
        served: ServedDevices,
        holds: PluginHolds,
        cdi: CDIRegistry,
        metrics: PluginMetrics,
        hook: Hook | None,
    ) -> None:
        self.served = served
        self.holds = holds
        self.ledger: Ledger = holds.ledger
        self.cdi = cdi
        self.metrics = metrics
        self.hook = hook
        self._in_flight: set[str] = set()

    def in_flight(self) -> Collection[str]:
        """Allocation IDs whose Allocate has not finished (their holds are not stale)."""
        return set(self._in_flight)

    def preferred(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        topology = self.served.topology([*available, *must_include])
        return preferred_allocation(
            available, must_include, size, topology, avoid=self.served.dra_held()
        )

    # ----- Allocate -------------------------------------------------------------

    def _check_devices(self, resource: str, device_ids: Sequence[str]) -> list[Device]:
        if not device_ids:
            raise DevicePluginError(
                f"Allocate for {resource} names no devices", grpc.StatusCode.INVALID_ARGUMENT
            )
        devices = []
        for device_id in device_ids:
            device = self.served.inventory.devices.get(device_id)
            if device is None:
                raise DevicePluginError(
                    f"{resource} device {device_id} is not on node {self.served.pool} any "
                    "more; the kubelet gets the new device list from ListAndWatch, recreate "
                    "the pod",
                    grpc.StatusCode.NOT_FOUND,
                )
            if self.served.resource_of(device) != resource:
                raise DevicePluginError(
                    f"device {device_id} does not belong to resource {resource} "
                    "(devicePlugin.resources)",
                    grpc.StatusCode.INVALID_ARGUMENT,
                )
            devices.append(device)
        return devices

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
                self.holds.release(
                    hold, "superseded", "the kubelet gave its devices to a new container"
                )
        self.ledger.begin_plugin_hold(resource, alloc_id, UNKNOWN_CONTAINER, refs)

    def _checked(self, resource: str, device_ids: Sequence[str], alloc_id: str) -> list[CDIDevice]:
        """The allocation's spec devices, refused before any hold if one is unusable."""
        try:
            devices = self._check_devices(resource, device_ids)
        except DevicePluginError:
            self.metrics.dp_allocation_errors.labels(resource, "invalid").inc()
            raise
        cdi_devices = allocation_devices(resource, alloc_id, devices)
        try:
            check_host_device_nodes(cdi_devices)  # before the hold: nothing to undo
        except HostDeviceNodeError as e:
            self.metrics.dp_allocation_errors.labels(resource, "invalid").inc()
            raise DevicePluginError(
                f"cannot allocate {resource} devices {','.join(device_ids)}: {e}"
            ) from e
        return cdi_devices

    def _record(
        self,
        resource: str,
        device_ids: Sequence[str],
        alloc_id: str,
        cdi_devices: Sequence[CDIDevice],
    ) -> dict[str, str]:
        """Take the hold, then write the spec; undo both on failure. The spec's CDI IDs."""
        refs = [DeviceRef(pool=self.served.pool, device=d.name) for d in cdi_devices]
        try:
            self._begin_hold(resource, alloc_id, refs)
        except DeviceBusy as e:
            self.metrics.dp_allocation_errors.labels(resource, "busy").inc()
            message = busy_message(resource, device_ids, e)
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
        return ids

    def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerAllocation:
        """Record the hold, write the CDI spec, answer with CDI IDs and the edits."""
        alloc_id = f"alloc-{uuid.uuid4().hex[:12]}"
        cdi_devices = self._checked(resource, device_ids, alloc_id)
        self._in_flight.add(alloc_id)
        try:
            ids = self._record(resource, device_ids, alloc_id, cdi_devices)
        finally:
            self._in_flight.discard(alloc_id)
        self.metrics.dp_allocations.labels(resource).inc()
        log.info(
            "allocated through the device plugin",
            resource=resource,
            allocation=alloc_id,
            devices=",".join(device_ids),
        )
        self.served.refresh()
        return container_allocation(
            self.served.driver_name, alloc_id, cdi_devices, [ids[d.name] for d in cdi_devices]
        )

    # ----- PreStartContainer -------------------------------------------------------

    def _allocation_of(self, resource: str, device_ids: Sequence[str]) -> str:
        wanted = set(device_ids)
        for hold in self.ledger.plugin_holds():
            if hold.resource == resource and wanted <= {r.device for r in hold.devices}:
                return hold.pod_uid
        return ""

    async def pre_start(self, resource: str, device_ids: Sequence[str]) -> None:
        """Run the preStart hook for each device, within the kubelet's deadline."""
        hook = self.hook
        if hook is None:
            return
        allocation = self._allocation_of(resource, device_ids)
        base = {
            "DRADRIVER_API": "device-plugin",
            "DRADRIVER_DRIVER": self.served.driver_name,
            "DRADRIVER_RESOURCE": resource,
            "DRADRIVER_POOL": self.served.pool,
            "DRADRIVER_DEVICES": ",".join(device_ids),
            "DRADRIVER_ALLOCATION": allocation,
        }
        timeout = self.served.config.pre_start_timeout
        started = time.monotonic()
        current = ""
        try:
            async with asyncio.timeout(timeout):
                for device_id in device_ids:
                    current = device_id
                    await run_hook(hook, {**base, "DRADRIVER_DEVICE": device_id})
        except (HookError, TimeoutError) as e:
            self.metrics.dp_prestart.labels(resource, "error").inc()
            reason = (
                str(e)
                if isinstance(e, HookError)
                else f"preStart hooks did not finish within {timeout:.0f}s"
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
