"""Fence claims: repair kube-scheduler's allocated-device set after a double allocation.

Why
---
kube-scheduler (1.36) keeps the devices it considers allocated in a plain *set* fed by
its claim informer: a device is added when a claim's ``status.allocation`` goes
nil→set and removed when it goes set→nil or the claim is deleted. It does not count
holders. So when two claims hold device D at once (the controller wrote D into claim A
while the scheduler wrote it into claim B, see
:mod:`controller.claims.conflicts`) and either one lets go, the
scheduler drops D from its set although the other claim still holds D, and may hand D
out a third time.

A *fence* is a ResourceClaim in the controller's own namespace, allocated to D and to
nothing else. Its nil→set transition, written *after* the removal, makes the scheduler
add D back. The fence is no consumer: no pod references it, it only repairs the set.

Rules (level-based, so a restarted controller reconciles the fences it finds):

* A removal of D (any claim's allocation set→nil, or its deletion, seen at resourceVersion
  R) while another real (non-fence) claim still holds D *marks* D: the fence of D must
  have been allocated at a resourceVersion after R. Missing fence → create it and write
  its allocation; fence allocated before R → clear and re-write its allocation (a new
  nil→set); pending fence (created, allocation not written yet) → write it.
* A fence is deleted only when no real claim holds its device any more: then the
  scheduler forgetting D is right. If meanwhile a different claim took D, the fence is
  kept (it now guards that claim). If a claim takes D in the instant before the delete
  lands, the delete is itself a removal seen by the informer after that allocation, so it
  marks D again and the fence comes back.
* Fences never conflict: the controller never gives an allocation back because of a
  fence, but its allocator counts fenced devices as taken (fences are in the claims
  informer like any claim, so :class:`~dradriver.allocator.AllocatedState` holds them).

With ``--allocation-namespace`` a controller only manages fences guarding claims in
its namespaces (the holder annotation), so controllers for disjoint namespace sets do
not fight over one fence (in a deployment only the leader runs, with every namespace).

One fence per device (``dradriver-fence-<hash of driver/pool/device>``), so creating it
is idempotent and it is deleted as soon as that device is free. Only exclusively held
devices are fenced (admin access and shares of multi-allocatable devices are not in
the scheduler's set). The residual risk: between the removal and the fence's allocation
write (milliseconds) a scheduling cycle can still pick D; and marks are kept in memory,
so a controller that crashes in that window leaves the set un-repaired.

Everything here is pure (no I/O); :mod:`controller.claims.fence_lifecycle` does the API calls.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from controller.resourceclaims import FENCE_LABEL as FENCE_LABEL
from controller.resourceclaims import is_fence as is_fence
from dradriver.allocator import AllocatedState, DeviceID
from dradriver.k8s.objects import Obj, allocation_of, annotations_of, meta, revision

HOLDER_ANNOTATION = "dradriver.dev/fence-holder"
"""The claim (``namespace/name``) the fence was created to guard."""
DEVICES_ANNOTATION = "dradriver.dev/fence-devices"
"""JSON list of ``[driver, pool, device]`` the fence holds."""
NAME_PREFIX = "dradriver-fence-"
REQUEST = "fence"
DEVICE_CLASS = "dradriver-fence"
"""Never has to exist: no one allocates a fence's request but the controller."""


def fence_name(device: DeviceID) -> str:
    digest = hashlib.sha256("/".join(device).encode()).hexdigest()[:16]
    return NAME_PREFIX + digest


def fence_key(namespace: str, device: DeviceID) -> str:
    return f"{namespace}/{fence_name(device)}"


def is_fence_key(namespace: str, key: str) -> bool:
    """Whether ``key`` names a fence of ours (the name alone; see :func:`is_fence`)."""
    ns, _, name = key.partition("/")
    return ns == namespace and name.startswith(NAME_PREFIX)


def allocated(claim: Mapping[str, Any] | None) -> bool:
    return claim is not None and allocation_of(claim) is not None


def exclusive(allocation: Mapping[str, Any] | None) -> list[DeviceID]:
    """Devices ``allocation`` takes exclusively (what the scheduler's set tracks)."""
    out: list[DeviceID] = []
    for r in ((allocation or {}).get("devices") or {}).get("results") or []:
        if r.get("adminAccess") or r.get("shareID"):
            continue
        out.append((str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))))
    return out


def fence_devices(claim: Mapping[str, Any]) -> list[DeviceID]:
    """The devices a fence holds (its annotation, so also before its allocation is written)."""
    raw = annotations_of(claim).get(DEVICES_ANNOTATION)
    if raw:
        try:
            return [(str(d[0]), str(d[1]), str(d[2])) for d in json.loads(raw)]
        except (ValueError, TypeError, IndexError, KeyError):
            pass
    return exclusive(allocation_of(claim))


def new_fence(namespace: str, devices: Iterable[DeviceID], holder: str) -> Obj:
    """The fence ResourceClaim (no status: that is a separate write)."""
    devs = sorted(set(devices))
    if not devs:
        raise ValueError("a fence holds at least one device")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": fence_name(devs[0]) if len(devs) == 1 else _multi_name(devs),
            "namespace": namespace,
            "labels": {FENCE_LABEL: "true"},
            "annotations": {
                HOLDER_ANNOTATION: holder,
                DEVICES_ANNOTATION: json.dumps([list(d) for d in devs]),
            },
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": REQUEST,
                        "exactly": {
                            "deviceClassName": DEVICE_CLASS,
                            "allocationMode": "ExactCount",
                            "count": len(devs),
                        },
                    }
                ]
            }
        },
    }


def _multi_name(devices: list[DeviceID]) -> str:
    joined = "\n".join("/".join(d) for d in devices)
    return NAME_PREFIX + hashlib.sha256(joined.encode()).hexdigest()[:16]


def fence_allocation(devices: Iterable[DeviceID], node_selector: Obj | None, now: str) -> Obj:
    """The AllocationResult of a fence: its devices, the guarded claim's node selector."""
    allocation: Obj = {
        "devices": {
            "results": [
                {"request": REQUEST, "driver": d[0], "pool": d[1], "device": d[2]}
                for d in sorted(set(devices))
            ]
        },
        "allocationTimestamp": now,
    }
    if node_selector:
        allocation["nodeSelector"] = node_selector
    return allocation


def real_holders(
    device: DeviceID, state: AllocatedState, fence: Callable[[str], bool]
) -> list[str]:
    """Claims holding ``device`` exclusively that are not fences."""
    return [h for h in state.dedicated.get(device, []) if not fence(h)]


def removed_devices(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[DeviceID]:
    """Devices the scheduler drops from its set on this informer event (old → new).

    ``new`` is None for a deletion. Only set→nil (or deletion of an allocated claim)
    removes: an allocation is immutable until cleared.
    """
    if old is None:
        return []
    before = allocation_of(old)
    if not before:
        return []
    if new is not None and allocation_of(new):
        return []
    return exclusive(before)


class Action(Enum):
    NONE = "none"
    CREATE = "create"  # create the fence, then write its allocation
    ALLOCATE = "allocate"  # the fence exists without allocation: write it
    PULSE = "pulse"  # allocated before the last removal: clear and write again
    DELETE = "delete"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def decide(fence: Mapping[str, Any] | None, holders: list[str], mark: int) -> Decision:
    """What to do with the fence of one device.

    ``fence`` is the fence as the API server has it now (None: it does not exist),
    ``holders`` the real claims holding the device, ``mark`` the resourceVersion of the
    last removal of the device while another claim held it (0: none known).
    """
    if not holders:
        if fence is None:
            return Decision(Action.NONE, "no claim holds the device")
        return Decision(Action.DELETE, "no claim holds the device any more")
    if fence is None:
        if mark:
            return Decision(Action.CREATE, f"removed at {mark} while held by {holders[0]}")
        return Decision(Action.NONE, "the scheduler still tracks the device")
    if meta(fence).get("deletionTimestamp"):
        return Decision(Action.NONE, "the fence is being deleted (re-created once gone)")
    if not allocated(fence):
        return Decision(Action.ALLOCATE, f"pending fence, device held by {holders[0]}")
    if mark and revision(fence) < mark:
        return Decision(Action.PULSE, f"allocated at {revision(fence)}, device removed at {mark}")
    return Decision(Action.NONE, f"guards {holders[0]}")


class Marks:
    """In memory: per device, the resourceVersion a fence allocation must come after."""

    def __init__(self) -> None:
        self._rv: dict[DeviceID, int] = {}

    def mark(self, device: DeviceID, at: int) -> None:
        self._rv[device] = max(self._rv.get(device, 0), at)

    def get(self, device: DeviceID) -> int:
        return self._rv.get(device, 0)

    def satisfied(self, device: DeviceID, allocated_at: int) -> None:
        """The fence was allocated at ``allocated_at``: forget marks it covers."""
        if self._rv.get(device, 0) <= allocated_at:
            self._rv.pop(device, None)

    def forget(self, device: DeviceID) -> None:
        self._rv.pop(device, None)

    def __contains__(self, device: object) -> bool:
        return device in self._rv

    def __len__(self) -> int:
        return len(self._rv)
