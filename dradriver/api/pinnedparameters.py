"""Referenced parameters, pinned into a claim's ``status.devices[].data``.

When the scheduler allocates a claim whose opaque config references a
DeviceClaimParameters object by name, the controller resolves the reference once,
after allocation, and writes the node-side settings it stands for into the
``data`` of each of the claim's devices of this driver::

    data:
      parameters:
        <name>: {resourceVersion: "123", config: {apiVersion: ..., kind: DeviceConfig, ...}}

The kubelet plugin substitutes these for the references when it prepares the claim,
so it never reads the CRD (no RBAC for it on nodes) and never acts on parameters that
changed after they were validated and pinned. (Claims the controller allocates itself
get the resolved ``DeviceConfig`` in the allocation's config instead.)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dradriver.api.group import PARAMETERS_REFERENCE_KIND
from dradriver.k8s.objects import Obj

DATA_KEY = "parameters"


class NotPinned(ValueError):
    """A reference has no pinned parameters (yet); the message says which.

    Not a field error: the claim is fine, the controller has not got to it yet.
    """


def references(driver: str, config: list[Obj]) -> list[str]:
    """Names referenced by this driver's opaque config entries (in order, unique)."""
    out: list[str] = []
    for entry in config:
        opaque = entry.get("opaque") or {}
        parameters = opaque.get("parameters") or {}
        if opaque.get("driver") != driver or not isinstance(parameters, dict):
            continue
        if parameters.get("kind") == PARAMETERS_REFERENCE_KIND:
            name = str(parameters.get("name", ""))
            if name and name not in out:
                out.append(name)
    return out


def our_entries(claim: Mapping[str, Any], driver: str) -> list[Obj]:
    return [
        e for e in (claim.get("status") or {}).get("devices") or [] if e.get("driver") == driver
    ]


def pinned(claim: Mapping[str, Any], driver: str) -> dict[str, Obj]:
    """``name -> {resourceVersion, config}`` from the claim's device status entries."""
    for entry in our_entries(claim, driver):
        value = (entry.get("data") or {}).get(DATA_KEY)
        if isinstance(value, dict) and value:
            return {
                str(name): item
                for name, item in value.items()
                if isinstance(item, dict) and isinstance(item.get("config"), dict)
            }
    return {}


def substitute(driver: str, config: list[Obj], pins: Mapping[str, Obj]) -> list[Obj]:
    """``config`` with every reference replaced by its pinned DeviceConfig.

    Raises :class:`NotPinned` naming the first reference without a pin.
    """
    out = []
    for entry in config:
        opaque = entry.get("opaque") or {}
        parameters = opaque.get("parameters") or {}
        if (
            opaque.get("driver") == driver
            and isinstance(parameters, dict)
            and parameters.get("kind") == PARAMETERS_REFERENCE_KIND
        ):
            name = str(parameters.get("name", ""))
            pin = pins.get(name)
            if pin is None:
                raise NotPinned(
                    f"{PARAMETERS_REFERENCE_KIND} {name!r} is not resolved yet: "
                    "dradriver-controller pins the parameters into status.devices[].data after "
                    "allocation (is it running?); the kubelet retries"
                )
            entry = copy.deepcopy(entry)
            entry["opaque"]["parameters"] = copy.deepcopy(pin["config"])
        out.append(entry)
    return out
