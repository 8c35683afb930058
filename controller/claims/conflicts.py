"""The conflict hold: a claim of ours found sharing a device with another claim.

The scheduler can hold a device in memory that this controller then writes into one of
its claims, so two claims end up holding the device. Clearing either would be a removal
kube-scheduler's allocated-device set applies although the other claim still holds the
device (:mod:`controller.claims.scheduler`), so our claim is *held* instead: it keeps
its allocation, is marked with the conflict annotation (the node plugin refuses to
prepare it) and is given back once no other claim holds the device and the scheduler is
quiet; then it is allocated again. A held claim that a pod uses meanwhile (the scheduler
reserves a claim a pod names; it does not read our annotation) cannot be given back: it
stays held while the other claim holds the device, then the hold is lifted and it keeps
the device.
"""

from __future__ import annotations

from controller.claims.context import ClaimContext
from controller.claims.fence_lifecycle import Fencing
from controller.claims.shared_devices import conflicts, should_yield
from controller.resourceclaims import reserved_for
from dradriver.api.wellknown import CONFLICT_ANNOTATION, STATUS_ANNOTATION
from dradriver.k8s.objects import Obj, annotations_of, revision
from dradriver.log import get_logger
from dradriver.runtime import RequeueAfter

log = get_logger("controller")


class ConflictHold:
    """Holds our claims that share a device (:meth:`check`) and releases them (:meth:`release`)."""

    def __init__(self, context: ClaimContext, fencing: Fencing) -> None:
        self.context = context
        self.fencing = fencing

    async def check(self, key: str, claim: Obj, allocation: Obj) -> None:
        """Hold claim ``key`` if another claim holds one of its devices and it yields.

        Raises :class:`RequeueAfter` while held; a claim in use keeps its allocation (an
        ``AllocationConflict`` event says so) and is not held.
        """
        # A fence is no consumer: it only mirrors another claim's hold for the scheduler.
        found = [
            c
            for c in conflicts(key, allocation, self.context.holdings.state)
            if not self.fencing.is_fence_key(c.other)
        ]
        if not found:
            return
        others = {c.other: self.context.holdings.claims.get(c.other) for c in found}
        what = ", ".join(f"{'/'.join(c.device)} also allocated to claim {c.other}" for c in found)
        if CONFLICT_ANNOTATION in annotations_of(claim) and reserved_for(claim):
            # Held, and a pod reserved it since: releasing would clear a claim in use
            # while the device is shared. It stays held (the node refuses to prepare it).
            raise RequeueAfter(2.0, "held claim in use: waiting for the other claim")
        if not all(should_yield(key, claim, other) for other in others.values()):
            log.warning("allocation conflict, not yielding", claim=key, conflicts=what)
            await self.context.events.emit(
                claim,
                "ResourceClaim",
                "Warning",
                "AllocationConflict",
                f"{what}; this claim is in use, so it keeps its allocation",
            )
            return
        # Hold, do not clear: clearing now would be a removal while the other claim
        # still holds the device, which kube-scheduler's set would forget (see
        # SchedulerActivity.quiet). The held claim is unusable (the node plugin refuses it).
        message = f"{what}; held unused until the device is free, then allocated again"
        if annotations_of(claim).get(CONFLICT_ANNOTATION) != what:
            self.context.require_leader(key)
            await self.context.patch_claim(
                key,
                {
                    "metadata": {
                        "annotations": {CONFLICT_ANNOTATION: what, STATUS_ANNOTATION: message}
                    }
                },
            )
            self.context.stats.held += 1
            log.warning("allocation conflict, holding the claim", claim=key, conflicts=what)
            await self.context.events.emit(
                claim, "ResourceClaim", "Warning", "AllocationConflict", message
            )
        raise RequeueAfter(2.0, "allocation conflict: waiting for the other claim")

    async def release(self, key: str, claim: Obj, allocation: Obj) -> Obj | None:
        """A held claim whose devices no other claim holds: give it back, allocate again.

        Only while the scheduler is quiet: the clear is a removal the scheduler applies
        to its set, harmless now that nobody else holds the devices, unless a scheduling
        cycle hands one out at the same moment. Raises :class:`RequeueAfter` (to allocate
        again, or to wait); returns None if the claim is gone, or, if a pod uses it, the
        claim with the hold lifted (nothing is removed, so the scheduler need not be quiet).
        """
        if reserved_for(claim):
            self.context.require_leader(key)
            lifted = await self.context.patch_claim(
                key,
                {"metadata": {"annotations": {CONFLICT_ANNOTATION: None, STATUS_ANNOTATION: None}}},
            )
            log.info("held claim in use keeps its allocation: hold lifted", claim=key)
            return lifted
        quiet, why = self.context.scheduler.quiet(self.context.holdings.seen_since(key))
        if not quiet:
            raise RequeueAfter(1.0, f"held claim waits for a quiet scheduler: {why}")
        self.context.require_leader(key)
        # The marker goes first: a crash after it leaves an ordinary allocated claim,
        # which the next pass checks for conflicts again.
        claim = await self.context.patch_claim(
            key, {"metadata": {"annotations": {CONFLICT_ANNOTATION: None}}}
        )
        cleared = await self.context.holdings.clear(key, claim)
        if cleared is None:
            return None
        await self.fencing.after_removal(key, allocation, revision(cleared))
        self.context.stats.yielded += 1
        log.info("held claim gave its allocation back", claim=key)
        raise RequeueAfter(0.1, "allocate the held claim again")
