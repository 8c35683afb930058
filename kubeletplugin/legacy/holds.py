"""The device-plugin holds in the node ledger once Allocate has taken them.

The device-plugin API has no deallocate call, so this is the shim's side of
:class:`kubeletplugin.legacy.podresources.HoldReconciler`: it releases a hold whose
container is gone, adopts what the kubelet reports in use that no hold covers, remembers
which container owns which allocation (for messages), and at start makes the allocation
specs on disk and the holds in the ledger agree.

Invariants:

* a hold is released with its spec, never one without the other;
* adoption never takes a device from a DRA claim: that is a double allocation, reported
  loudly (``dradriver_deviceplugin_conflicts_total``) and left alone;
* a spec without a hold is deleted, unless the ledger was lost or corrupt: then the spec
  is what survives of an allocation a container may use, and its hold is rebuilt from it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from dradriver.devices.topology import natural_key
from dradriver.host.cdi import CDIError, CDIRegistry
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import ClaimHolder, DeviceBusy, DeviceRef, LedgerError, PluginHold
from dradriver.log import get_logger
from kubeletplugin.legacy.allocspec import allocation_devices, spec_device_names, spec_resources
from kubeletplugin.legacy.podresources import Assignment
from kubeletplugin.legacy.served import ServedDevices
from kubeletplugin.metrics import PluginMetrics

log = get_logger("kubeletplugin.deviceplugin")

# Allocate names devices, not containers; pod-resources tells us the container later.
UNKNOWN_CONTAINER = "unknown"


class PluginHolds:
    """Releases, adopts and rebuilds the shim's holds; knows each allocation's owner."""

    def __init__(
        self, served: ServedDevices, ledger: Ledger, cdi: CDIRegistry, metrics: PluginMetrics
    ) -> None:
        self.served = served
        self.ledger = ledger
        self.cdi = cdi
        self.metrics = metrics
        self._owners: dict[str, Assignment] = {}
        # The ledger was lost or corrupt: the first reconcile_cdi rebuilds holds from specs.
        self._rebuild_pending = ledger.needs_rebuild

    def plugin_holds(self) -> list[PluginHold]:
        return self.ledger.plugin_holds()

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
        self.served.refresh()

    # ----- adoption -------------------------------------------------------------

    def _orphan_spec_for(self, assignment: Assignment) -> str | None:
        """An allocation spec on disk without a hold, for exactly these devices."""
        known = {h.pod_uid for h in self.ledger.plugin_holds()}
        for alloc_id in sorted(self.cdi.claim_uids_on_disk() - known):
            try:
                spec = self.cdi.read_claim(alloc_id)
            except CDIError:
                continue
            if set(spec_device_names(spec, alloc_id)) == set(assignment.devices):
                return alloc_id
        return None

    def adopt(self, assignment: Assignment) -> None:
        """Record devices the kubelet reports in use that no hold covers."""
        resource = assignment.resource
        devices = []
        for name in sorted(assignment.devices, key=natural_key):
            device = self.served.inventory.devices.get(name)
            if device is None or self.served.resource_of(device) != resource:
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
        refs = [DeviceRef(pool=self.served.pool, device=d.name) for d in devices]
        try:
            self.ledger.begin_plugin_hold(resource, alloc_id, UNKNOWN_CONTAINER, refs)
        except DeviceBusy as e:
            self._adoption_refused(assignment, e)
            return
        if self.cdi.read_claim(alloc_id) is None:
            self.cdi.write_claim(alloc_id, allocation_devices(resource, alloc_id, devices))
        self.ledger.complete_plugin_hold(alloc_id, UNKNOWN_CONTAINER)
        self._owners[alloc_id] = assignment
        log.warning(
            "adopted a device-plugin assignment the ledger did not record",
            resource=resource,
            allocation=alloc_id,
            owner=assignment.describe(),
            devices=",".join(d.name for d in devices),
        )
        self.served.refresh()

    def _adoption_refused(self, assignment: Assignment, error: DeviceBusy) -> None:
        conflicts = " | ".join(
            f"{ref}: " + "; ".join(h.describe() for h in hs) for ref, hs in error.conflicts
        )
        claims = {ref for ref, hs in error.conflicts for h in hs if isinstance(h, ClaimHolder)}
        if not claims:
            # Recorded meanwhile (another plugin instance during a rolling update).
            log.debug("device-plugin assignment already held", conflicts=conflicts)
            return
        self.metrics.dp_conflicts.inc(len(claims))
        log.error(
            "DOUBLE ALLOCATION: a device in use through the device plugin is held by a "
            "DRA claim in the ledger; stop one of the two pods",
            resource=assignment.resource,
            owner=assignment.describe(),
            conflicts=conflicts,
        )

    # ----- allocation specs at start ----------------------------------------------

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
            devices = [self.served.inventory.devices.get(r.device) for r in hold.devices]
            present = [d for d in devices if d is not None]
            if not present:
                continue
            self.cdi.write_claim(
                hold.pod_uid, allocation_devices(hold.resource, hold.pod_uid, present)
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
        resources = spec_resources(spec)
        refs = [
            DeviceRef(pool=self.served.pool, device=name)
            for name in spec_device_names(spec, alloc_id)
        ]
        if len(resources) != 1 or not resources <= set(self.served.resource_names):
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
