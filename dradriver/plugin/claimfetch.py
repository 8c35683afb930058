"""Fetching the claim the kubelet named, with the UID check.

Invariant: a claim is returned only if it is the one the kubelet means (same
namespace, name and UID). The answer is one of three: the claim, gone (404, or
the name now has another UID), or unknown (403, 429, 5xx, a timeout): a driver
must never treat "unknown" as "gone".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.plugin.interface import ClaimRef

# One GET of a claim; the client's own read timeout is long enough for watches.
CLAIM_READ_SECONDS = 10.0


@dataclass(frozen=True)
class FetchedClaim:
    """What the API server said about a claim: the object, or why there is none."""

    obj: Obj | None
    problem: str = ""  # set when obj is None
    gone: bool = False  # the claim does not exist; else the API server could not say


async def fetch_claim(client: KubeClient, claim: ClaimRef) -> FetchedClaim:
    """The claim as the kubelet named it, or why not (never raises for an API error)."""
    try:
        async with asyncio.timeout(CLAIM_READ_SECONDS):
            obj = await client.get_or_none(
                path_for(RESOURCE_V1, "resourceclaims", claim.namespace, claim.name)
            )
    except (KubeAPIError, OSError) as e:  # TransportError and timeouts are OSErrors
        return FetchedClaim(None, f"cannot read ResourceClaim {claim}: {e or type(e).__name__}")
    if obj is None:
        return FetchedClaim(None, f"ResourceClaim {claim} does not exist", gone=True)
    if obj["metadata"]["uid"] != claim.uid:
        return FetchedClaim(
            None,
            f"ResourceClaim {claim} was replaced: uid is {obj['metadata']['uid']}, "
            f"the kubelet asked for {claim.uid}",
            gone=True,
        )
    return FetchedClaim(obj)
