"""ClaimReconciler: immediate allocation of the claims that ask for it (no pod needed).

Level-based: every call looks at the claim in the cache and does the next step
(finalizer, allocation, conflict check, annotation cleanup, deallocation). It is built
from one :class:`~controller.claims.context.ClaimContext` (the client, the holdings, the
scheduler's activity, the counters, events, the lease check and the work queue), which
its parts share:

* :class:`~controller.claims.holdings.Holdings`: which claims hold which devices,
  including our writes the informer has not shown yet, and the allocation writes;
* :class:`~controller.claims.scheduler.SchedulerActivity`: whether the scheduler is
  busy or quiet, which times our writes;
* :class:`~controller.claims.conflicts.ConflictHold`: our claim found sharing a device
  with another claim is held, then given back and allocated again;
* :class:`~controller.claims.fence_lifecycle.Fencing`: fence claims repair the scheduler's
  allocated-device set after a device loses one of two holders;
* :class:`~controller.claims.search.SearchBatches`: the allocator's searches, in batches
  to a child process (:class:`~controller.claims.worker.AllocationWorker`) within a
  wall-clock budget, so that they never block the event loop;
* :class:`~controller.claims.foreign.ForeignClaims`: claims of other drivers' classes
  (:mod:`controller.claims.scope`) are left alone, with one event, before anything else.

The pure parts are in :mod:`controller.claims.request`,
:mod:`controller.claims.pinned_config`, :mod:`controller.claims.shared_devices` and
:mod:`controller.claims.fence_rules`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any

from controller.claims import fence_rules as fences
from controller.claims.conflicts import ConflictHold
from controller.claims.context import ClaimContext, ClaimSettings, ClaimSources
from controller.claims.fence_lifecycle import Fencing
from controller.claims.foreign import ForeignClaims
from controller.claims.request import Request, allocation_request, effective_claim
from controller.claims.scope import foreign_results
from controller.claims.search import SearchBatches
from controller.claims.shared_devices import conflicts
from controller.claims.worker import AllocationWorker
from controller.resourceclaims import allocated_node, reserved_for
from dradriver.allocator import claim_key
from dradriver.api.wellknown import CONFLICT_ANNOTATION, FINALIZER, STATUS_ANNOTATION
from dradriver.k8s.objects import (
    Obj,
    allocation_of,
    annotations_of,
    finalizers,
    meta,
    revision,
    uid_of,
)
from dradriver.log import get_logger
from dradriver.runtime import RequeueAfter

log = get_logger("controller")

# Allocated events in flight at once. They inform and nothing waits on them: a burst of
# allocations must not spend the apiserver's capacity on 1,000 concurrent event POSTs
# while claims still wait for their finalizer and status writes.
EVENTS_IN_FLIGHT = 2


class ClaimReconciler:
    """Allocates claims that ask for it, explains failures, deallocates on deletion.

    Two claims are never given the same device by this controller (``holdings``). The
    scheduler can still hold a device in memory that we then write: ``conflicts`` checks
    after every write and whenever the informer shows another claim taking one of our
    devices, and holds our claim if nothing consumes it yet. A device that loses one of
    two holders (our give-back, or any other removal) drops out of the scheduler's
    allocated-device set although the other claim still holds it: ``fencing`` puts it
    back with a fence claim in ``fence_namespace``.
    """

    def __init__(
        self,
        context: ClaimContext,
        sources: ClaimSources,
        settings: ClaimSettings | None = None,
        worker: AllocationWorker | None = None,
    ) -> None:
        self.context = context
        self.sources = sources
        self.settings = settings if settings is not None else ClaimSettings()
        self.holdings = context.holdings
        self.scheduler = context.scheduler
        self.stats = context.stats
        self.stages = context.stages
        self.events = context.events
        self.fencing = Fencing(context, self.settings.fence_namespace)
        self.conflicts = ConflictHold(context, self.fencing)
        self.foreign = ForeignClaims(context, sources.classes)
        self.searches = SearchBatches(
            context,
            sources,
            worker if worker is not None else AllocationWorker(),
            self.settings.allocation_timeout,
        )
        self.unallocatable: set[str] = set()
        self.failures: dict[str, int] = {}
        # Claims whose search ran out of budget: not searched again before this time
        # (monotonic), whatever event enqueues them; each search would cost a budget.
        self.out_of_budget: dict[str, float] = {}
        self._params_error_logged: dict[str, str] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._event_slots = asyncio.Semaphore(EVENTS_IN_FLIGHT)
        self.holdings.on_freed = self._devices_freed  # a claim too deep to decode let go
        context.claims.add_handler(
            on_add=self._claim_changed,
            on_update=lambda old, new: self._claim_changed(new, old),
            on_delete=self._claim_deleted,
        )

    # --- the informer's view ------------------------------------------------------------

    def _ours(self, key: str) -> bool:
        claim = self.context.claims.get(key)
        return key in self.holdings.inflight or (
            claim is not None and FINALIZER in finalizers(claim)
        )

    def _claim_changed(self, claim: Obj, old: Obj | None = None) -> None:
        key = claim_key(claim)
        self.fencing.remember(key, claim)
        self.fencing.note_removal(key, fences.removed_devices(old, claim), revision(claim))
        state, inflight = self.holdings.state, self.holdings.inflight
        allocation = allocation_of(claim)
        if allocation:
            inflight.pop(key, None)
            self.holdings.allocation_seen(key)
            for conflict in conflicts(key, allocation, state):
                if self._ours(conflict.other):
                    self.context.enqueue(conflict.other)
            state.add(key, allocation)
            return
        pending = inflight.get(key)
        if pending is not None:
            written = pending[1]
            if written is None or revision(claim) < written:
                return  # an older version than our write: keep holding the devices
            inflight.pop(key, None)
        self.holdings.allocation_gone(key)
        if not meta(claim).get("deletionTimestamp"):
            self.stages.seen(key)
        if key in state.claims():
            state.remove(key)
            self._devices_freed()

    def _claim_deleted(self, claim: Obj) -> None:
        key = claim_key(claim)
        self.fencing.note_removal(key, fences.removed_devices(claim, None), revision(claim))
        self.holdings.inflight.pop(key, None)
        self.holdings.allocation_gone(key)
        self.stages.forget(key)
        self.failures.pop(key, None)
        self.out_of_budget.pop(key, None)
        self.scheduler.forget(key)
        self.unallocatable.discard(key)
        self.foreign.forget(key)
        self.events.forget(uid_of(claim))
        if key in self.holdings.state.claims():
            self.holdings.state.remove(key)
            self._devices_freed()

    def _devices_freed(self) -> None:
        for key in list(self.unallocatable):
            self.context.enqueue(key)

    def waiting_keys(self, obj: Obj) -> Iterable[str]:
        """Mapper for slices, classes and nodes: the claims that could not be allocated."""
        return list(self.unallocatable)

    def class_keys(self, obj: Obj) -> Iterable[str]:
        """Mapper for classes: the claims waiting for devices, and those left alone (a
        class that changes may make them ours, or not ours any more)."""
        return [*self.unallocatable, *self.foreign.waiting()]

    def deferred_keys(self, obj: Obj) -> Iterable[str]:
        """Mapper for unscheduled pods: the claims waiting for the scheduler to settle."""
        return self.scheduler.deferred_keys()

    def _other_holders(self, key: str, allocation: Obj) -> list[str]:
        return sorted(
            {
                h
                for d in fences.exclusive(allocation)
                for h in fences.real_holders(d, self.holdings.state, self.fencing.is_fence_key)
                if h != key
            }
        )

    # --- reconcile ----------------------------------------------------------------------

    def _lookup(self, namespace: str, name: str) -> Obj | None:
        return self.sources.parameters.get_by_name(namespace, name)

    def _backoff(self, key: str) -> float:
        n = self.failures.get(key, 0) + 1
        self.failures[key] = n
        settings = self.settings
        return float(min(settings.retry_cap, settings.retry_base * 2 ** (n - 1)))

    async def __call__(self, key: str) -> None:
        if self.fencing.is_fence_key(key):
            await self.fencing.reconcile(key)
            return
        claim = self.context.claims.get(key)
        if claim is None:
            return
        self.stages.started(key)
        if not self.context.in_scope(key):
            return
        request = allocation_request(self.context.driver, claim, self._lookup)
        if await self.foreign.leave_alone(key, claim, request.immediate):
            return  # another driver's claim: never allocated, fenced or finalized here
        if meta(claim).get("deletionTimestamp"):
            if FINALIZER in finalizers(claim):
                await self._deallocate(key, claim)
            return
        if not request.immediate:
            if request.error and self._params_error_logged.get(key) != request.error:
                self._params_error_logged[key] = request.error
                log.info("claim parameters are invalid", claim=key, error=request.error)
            return
        allocation = allocation_of(claim)
        if request.error and not allocation:
            # An allocated claim has its parameters pinned: a parameters object deleted
            # or changed later does not concern it.
            await self._failed(key, claim, request.error)
        if allocation:
            await self.conflicts.check(key, claim, allocation)
            if CONFLICT_ANNOTATION in annotations_of(claim):
                lifted = await self.conflicts.release(key, claim, allocation)
                if lifted is None:
                    return  # gone
                claim = lifted
            await self._settled(key, claim)
            return
        if key in self.holdings.inflight:
            return  # written; the informer's update re-enqueues the key
        finalizer: asyncio.Task[Obj] | None = None
        if FINALIZER not in finalizers(claim):
            self.context.require_leader(key)
            # The search does not need the finalizer, so the patch overlaps it; the
            # allocation is written only after it, at the version it returned (so never
            # without the finalizer, and never over a change made meanwhile).
            finalizer = asyncio.create_task(self._add_finalizer(key, claim))
        try:
            await self._allocate(key, claim, request, finalizer)
        finally:
            if finalizer is not None and not finalizer.done():
                await asyncio.wait([finalizer])  # no write of ours outlives the reconcile

    async def _add_finalizer(self, key: str, claim: Obj) -> Obj:
        sent = time.monotonic()
        claim = await self._patch(
            key,
            {
                "metadata": {
                    "resourceVersion": meta(claim)["resourceVersion"],
                    "finalizers": [*finalizers(claim), FINALIZER],
                }
            },
        )
        self.stages.observe("finalizer_write", time.monotonic() - sent)
        log.info("finalizer added", claim=key)
        return claim

    async def _allocate(
        self, key: str, claim: Obj, request: Request, finalizer: asyncio.Task[Obj] | None = None
    ) -> None:
        """Search, take the devices, write the allocation (after ``finalizer``, if given:
        the finalizer patch in flight, whose answer is the claim to write at)."""
        retry_at = self.out_of_budget.get(key)
        if retry_at is not None and time.monotonic() < retry_at:
            raise RequeueAfter(retry_at - time.monotonic(), "the last search ran out of budget")
        self.scheduler.wait_before_allocating(key)
        effective = effective_claim(claim, request)  # the parameters' count and selectors
        answer, allocation = await self.searches.search(key, effective, request)
        stray = foreign_results(allocation, self.context.drivers) if allocation else []
        if stray:  # cannot happen: every class of the claim pins our drivers (scope.py)
            self.holdings.unreserve(key)
            raise RuntimeError(f"claim {key}: the search found other drivers' devices {stray}")
        if finalizer is not None:
            try:
                claim = await finalizer
            except BaseException:
                if allocation is not None:
                    self.holdings.unreserve(key)
                raise
        if allocation is None:
            await self._failed(key, claim, self.searches.failure_message(answer), answer.exhausted)
            return
        sent = time.monotonic()
        written = await self.holdings.write(key, claim, allocation)
        self.stages.observe("status_write", time.monotonic() - sent)
        self.stages.done(key)
        self.stats.allocated += 1
        devices = [
            f"{r['driver']}/{r['pool']}/{r['device']}"
            for r in allocation["devices"].get("results") or []
        ]
        node = allocated_node(allocation)
        log.info("claim allocated", claim=key, devices=devices, node=node or "any")
        self._in_background(
            self._timed(
                "event",
                self._when_slot_free(
                    self.events.emit(
                        written,
                        "ResourceClaim",
                        "Normal",
                        "Allocated",
                        f"allocated {', '.join(devices)}" + (f" on node {node}" if node else ""),
                    )
                ),
            )
        )
        await self.conflicts.check(key, written, allocation)
        await self._settled(key, written)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` without holding up the worker: for writes nothing waits on, such as
        the ``Allocated`` event (events never fail a reconcile, see EventRecorder). The
        task is kept until it ends, so it is not collected half way."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _when_slot_free(self, work: Awaitable[None]) -> None:
        async with self._event_slots:
            await work

    async def _timed(self, stage: str, work: Awaitable[None]) -> None:
        sent = time.monotonic()
        await work
        self.stages.observe(stage, time.monotonic() - sent)

    async def _settled(self, key: str, claim: Obj) -> None:
        self.failures.pop(key, None)
        self.out_of_budget.pop(key, None)
        self.unallocatable.discard(key)
        if STATUS_ANNOTATION in annotations_of(claim):
            self.context.require_leader(key)
            await self._patch(key, {"metadata": {"annotations": {STATUS_ANNOTATION: None}}})

    async def _failed(
        self, key: str, claim: Obj, message: str, exhausted: str | None = None
    ) -> None:
        """Report why the claim cannot be allocated, and retry with backoff.

        ``exhausted``: the search ran out of its time or step budget; until the backoff
        delay has passed, the claim is not searched again (see :meth:`_allocate`).
        """
        self.unallocatable.add(key)
        self.stats.failed += 1
        delay = self._backoff(key)
        if exhausted is not None:
            self.out_of_budget[key] = time.monotonic() + delay
        log.info(
            "claim cannot be allocated",
            claim=key,
            reason=message,
            retry_in=delay,
            out_of_budget=exhausted or "",
        )
        if annotations_of(claim).get(STATUS_ANNOTATION) != message:
            self.context.require_leader(key)
            await self._patch(key, {"metadata": {"annotations": {STATUS_ANNOTATION: message}}})
        await self.events.emit(claim, "ResourceClaim", "Warning", "AllocationFailed", message)
        raise RequeueAfter(delay, "cannot be allocated")

    async def _deallocate(self, key: str, claim: Obj) -> None:
        consumers = reserved_for(claim)
        if consumers:
            raise RequeueAfter(
                2.0, f"claim {key} is still reserved by {len(consumers)} consumer(s)"
            )
        allocation = allocation_of(claim)
        if allocation:
            others = self._other_holders(key, allocation)
            if others:
                raise RequeueAfter(2.0, f"devices also held by {others[:3]}: not clearing yet")
            quiet, why = self.scheduler.quiet(self.holdings.seen_since(key))
            if not quiet:
                raise RequeueAfter(1.0, f"deallocation waits for a quiet scheduler: {why}")
        self.context.require_leader(key)
        if allocation and finalizers(claim) == [FINALIZER]:
            # Ours is the last finalizer: removing it deletes the claim, and the deletion
            # is the removal the scheduler applies (as it would a clear), in one write
            # instead of two. The devices stay counted here until the informer shows the
            # claim gone.
            deleted = await self._patch(
                key,
                {"metadata": {"resourceVersion": meta(claim)["resourceVersion"], "finalizers": []}},
            )
            # As after a clear: fence at once if another claim holds a device meanwhile.
            await self.fencing.after_removal(key, allocation, revision(deleted))
            self.stats.deallocated += 1
            log.info("claim deallocated", claim=key, by="its deletion")
            log.info("finalizer removed", claim=key)
            return
        if allocation:
            cleared = await self.holdings.clear(key, claim)
            if cleared is None:
                return
            await self.fencing.after_removal(key, allocation, revision(cleared))
            claim = cleared
            self._devices_freed()
            self.stats.deallocated += 1
            log.info("claim deallocated", claim=key)
        await self._patch(
            key,
            {
                "metadata": {
                    "resourceVersion": meta(claim)["resourceVersion"],
                    "finalizers": [f for f in finalizers(claim) if f != FINALIZER],
                }
            },
        )
        log.info("finalizer removed", claim=key)

    async def _patch(self, key: str, body: Obj) -> Obj:
        return await self.context.patch_claim(key, body)
