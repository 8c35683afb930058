"""What DRA asks the device-plugin shim before and after it prepares a claim.

The answers of :class:`kubeletplugin.nodedriver.DRAGate`. Invariants: in ``partitioned``
mode DRA never prepares a device a resource serves (in any mode, one a resource named in
``partitioned`` serves); in ``shared`` mode the ledger decides,
and a refusal names the pod that holds the device through the device plugin when the
kubelet has reported it (the allocation ID otherwise); every prepare or unprepare makes
the device plugin's lists current again.
"""

from __future__ import annotations

from dradriver.host.state.schema import DeviceBusy, DeviceRef, PluginHolder
from kubeletplugin.legacy.holds import PluginHolds
from kubeletplugin.legacy.served import ServedDevices, held_taint_key


def partitioned_refusal(
    pool: str, device: str, resource: str, why: str = "devicePlugin.mode: partitioned"
) -> str:
    return (
        f"device {pool}/{device} is served through the device plugin as {resource} "
        f"({why}), so DRA does not prepare it and it is not in this "
        "node's ResourceSlices; delete the claim (or its pod) so the scheduler allocates "
        "another device, or remove the device from devicePlugin.resources"
    )


EXTENDED_RESOURCE_REFUSAL = (
    "a host profile's extendedResourceName, served by the device plugin on this node"
)


class DRAGateAnswers:
    """The shim's side of the one ledger both APIs share, as DRA sees it."""

    def __init__(self, served: ServedDevices, holds: PluginHolds) -> None:
        self.served = served
        self.holds = holds

    def refuse_for_dra(self, device: str) -> str | None:
        if self.served.mode != "partitioned" and not self.served.partitioned:
            return None
        found = self.served.inventory.devices.get(device)
        resource = self.served.resource_of(found) if found is not None else None
        if resource is None or not self.served.is_partitioned(resource):
            return None
        if self.served.mode == "partitioned":
            return partitioned_refusal(self.served.pool, device, resource)
        return partitioned_refusal(self.served.pool, device, resource, EXTENDED_RESOURCE_REFUSAL)

    def _plugin_holder(self, ref: DeviceRef, holder: PluginHolder) -> str:
        owner = self.holds.owner(holder.pod_uid)
        who = (
            owner.describe()
            if owner is not None
            else f"a container not yet listed by the kubelet (allocation {holder.pod_uid})"
        )
        return f"device {ref} is in use through the device plugin ({holder.resource}) by {who}"

    def explain_busy(self, error: DeviceBusy) -> str:
        parts = []
        through_plugin = False
        for ref, holders in error.conflicts:
            for holder in holders:
                if isinstance(holder, PluginHolder):
                    through_plugin = True
                    parts.append(self._plugin_holder(ref, holder))
                else:
                    parts.append(f"device {ref} is held by {holder.describe()}")
        text = f"cannot prepare {error.requester}: " + "; ".join(parts)
        if through_plugin:
            text += (
                "; the kubelet retries, and the claim is prepared once that pod has ended "
                f"(a device in use through the device plugin is tainted "
                f"{held_taint_key(self.served.driver_name)} in the ResourceSlices; this claim "
                "was allocated before the taint was published)"
            )
        return text

    def claims_changed(self) -> None:
        self.served.refresh()
