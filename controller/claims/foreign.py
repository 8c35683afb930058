"""Claims of other drivers: left alone, with one Warning event that says why.

Invariants (the rule is :mod:`controller.claims.scope`):

* A claim that asks for immediate allocation (or carries our finalizer) but is not ours
  gets no allocation, no finalizer and no status annotation from us: one Warning event
  (reason ``NotThisDriver``, naming the request, the class and the fix), and our marks
  removed if it carries any (our finalizer, put there by the chart's admission policy or
  when its class was ours; our status annotation). It is not re-queued: it is looked at
  again only when it changes or a DeviceClass changes (:attr:`ForeignClaims.keys`).
* A claim we allocated whose class is no longer ours keeps its allocation and its
  finalizer (the reconciler deallocates it on deletion, as before); that is logged once.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.claims import scope
from controller.claims.context import ClaimContext
from dradriver.api.wellknown import FINALIZER, STATUS_ANNOTATION
from dradriver.k8s.objects import Obj, annotations_of, finalizers, meta
from dradriver.log import get_logger
from dradriver.runtime import Informer

log = get_logger("controller")


class ForeignClaims:
    """Decides, before anything else is done for a claim, whether to leave it alone."""

    def __init__(self, context: ClaimContext, classes: Informer) -> None:
        self.context = context
        self.classes = classes
        self.keys: set[str] = set()  # claims left alone: looked at again on class changes
        self._said: dict[str, str] = {}  # key -> the last reason logged

    def _lookup(self, name: str) -> Obj | None:
        return self.classes.get_by_name(None, name)

    async def leave_alone(self, key: str, claim: Obj, immediate: bool) -> bool:
        """True when ``claim`` is not ours: then it has been dealt with (event, our marks
        removed) and the reconciler does nothing more for it."""
        if not immediate and FINALIZER not in finalizers(claim):
            self.keys.discard(key)
            return False  # nothing would be done for it anyway
        verdict = scope.claim_scope(claim, self.context.drivers, self._lookup)
        if verdict.ours:
            self.keys.discard(key)
            return False
        if scope.allocated_by_us(claim, self.context.drivers):
            # Its class changed since we allocated it: it keeps its devices until deleted.
            self.keys.discard(key)
            self._log(key, verdict.why + "; its allocation stays until the claim is deleted")
            return False
        self.keys.add(key)
        await self._unmark(key, claim)
        if immediate and not meta(claim).get("deletionTimestamp"):
            await self._warn(key, claim, verdict.why)
        return True

    def _log(self, key: str, message: str) -> None:
        if self._said.get(key) != message:
            self._said[key] = message
            log.info("claim of another driver's class", claim=key, reason=message)

    async def _warn(self, key: str, claim: Obj, message: str) -> None:
        """The Warning event (posted once per message: see EventRecorder), logged once."""
        self._log(key, message)
        await self.context.events.emit(claim, "ResourceClaim", "Warning", scope.REASON, message)

    async def _unmark(self, key: str, claim: Obj) -> None:
        """Remove our finalizer and status annotation, if the claim carries them."""
        body: Obj = {"metadata": {}}
        if FINALIZER in finalizers(claim):
            body["metadata"]["resourceVersion"] = meta(claim)["resourceVersion"]
            body["metadata"]["finalizers"] = [f for f in finalizers(claim) if f != FINALIZER]
        if STATUS_ANNOTATION in annotations_of(claim):
            body["metadata"]["annotations"] = {STATUS_ANNOTATION: None}
        if body["metadata"]:
            self.context.require_leader(key)
            await self.context.patch_claim(key, body)
            log.info("our marks removed from a claim of another driver", claim=key)

    def forget(self, key: str) -> None:
        self.keys.discard(key)
        self._said.pop(key, None)

    def waiting(self) -> Iterable[str]:
        """The claims left alone (to look at again when a DeviceClass changes)."""
        return list(self.keys)
