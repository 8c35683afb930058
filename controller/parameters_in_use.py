"""Which allocated claims keep a DeviceClaimParameters object in use (while any does, it
carries :data:`~dradriver.api.wellknown.IN_USE_FINALIZER`), and the message that names them.

Pure (no I/O); :mod:`controller.parameters` does the writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dradriver.api import parameters as params
from dradriver.k8s.objects import allocation_of, meta


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
