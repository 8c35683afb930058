"""The allocator's searches, sent to the worker process in batches, and the devices found
taken in the holdings.

Invariants: batches run one after the other, so each batch's snapshot of the holdings
includes what the previous one took; all claims of a batch see the same holdings (the
worker keeps them apart); a device found is taken (:meth:`SearchBatches.search`) before
any await, and given back if nobody will write it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from controller.claims.context import ClaimContext, ClaimSources
from controller.claims.pinned_config import pin_config
from controller.claims.request import Request
from controller.claims.shared_devices import conflicts
from controller.claims.worker import (
    AllocationAnswer,
    AllocationJob,
    AllocationWorker,
    SliceSnapshot,
)
from controller.resourceclaims import with_timestamp
from dradriver.allocator import node_info
from dradriver.allocator.outcome import OUT_OF_TIME
from dradriver.k8s.objects import Obj, now_rfc3339
from dradriver.runtime import RequeueAfter

MAX_BATCH = 32
"""Claims per round trip to the allocation worker, at most."""


@dataclass
class _Waiting:
    """A claim waiting for its search; ``future`` gets the answer and the allocation taken."""

    key: str
    effective: Obj
    request: Request
    future: asyncio.Future[tuple[AllocationAnswer, Obj | None]]
    since: float


class SearchBatches:
    """Searches for claims in the worker process, within ``timeout`` seconds each, and
    takes what they found. The slices and classes are sent once per change
    (:meth:`inventory`)."""

    def __init__(
        self,
        context: ClaimContext,
        sources: ClaimSources,
        worker: AllocationWorker,
        timeout: float,
    ) -> None:
        self.context = context
        self.sources = sources
        self.worker = worker
        self.timeout = timeout
        self._waiting: list[_Waiting] = []
        self._batcher: asyncio.Task[None] | None = None
        self._inventory: SliceSnapshot | None = None
        self._inventory_generation = 0
        for informer in (sources.slices, sources.classes):
            informer.add_handler(
                on_add=self._inventory_changed,
                on_update=lambda old, new: self._inventory_changed(new),
                on_delete=self._inventory_changed,
            )

    def _inventory_changed(self, obj: Obj) -> None:
        self._inventory = None

    def inventory(self) -> SliceSnapshot:
        """The slices and classes to allocate from, as the worker takes them."""
        if self._inventory is None:
            self._inventory_generation += 1
            self._inventory = SliceSnapshot(
                self._inventory_generation,
                tuple(self.sources.slices.items()),
                tuple(self.sources.classes.items()),
            )
        return self._inventory

    async def search(
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
                self.context.holdings.unreserve(key)
            raise

    async def _run_batches(self) -> None:
        """Send the waiting claims to the worker, up to MAX_BATCH at a time, one batch
        after the other. All of a batch see the same holdings (the worker keeps them
        apart); what a batch found is taken before the next batch's snapshot, so each
        batch sees what the one before took."""
        stages = self.context.stages
        while self._waiting:
            batch = [w for w in self._waiting[:MAX_BATCH] if not w.future.done()]
            del self._waiting[:MAX_BATCH]
            if not batch:
                continue
            now = time.monotonic()
            for w in batch:
                stages.observe("turn", now - w.since)
            snapshot = self.context.holdings.snapshot(self.sources.slices.items())
            nodes = tuple(node_info(n) for n in self.sources.nodes.items())
            jobs = [AllocationJob(w.effective, snapshot, nodes, self.timeout) for w in batch]
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
                stages.observe("search", elapsed)
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
            allocation["devices"]["config"] = pin_config(self.context.driver, config, request)
        self.context.scheduler.wait_before_allocating(key)
        taken = conflicts(key, allocation, self.context.holdings.state)
        if taken:
            raise RequeueAfter(0.0, f"{taken[0].other} took a device during the search")
        self.context.require_leader(key)
        self.context.holdings.reserve(key, allocation)
        return allocation

    def failure_message(self, answer: AllocationAnswer) -> str:
        """Why a search found nothing, for the claim's status annotation and event."""
        if answer.exhausted == OUT_OF_TIME:
            return (
                f"no allocation found within the {self.timeout:g} s allocation "
                "budget (--allocation-timeout); retrying with backoff"
            )
        return answer.message or "cannot be allocated"
