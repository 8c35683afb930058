"""What a claim asks of the controller: whether it wants immediate allocation, its
resolved DeviceClaimParameters, and the effective request (the parameters' ``count`` and
``selectors`` applied) the allocator searches for; and which claims reference a
DeviceClaimParameters object (:func:`claims_using`).

Pure (resource.k8s.io/v1 JSON dicts in, no I/O).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.api import parameters as params
from dradriver.api.wellknown import ALLOCATION_ANNOTATION, IMMEDIATE
from dradriver.k8s.objects import Obj, annotations_of, meta
from dradriver.runtime import Informer

Lookup = Callable[[str, str], Obj | None]


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


def claims_using(claims: Informer, driver: str) -> Callable[[Obj], Iterable[str]]:
    """Maps a DeviceClaimParameters object to the keys of the claims that reference it."""

    def mapper(obj: Obj) -> Iterable[str]:
        namespace, name = meta(obj).get("namespace"), meta(obj).get("name")
        out = []
        for claim in claims.items():
            if (claim.get("metadata") or {}).get("namespace") != namespace:
                continue
            try:
                entries = params.claim_parameters(driver, claim)
            except params.ParametersError:
                continue
            if any(
                isinstance(e.source, params.ParametersReference) and e.source.name == name
                for e in entries
            ):
                out.append(f"{namespace}/{claim['metadata']['name']}")
        return out

    return mapper
