"""ClaimReconciler: immediate allocation of the claims that ask for it (no pod needed).

Level-based: every call looks at the claim in the cache and does the next step
(finalizer, allocation, conflict check, annotation cleanup, deallocation). The parts it
owns, one concept each:

* :class:`~controller.claims.holdings.Holdings`: which claims hold which devices,
  including our writes the informer has not shown yet, and the allocation writes;
* :class:`~controller.claims.scheduler.SchedulerActivity`: whether the scheduler is
  busy or quiet, which times our writes;
* :class:`~controller.claims.conflicts.ConflictHold`: our claim found sharing a device
  with another claim is held, then given back and allocated again;
* :class:`~controller.claims.fence_lifecycle.Fencing`: fence claims repair the scheduler's
  allocated-device set after a device loses one of two holders;
* :class:`~controller.claims.worker.AllocationWorker`: the allocator's search, in a child
  process within a wall-clock budget, so that it never blocks the event loop.

The pure parts are in :mod:`controller.claims.request`,
:mod:`controller.claims.pinned_config`, :mod:`controller.claims.shared_devices` and
:mod:`controller.claims.fence_rules`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from controller.claims import fence_rules as fences
from controller.claims.conflicts import ConflictHold
from controller.claims.fence_lifecycle import Fencing
from controller.claims.holdings import Holdings
from controller.claims.pinned_config import pin_config
from controller.claims.request import Request, allocation_request, effective_claim
from controller.claims.scheduler import SchedulerActivity
from controller.claims.shared_devices import conflicts
from controller.claims.stages import StageTimes
from controller.claims.stats import AllocationStats
from controller.claims.worker import AllocationAnswer, AllocationJob, AllocationWorker, Inventory
from controller.leadership import require_leader
from controller.resourceclaims import allocated_node, claim_path, reserved_for, with_timestamp
from dradriver.allocator import claim_key, node_info
from dradriver.allocator.core import OUT_OF_TIME
from dradriver.api import parameters as params
from dradriver.api.wellknown import CONFLICT_ANNOTATION, FINALIZER, STATUS_ANNOTATION
from dradriver.k8s.client import KubeClient
from dradriver.k8s.events import EventRecorder
from dradriver.k8s.objects import (
    Obj,
    allocation_of,
    annotations_of,
    finalizers,
    meta,
    now_rfc3339,
    revision,
    uid_of,
)
from dradriver.log import get_logger
from dradriver.metrics import Registry
from dradriver.runtime import Informer, RequeueAfter, split_key

log = get_logger("controller")

MAX_BATCH = 32
"""Claims per round trip to the allocation worker, at most."""
# Allocated events in flight at once. They inform and nothing waits on them: a burst of
# allocations must not spend the apiserver's capacity on 1,000 concurrent event POSTs
# while claims still wait for their finalizer and status writes.
EVENTS_IN_FLIGHT = 2


@dataclass
class _Waiting:
    """A claim waiting for its search; ``future`` gets the answer and the allocation taken."""

    key: str
    effective: Obj
    request: Request
    future: asyncio.Future[tuple[AllocationAnswer, Obj | None]]
    since: float


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
        client: KubeClient,
        driver: str,
        claims: Informer,
        parameters: Informer,
        slices: Informer,
        classes: Informer,
        nodes: Informer,
        is_leader: Callable[[], bool] = lambda: True,
        namespaces: Iterable[str] = (),
        retry_base: float = 1.0,
        retry_cap: float = 60.0,
        pending_pods: Informer | None = None,
        max_defer: float = 10.0,
        quiet_period: float = 0.3,
        fence_namespace: str = "dradriver",
        removal_quiet: float = 2.0,
        removal_window: float = 30.0,
        worker: AllocationWorker | None = None,
        allocation_timeout: float = 10.0,
        registry: Registry | None = None,
    ) -> None:
        self.client = client
        self.driver = driver
        self.claims = claims
        self.parameters = parameters
        self.slices = slices
        self.classes = classes
        self.nodes = nodes
        self.is_leader = is_leader
        self.namespaces = frozenset(namespaces)
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.enqueue: Callable[[str], None] = lambda key: None  # set by the controller
        self.scheduler = SchedulerActivity(
            pending_pods,
            quiet_period=quiet_period,
            max_defer=max_defer,
            removal_quiet=removal_quiet,
            removal_window=removal_window,
        )
        self.events = EventRecorder(client)
        self.stats = AllocationStats()
        self.stages = StageTimes(registry)
        self._background: set[asyncio.Task[None]] = set()
        self._event_slots = asyncio.Semaphore(EVENTS_IN_FLIGHT)
        self.holdings = Holdings(client, claims)
        self.fencing = Fencing(
            client,
            fence_namespace,
            self.holdings,
            self.scheduler,
            self.stats,
            is_leader,
            enqueue=lambda key: self.enqueue(key),  # self.enqueue is replaced later
            namespaces=self.namespaces,
        )
        self.conflicts = ConflictHold(
            client, self.holdings, self.fencing, self.scheduler, self.events, self.stats, is_leader
        )
        self.unallocatable: set[str] = set()
        self.failures: dict[str, int] = {}
        # The search runs in a child process, in batches one after the other, so that
        # each batch's snapshot of the holdings includes what the previous one took.
        self.worker = worker if worker is not None else AllocationWorker()
        self.allocation_timeout = allocation_timeout
        self._waiting: list[_Waiting] = []
        self._batcher: asyncio.Task[None] | None = None
        self._inventory: Inventory | None = None
        self._inventory_generation = 0
        # Claims whose search ran out of budget: not searched again before this time
        # (monotonic), whatever event enqueues them; each search would cost a budget.
        self.out_of_budget: dict[str, float] = {}
        self._params_error_logged: dict[str, str] = {}
        claims.add_handler(
            on_add=self._claim_changed,
            on_update=lambda old, new: self._claim_changed(new, old),
            on_delete=self._claim_deleted,
        )
        for informer in (slices, classes):
            informer.add_handler(
                on_add=self._inventory_changed,
                on_update=lambda old, new: self._inventory_changed(new),
                on_delete=self._inventory_changed,
            )

    # --- caches -------------------------------------------------------------------------

    def _inventory_changed(self, obj: Obj) -> None:
        self._inventory = None

    def inventory(self) -> Inventory:
        """The slices and classes to allocate from, as the worker takes them."""
        if self._inventory is None:
            self._inventory_generation += 1
            self._inventory = Inventory(
                self._inventory_generation,
                tuple(self.slices.items()),
                tuple(self.classes.items()),
            )
        return self._inventory

    def _ours(self, key: str) -> bool:
        claim = self.claims.get(key)
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
                    self.enqueue(conflict.other)
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
        self.events.forget(uid_of(claim))
        if key in self.holdings.state.claims():
            self.holdings.state.remove(key)
            self._devices_freed()

    def _devices_freed(self) -> None:
        for key in list(self.unallocatable):
            self.enqueue(key)

    def waiting_keys(self, obj: Obj) -> Iterable[str]:
        """Mapper for slices, classes and nodes: the claims that could not be allocated."""
        return list(self.unallocatable)

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
        return self.parameters.get_by_name(namespace, name)

    def _check_leader(self, key: str) -> None:
        require_leader(self.is_leader, f"claim {key}")

    def _backoff(self, key: str) -> float:
        n = self.failures.get(key, 0) + 1
        self.failures[key] = n
        return float(min(self.retry_cap, self.retry_base * 2 ** (n - 1)))

    async def __call__(self, key: str) -> None:
        if self.fencing.is_fence_key(key):
            await self.fencing.reconcile(key)
            return
        claim = self.claims.get(key)
        if claim is None:
            return
        self.stages.started(key)
        namespace, _ = split_key(key)
        if self.namespaces and namespace not in self.namespaces:
            return
        if meta(claim).get("deletionTimestamp"):
            if FINALIZER in finalizers(claim):
                await self._deallocate(key, claim)
            return
        request = allocation_request(self.driver, claim, self._lookup)
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
            self._check_leader(key)
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
        answer, allocation = await self._search(key, effective, request)
        if finalizer is not None:
            try:
                claim = await finalizer
            except BaseException:
                if allocation is not None:
                    self.holdings.unreserve(key)
                raise
        if allocation is None:
            await self._failed(key, claim, self._failure_message(answer), answer.exhausted)
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

    async def _search(
        self, key: str, effective: Obj, request: Request
    ) -> tuple[AllocationAnswer, Obj | None]:
        """Claim ``key``'s search and, if it found one, the allocation with its devices
        taken (:meth:`_take`). Searches go to the worker in batches: the claims waiting
        while a batch runs form the next one (see :mod:`controller.claims.worker`)."""
        future: asyncio.Future[tuple[AllocationAnswer, Obj | None]] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiting.append(_Waiting(key, effective, request, future, time.monotonic()))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        try:
            return await future
        except asyncio.CancelledError:
            # Answered and taken just before the cancellation: nobody will write it.
            answered = future.done() and not future.cancelled() and future.exception() is None
            if answered and future.result()[1] is not None:
                self.holdings.unreserve(key)
            raise

    async def _run_batches(self) -> None:
        """Send the waiting claims to the worker, up to MAX_BATCH at a time, one batch
        after the other. All of a batch see the same holdings (the worker keeps them
        apart); what a batch found is taken before the next batch's snapshot, so each
        batch sees what the one before took."""
        while self._waiting:
            batch = [w for w in self._waiting[:MAX_BATCH] if not w.future.done()]
            del self._waiting[:MAX_BATCH]
            if not batch:
                continue
            now = time.monotonic()
            for w in batch:
                self.stages.observe("turn", now - w.since)
            snapshot = self.holdings.state.snapshot()
            nodes = tuple(node_info(n) for n in self.nodes.items())
            jobs = [
                AllocationJob(w.effective, snapshot, nodes, self.allocation_timeout) for w in batch
            ]
            try:
                answers = await self.worker.allocate_batch(jobs, self.inventory())
            except BaseException as e:
                for w in batch:
                    if w.future.done():
                        continue
                    if isinstance(e, asyncio.CancelledError):
                        w.future.cancel()
                    else:
                        w.future.set_exception(e)
                raise
            elapsed = time.monotonic() - now
            for w, answer in zip(batch, answers, strict=True):
                self.stages.observe("search", elapsed)
                if w.future.done():
                    continue  # its reconcile was cancelled: nothing is taken for it
                try:
                    allocation = (
                        self._take(w.key, answer, w.request)
                        if answer.allocation is not None
                        else None
                    )
                except Exception as e:
                    w.future.set_exception(e)
                    continue
                w.future.set_result((answer, allocation))

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

    def _take(self, key: str, answer: AllocationAnswer, request: Request) -> Obj:
        """The answer's allocation, its devices taken in the holdings before any await.

        The search ran on a snapshot, for up to the budget: what changed meanwhile is
        checked again here (the scheduler became busy, the informer showed another claim
        taking one of the devices).
        """
        assert answer.allocation is not None
        allocation = with_timestamp(answer.allocation, now_rfc3339())
        config = (allocation.get("devices") or {}).get("config")
        if config:
            allocation["devices"]["config"] = pin_config(self.driver, config, request)
        self.scheduler.wait_before_allocating(key)
        taken = conflicts(key, allocation, self.holdings.state)
        if taken:
            raise RequeueAfter(0.0, f"{taken[0].other} took a device during the search")
        self._check_leader(key)
        self.holdings.reserve(key, allocation)
        return allocation

    def _failure_message(self, answer: AllocationAnswer) -> str:
        if answer.exhausted == OUT_OF_TIME:
            return (
                f"no allocation found within the {self.allocation_timeout:g} s allocation "
                "budget (--allocation-timeout); retrying with backoff"
            )
        return answer.message or "cannot be allocated"

    async def _settled(self, key: str, claim: Obj) -> None:
        self.failures.pop(key, None)
        self.out_of_budget.pop(key, None)
        self.unallocatable.discard(key)
        if STATUS_ANNOTATION in annotations_of(claim):
            self._check_leader(key)
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
            self._check_leader(key)
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
        self._check_leader(key)
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
        return await self.client.merge_patch(claim_path(key), body)


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
