"""The example workload the demo and the cluster tests apply.

A DeviceClass selecting this driver's devices, a node-local ResourceSlice with
a few devices, a ResourceClaimTemplate asking for one device and a Pod using
it. Until the kubelet plugin runs, the slice is published by the caller.
"""

from __future__ import annotations

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def device_class(name: str, driver: str = DEFAULT_DRIVER_NAME) -> Obj:
    return {
        "apiVersion": RESOURCE_V1,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def node_slice(
    node: str, devices: int, driver: str = DEFAULT_DRIVER_NAME, generation: int = 1
) -> Obj:
    return {
        "apiVersion": RESOURCE_V1,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-example"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"dev-{i}",
                    # The driver's own names without its domain, as the 1.38 helper wants.
                    "attributes": {"model": {"string": "example"}, "index": {"int": i}},
                    "capacity": {"memory": {"value": "1Gi"}},
                }
                for i in range(devices)
            ],
        },
    }


def claim_template(name: str, namespace: str, class_name: str) -> Obj:
    return {
        "apiVersion": RESOURCE_V1,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "dev", "exactly": {"deviceClassName": class_name}}]
                }
            }
        },
    }


def pod_with_template(name: str, namespace: str, template: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
            "containers": [
                {"name": "ctr", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "dev"}]}}
            ],
        },
    }


def pod_claim_name(pod: Obj, claim: str = "dev") -> str | None:
    """The name of the ResourceClaim the resourceclaim controller made for ``pod``."""
    for status in pod.get("status", {}).get("resourceClaimStatuses", []):
        if status.get("name") == claim:
            name: str | None = status.get("resourceClaimName")
            return name
    return None


def allocated_devices(claim: Obj) -> list[tuple[str, str, str]]:
    """``(driver, pool, device)`` of each allocated device, empty if not allocated."""
    allocation = claim.get("status", {}).get("allocation") or {}
    return [
        (r["driver"], r["pool"], r["device"])
        for r in allocation.get("devices", {}).get("results", [])
    ]
