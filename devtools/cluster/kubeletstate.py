"""Read what the kubelet recorded about prepared claims (its DRA checkpoint).

Tests and the demo use it to see what a container would get: the fake runtime
applies nothing, so the CDI IDs the kubelet stored are resolved against the
spec files the driver wrote.
"""

from __future__ import annotations

import json
from pathlib import Path


def kubelet_cdi_ids(
    kubelet_root: Path, claim_uid: str, driver: str, with_metadata: bool = False
) -> list[str]:
    """The CDI IDs the kubelet stored for ``driver``'s devices of a claim ([] if none);
    without the device-metadata mounts (kind ``<driver>/metadata``) unless asked for."""
    try:
        outer = json.loads((kubelet_root / "dra_manager_state").read_text())
    except FileNotFoundError:
        return []
    for info in json.loads(outer["Data"])["ClaimInfoStateList"]:
        if info["ClaimUID"] == claim_uid:
            devices = info.get("DriverState", {}).get(driver, {}).get("Devices") or []
            # Pods sharing a claim that start together can make the kubelet record the
            # same device twice; the runtime applies a CDI device once, so dedupe.
            ids = [cdi_id for d in devices for cdi_id in d.get("CDIDeviceIDs") or []]
            if not with_metadata:
                ids = [i for i in ids if not i.startswith(f"{driver}/metadata=")]
            return list(dict.fromkeys(ids))
    return []


def device_plugin_devices(kubelet_root: Path, pod_uid: str, resource: str) -> list[str]:
    """Device IDs the kubelet's device manager assigned to a pod for ``resource``.

    The device manager's checkpoint sits under /var/lib/kubelet/device-plugins
    whatever the kubelet's root dir; ``kubelet_root`` is that of node-1.
    """
    try:
        outer = json.loads(
            (kubelet_root / "device-plugins" / "kubelet_internal_checkpoint").read_text()
        )
    except FileNotFoundError:
        return []
    ids: list[str] = []
    for entry in outer["Data"].get("PodDeviceEntries") or []:
        if entry["PodUID"] == pod_uid and entry["ResourceName"] == resource:
            for per_numa in (entry.get("DeviceIDs") or {}).values():
                ids.extend(per_numa)
    return sorted(set(ids))
