"""A shared host device as the scheduler sees it: one device with capacity, or N slots.

Invariants: with ``share: N`` a device is usable by N claims at once, both ways:

* where the cluster keeps consumable capacity (the start-up probe's ``consumable
  capacity`` feature is not missing): ONE device with ``allowMultipleAllocations: true``
  and a capacity ``slots`` of N, each claim taking 1 (request policy default 1);
* elsewhere: N interchangeable devices ``<name>-0`` .. ``<name>-<N-1>``, each with the
  same container edits (the same host node), an int attribute ``slot`` and a string
  attribute ``hostDevice`` naming the device they are slots of.

Without ``share`` a device is exclusive and published as it is. Pure: no I/O.
"""

from __future__ import annotations

from dradriver.devices.attributes import IntAttribute, StringAttribute
from dradriver.devices.hostdev.config import HOST_DEVICE_ATTRIBUTE, SLOT_ATTRIBUTE, SLOTS_CAPACITY
from dradriver.devices.model import Capacity, CapacityRequestPolicy, Device


def slot_name(device: str, slot: int) -> str:
    return f"{device}-{slot}"


def shared_device(device: Device, share: int) -> Device:
    """The one device with ``share`` slots of consumable capacity."""
    slots = Capacity(value=str(share), request_policy=CapacityRequestPolicy(default="1"))
    return Device.model_validate(
        {
            **dict(device),
            "capacity": {**device.capacity, SLOTS_CAPACITY: slots},
            "allow_multiple_allocations": True,
        }
    )


def slot_devices(device: Device, share: int) -> list[Device]:
    """``share`` devices standing for the same host device (the names fit: see config)."""
    host_device = StringAttribute(value=device.name)
    return [
        device.model_copy(
            update={
                "name": slot_name(device.name, slot),
                "attributes": {
                    **device.attributes,
                    SLOT_ATTRIBUTE: IntAttribute(value=slot),
                    HOST_DEVICE_ATTRIBUTE: host_device,
                },
            }
        )
        for slot in range(share)
    ]


def publish(device: Device, share: int | None, consumable_capacity: bool) -> list[Device]:
    """What to publish for ``device`` of a profile with ``share`` (None: exclusive)."""
    if share is None:
        return [device]
    if consumable_capacity:
        return [shared_device(device, share)]
    return slot_devices(device, share)
