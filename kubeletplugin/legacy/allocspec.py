"""The CDI spec of one device-plugin allocation: what the shim writes, and reads back.

Invariants: the spec's kind is ``<driver>/deviceplugin`` (:data:`CDI_CLASS`), so it can
never collide with a claim's spec; the spec is named by the allocation ID; each device in
it is named ``<allocation id>-<device>`` and carries ``DRADRIVER_RESOURCE`` and
``DRADRIVER_ALLOCATION`` in its environment. Those names and that variable are all a lost
ledger can rebuild a hold from, so what is written here and what is read back here stay
in step. Pure: the files themselves are :class:`~dradriver.host.cdi.CDIRegistry`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dradriver.devices.model import Device
from dradriver.host.cdi import CDIDevice
from dradriver.host.containeredits import ContainerEdits

CDI_CLASS = "deviceplugin"
RESOURCE_ENV = "DRADRIVER_RESOURCE"


def allocation_edits(resource: str, alloc_id: str, device: Device) -> ContainerEdits:
    """The device's own edits plus the variables naming the resource and the allocation."""
    env = {RESOURCE_ENV: resource, "DRADRIVER_ALLOCATION": alloc_id}
    return device.edits.merged(ContainerEdits(env=env))


def allocation_devices(resource: str, alloc_id: str, devices: Iterable[Device]) -> list[CDIDevice]:
    """The spec's devices for ``devices`` held as ``resource`` under ``alloc_id``."""
    return [CDIDevice(d.name, allocation_edits(resource, alloc_id, d)) for d in devices]


def spec_device_names(spec: dict[str, Any] | None, alloc_id: str) -> list[str]:
    """The node's device names a spec covers, in spec order (the ``<alloc id>-`` cut off)."""
    prefix = f"{alloc_id}-"
    items = (spec or {}).get("devices", [])
    return [str(item.get("name", "")).removeprefix(prefix) for item in items]


def spec_resources(spec: dict[str, Any] | None) -> set[str]:
    """The resources a spec's devices name in ``DRADRIVER_RESOURCE`` (one, when it is ours)."""
    resources: set[str] = set()
    for item in (spec or {}).get("devices", []):
        env = item.get("containerEdits", {}).get("env", [])
        resources.update(e.split("=", 1)[1] for e in env if e.startswith(f"{RESOURCE_ENV}="))
    return resources
