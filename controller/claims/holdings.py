"""Which claims hold which devices, as this controller knows it, and the writes of
``status.allocation`` that change it.

The claims informer shows an allocation some milliseconds after it is written; until
then the devices must still count as taken, or two workers would give the same device to
two claims. So the holdings are the informer's allocations plus those this controller
wrote that the informer has not shown yet.
"""

from __future__ import annotations

import time

from controller.resourceclaims import claim_path
from dradriver.allocator import AllocatedState
from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError, is_not_found
from dradriver.k8s.objects import Obj, allocation_of, meta, revision
from dradriver.runtime import Informer


class Holdings:
    """``state`` counts every allocated claim's devices; ``inflight`` our unseen writes.

    ``inflight`` maps a key to the allocation written and the claim's resourceVersion
    after the write (None while the write is on its way); the informer's event handler
    drops the entry once it shows the allocation, or a version at least that new.
    """

    def __init__(self, client: KubeClient, claims: Informer) -> None:
        self.client = client
        self.claims = claims
        self.state = AllocatedState()
        self.inflight: dict[str, tuple[Obj, int | None]] = {}
        # key -> when the informer first showed the claim's current allocation
        # (monotonic): how long the scheduler has had to count its devices.
        self.seen_at: dict[str, float] = {}

    def allocation_seen(self, key: str) -> None:
        """The informer shows claim ``key`` allocated (the first time is recorded)."""
        self.seen_at.setdefault(key, time.monotonic())

    def allocation_gone(self, key: str) -> None:
        """The informer shows claim ``key`` without an allocation, or gone."""
        self.seen_at.pop(key, None)

    def seen_since(self, key: str) -> float:
        """When claim ``key``'s allocation was first seen; now if it has not been yet."""
        return self.seen_at.get(key, time.monotonic())

    def allocation(self, key: str) -> Obj | None:
        """Claim ``key``'s allocation: the informer's, else the one we wrote meanwhile."""
        claim = self.claims.get(key)
        allocation = allocation_of(claim) if claim is not None else None
        if allocation is None and key in self.inflight:
            allocation = self.inflight[key][0]
        return allocation

    def reserve(self, key: str, allocation: Obj) -> None:
        """Count ``allocation``'s devices as taken by ``key`` before it is written."""
        self.state.add(key, allocation)
        self.inflight[key] = (allocation, None)

    def unreserve(self, key: str) -> None:
        """Give back what :meth:`reserve` took, unless the informer shows ``key`` allocated."""
        self.inflight.pop(key, None)
        if allocation_of(self.claims.get(key) or {}) is None:
            self.state.remove(key)

    async def write(self, key: str, claim: Obj, allocation: Obj) -> Obj:
        """Write ``allocation`` into the claim (at its resourceVersion); returns the claim.

        The devices are taken (:meth:`reserve`, if the caller did not already) before the
        first await, so no other worker takes them; a failed write gives them back unless
        the informer meanwhile shows the claim allocated.
        """
        self.reserve(key, allocation)
        try:
            written = await self.client.merge_patch(
                claim_path(key) + "/status",
                {
                    "metadata": {"resourceVersion": meta(claim)["resourceVersion"]},
                    "status": {"allocation": allocation},
                },
            )
        except BaseException:
            self.unreserve(key)
            raise
        if key in self.inflight:
            self.inflight[key] = (allocation, revision(written))
        return written

    async def clear(self, key: str, claim: Obj) -> Obj | None:
        """Clear status.allocation (at the claim's resourceVersion) and forget our hold.

        Returns the updated claim, or None if the claim is gone.
        """
        try:
            updated = await self.client.merge_patch(
                claim_path(key) + "/status",
                {
                    "metadata": {"resourceVersion": meta(claim)["resourceVersion"]},
                    "status": {"allocation": None},
                },
            )
        except KubeAPIError as e:
            if is_not_found(e):
                return None
            raise
        self.inflight.pop(key, None)
        self.state.remove(key)
        self.allocation_gone(key)
        return updated
