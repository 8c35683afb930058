"""Devices two claims hold at once: which devices an allocation takes exclusively, which
other claims hold them, and which of two claims gives its devices back.

Pure (no I/O); :mod:`controller.claims.conflicts` holds and releases our claims.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.resourceclaims import reserved_for
from dradriver.allocator import AllocatedState, DeviceID, claim_key
from dradriver.api.wellknown import FINALIZER
from dradriver.k8s.objects import finalizers


def exclusive_devices(allocation: Mapping[str, Any]) -> list[DeviceID]:
    """Devices an allocation takes exclusively (no admin access, no share)."""
    out: list[DeviceID] = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("adminAccess") or result.get("shareID"):
            continue
        out.append(
            (str(result.get("driver", "")), str(result.get("pool", "")), str(result["device"]))
        )
    return out


@dataclass(frozen=True)
class Conflict:
    device: DeviceID
    other: str  # key of the other claim holding the device


def conflicts(key: str, allocation: Mapping[str, Any], state: AllocatedState) -> list[Conflict]:
    """Other claims in ``state`` that hold a device ``allocation`` takes exclusively."""
    out: list[Conflict] = []
    for device in exclusive_devices(allocation):
        for holder in state.holders(device):
            if holder != key:
                out.append(Conflict(device, holder))
    return out


def should_yield(key: str, ours: Mapping[str, Any], other: Mapping[str, Any] | None) -> bool:
    """Whether our claim ``key`` gives its devices back in a conflict with ``other``.

    We yield when nothing consumes our claim yet; against another controller-allocated
    claim (two leaders across a failover) only the claim whose key sorts last yields, so
    exactly one of the two does.
    """
    if reserved_for(ours):
        return False
    if other is None:
        return True
    if FINALIZER in finalizers(other) and not reserved_for(other):
        return claim_key(other) < key
    return True
