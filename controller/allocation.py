"""Pure parts of controller allocation: who asks for it, config pinning, conflict detection.

Everything here works on resource.k8s.io/v1 JSON dicts and has no I/O, so it is unit
tested on its own; :mod:`controller.reconcilers` does the API writes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dradriver import parameters as params
from dradriver.allocator import AllocatedState, DeviceID, claim_key

Obj = dict[str, Any]

ALLOCATION_ANNOTATION = "dradriver.dev/allocation"
"""``dradriver.dev/allocation: Immediate`` on a claim asks the controller to allocate it."""
STATUS_ANNOTATION = "dradriver.dev/allocation-status"
"""Why the controller could not allocate the claim (ResourceClaimStatus has no conditions)."""
FINALIZER = "dradriver.dev/allocation"
"""The controller's own finalizer on claims it allocated (flows.md §b)."""
IMMEDIATE = params.AllocationMode.IMMEDIATE.value

Lookup = Callable[[str, str], Obj | None]


def meta(obj: Mapping[str, Any]) -> Obj:
    value: Obj = obj.get("metadata") or {}
    return value


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    value: dict[str, str] = meta(obj).get("annotations") or {}
    return value


def finalizers(obj: Mapping[str, Any]) -> list[str]:
    return list(meta(obj).get("finalizers") or [])


def allocation_of(claim: Mapping[str, Any]) -> Obj | None:
    value: Obj | None = (claim.get("status") or {}).get("allocation")
    return value or None


def reserved_for(claim: Mapping[str, Any]) -> list[Obj]:
    return list((claim.get("status") or {}).get("reservedFor") or [])


@dataclass(frozen=True)
class Request:
    """Whether a claim asks for controller allocation, and its resolved parameters."""

    immediate: bool
    specs: tuple[tuple[params.ClaimParameters, params.DeviceClaimParametersSpec], ...] = ()
    error: str | None = None  # the parameters could not be resolved


def allocation_request(driver: str, claim: Obj, lookup: Lookup) -> Request:
    """Read the annotation and resolve this driver's parameters (inline or referenced).

    A claim is immediate when annotated ``dradriver.dev/allocation: Immediate`` or when any
    of its parameters entries resolves to ``allocationMode: Immediate``. When resolution
    fails, ``error`` says why (``immediate`` then only reflects the annotation).
    """
    annotated = annotations_of(claim).get(ALLOCATION_ANNOTATION) == IMMEDIATE
    namespace = str(meta(claim).get("namespace") or "")
    try:
        entries = params.claim_parameters(driver, claim)
        specs = tuple((e, params.resolve(e, namespace, lookup)) for e in entries)
    except params.ParametersError as e:
        return Request(immediate=annotated, error=str(e))
    return Request(immediate=annotated or any(s.immediate for _, s in specs), specs=specs)


def pin_config(driver: str, config: Iterable[Mapping[str, Any]], request: Request) -> list[Obj]:
    """``devices.config`` with this driver's claim parameters replaced by ``DeviceConfig``.

    The allocator copies the claim's config entries (``FromClaim``) as they are; a
    ``DeviceClaimParameters`` or ``...Reference`` entry becomes the equivalent
    ``DeviceConfig`` of its resolved spec, so the node never reads a CRD object that may
    have changed since. Entries are matched to the claim's config by their opaque
    parameters (the allocator deep-copies them unchanged).
    """
    resolved = [(entry, spec) for entry, spec in request.specs]
    out: list[Obj] = []
    for item in config:
        pinned = copy.deepcopy(dict(item))
        opaque = pinned.get("opaque") or {}
        kind = (opaque.get("parameters") or {}).get("kind")
        if (
            pinned.get("source") == "FromClaim"
            and opaque.get("driver") == driver
            and kind in (params.KIND, params.REFERENCE_KIND)
        ):
            spec = _spec_for(opaque["parameters"], resolved)
            if spec is None:
                raise params.ParametersError(
                    f"config entry {opaque['parameters']!r} was not resolved before allocation"
                )
            opaque["parameters"] = spec.device_config(driver)
        out.append(pinned)
    return out


def _spec_for(
    parameters: Mapping[str, Any],
    resolved: list[tuple[params.ClaimParameters, params.DeviceClaimParametersSpec]],
) -> params.DeviceClaimParametersSpec | None:
    for entry, spec in resolved:
        source = entry.source
        if isinstance(source, params.ParametersReference):
            if parameters.get("kind") == params.REFERENCE_KIND and parameters.get("name") == (
                source.name
            ):
                return spec
        elif parameters.get("kind") == params.KIND:
            try:
                if params.parse_spec(parameters.get("spec") or {}) == source.spec:
                    return spec
            except params.ParametersError:
                continue
    return None


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


def with_timestamp(allocation: Obj, now: str) -> Obj:
    out = copy.deepcopy(allocation)
    out["allocationTimestamp"] = now
    return out
