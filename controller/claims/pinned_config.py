"""The allocation's ``devices.config`` with this driver's claim parameters pinned: each
``DeviceClaimParameters`` entry (inline or referenced) replaced by the ``DeviceConfig`` it
resolved to, so the node never reads a CRD object that may have changed since.

Pure (no I/O).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from controller.claims.request import Request
from dradriver.api import parameters as params
from dradriver.k8s.objects import Obj


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
