"""Pure parts of controller allocation: who asks for it, the effective request (parameters'
``count`` and ``selectors`` applied), config pinning, conflict detection, and which claims
keep a DeviceClaimParameters object in use; the names of our claim annotations and
finalizers, and ResourceClaim accessors the other reconcilers share.

Everything here works on resource.k8s.io/v1 JSON dicts and has no I/O, so it is unit
tested on its own; :mod:`controller.claims.reconciler` does the API writes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dradriver.allocator import AllocatedState, DeviceID, claim_key
from dradriver.api import parameters as params
from dradriver.api.wellknown import (
    ALLOCATION_ANNOTATION,
    FINALIZER,
    IMMEDIATE,
)
from dradriver.k8s.objects import Obj, allocation_of, annotations_of, finalizers, meta
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import split_key

Lookup = Callable[[str, str], Obj | None]


def claim_path(key: str) -> str:
    """The REST path of the ResourceClaim ``namespace/name``."""
    namespace, name = split_key(key)
    return path_for(RESOURCE_V1, "resourceclaims", namespace, name)


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


def _applies(requests: tuple[str, ...], name: str, sub: str | None = None) -> bool:
    """Whether a config entry limited to ``requests`` (empty: all) covers this (sub)request.

    As for DeviceClaimConfiguration.requests: a main request's name covers its subrequests.
    """
    if not requests:
        return True
    return name in requests or (sub is not None and f"{name}/{sub}" in requests)


def _apply_spec(exact: Obj, spec: params.DeviceClaimParametersSpec) -> None:
    if spec.count is not None:
        exact["allocationMode"] = "ExactCount"
        exact["count"] = spec.count
    if spec.selectors:
        exact["selectors"] = [
            *(exact.get("selectors") or []),
            *({"cel": {"expression": expression}} for expression in spec.selectors),
        ]


def effective_claim(claim: Mapping[str, Any], request: Request) -> Obj:
    """A copy of ``claim`` whose requests carry the resolved parameters' ``count``/``selectors``.

    This is what the controller hands to the allocator (immediate allocation only; the
    claim in the API is not changed, and the scheduler never sees these fields). Each
    parameters entry applies to the requests it names (all when it names none), to every
    subrequest of a ``firstAvailable`` request: ``count`` makes the request
    ``ExactCount`` with that many devices, ``selectors`` are appended to the request's
    own (all must hold). When several entries set ``count`` for one request, the later
    entry wins, as for other config.
    """
    out: Obj = copy.deepcopy(dict(claim))
    specs = [
        (entry.requests, spec) for entry, spec in request.specs if spec.count or spec.selectors
    ]
    if not specs:
        return out
    for req in ((out.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = str(req.get("name", ""))
        if req.get("exactly") is not None:
            for requests, spec in specs:
                if _applies(requests, name):
                    _apply_spec(req["exactly"], spec)
        for sub in req.get("firstAvailable") or []:
            for requests, spec in specs:
                if _applies(requests, name, str(sub.get("name", ""))):
                    _apply_spec(sub, spec)
    return out


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


def referenced_parameters(driver: str, claim: Mapping[str, Any]) -> list[str]:
    """Names of the DeviceClaimParameters objects the claim references (same namespace).

    A claim whose parameters cannot be parsed references nothing.
    """
    try:
        entries = params.claim_parameters(driver, dict(claim))
    except params.ParametersError:
        return []
    names: list[str] = []
    for entry in entries:
        source = entry.source
        if isinstance(source, params.ParametersReference) and source.name not in names:
            names.append(source.name)
    return names


def claims_keeping(
    driver: str, claims: Iterable[Mapping[str, Any]], namespace: str, name: str
) -> list[str]:
    """Names (sorted) of the allocated claims in ``namespace`` that reference ``name``.

    These keep the DeviceClaimParameters object ``namespace/name`` in use: while any
    exists it carries :data:`IN_USE_FINALIZER`.
    """
    return sorted(
        str(meta(claim).get("name", ""))
        for claim in claims
        if meta(claim).get("namespace") == namespace
        and allocation_of(claim)
        and name in referenced_parameters(driver, claim)
    )


def in_use_message(users: Sequence[str], limit: int = 10) -> str:
    """``in use by claims a, b`` (at most ``limit`` names, then how many more)."""
    shown = ", ".join(users[:limit])
    more = f" and {len(users) - limit} more" if len(users) > limit else ""
    return f"in use by claim{'s' if len(users) != 1 else ''} {shown}{more}"


def allocated_node(allocation: Mapping[str, Any]) -> str | None:
    """The node an allocation is pinned to (``matchFields metadata.name In [node]``)."""
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and len(field.get("values") or []) == 1:
                return str(field["values"][0])
    return None
