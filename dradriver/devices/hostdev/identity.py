"""A host device's stable identity, and the device name made from it.

Invariants: the same identity always gives the same device name, whatever the kernel calls
the node today (``ttyUSB0`` after one plug, ``ttyUSB3`` after the next); a name is the
profile name, a label of the identity's kind and 8 hex digits of its hash, a DNS label no
longer than the profile name plus :data:`~.config.LONGEST_IDENTITY_SUFFIX`.

Kinds, in the order ``auto`` tries them: ``byId`` (the udev by-id link's name), ``serial``
(the USB serial number, with vendor and product IDs), ``byPath`` (the by-path link's name),
``path`` (the matched /dev path: stable only as long as the kernel name is).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from dradriver.devices.hostdev.config import IdentityMode

IdentityKind = Literal["byId", "serial", "byPath", "path"]

AUTO_ORDER: tuple[IdentityKind, ...] = ("byId", "serial", "byPath", "path")
_LABELS: dict[IdentityKind, str] = {
    "byId": "id",
    "serial": "serial",
    "byPath": "bypath",
    "path": "path",
}


@dataclass(frozen=True)
class Identity:
    kind: IdentityKind
    value: str

    def text(self) -> str:
        """``<kind>:<value>``, e.g. ``byId:usb-FTDI_FT232R_A1-if00-port0`` (an attribute)."""
        return f"{self.kind}:{self.value}"


@dataclass(frozen=True)
class Candidates:
    """What a match offers as identity; a kind it lacks is None."""

    path: str
    by_id: str | None = None
    serial: str | None = None
    by_path: str | None = None

    def of(self, kind: IdentityKind) -> str | None:
        if kind == "byId":
            return self.by_id
        if kind == "serial":
            return self.serial
        if kind == "byPath":
            return self.by_path
        return self.path


def usb_serial_identity(vendor: str | None, product: str | None, serial: str | None) -> str | None:
    """``<vendor>:<product>:<serial>``: a serial number is unique per product at best."""
    if not serial:
        return None
    return f"{vendor or '?'}:{product or '?'}:{serial}"


def choose(mode: IdentityMode, candidates: Candidates) -> Identity | None:
    """The identity ``mode`` asks for, or None when the match lacks it."""
    kinds = AUTO_ORDER if mode == "auto" else (mode,)
    for kind in kinds:
        value = candidates.of(kind)
        if value:
            return Identity(kind, value)
    return None


def device_name(profile: str, identity: Identity) -> str:
    """``<profile>-<kind label>-<8 hex digits>``, e.g. ``serial-serial-a1b2c3d4``."""
    digest = hashlib.sha256(identity.text().encode()).hexdigest()[:8]
    return f"{profile}-{_LABELS[identity.kind]}-{digest}"
