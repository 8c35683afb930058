"""The allocator's searches, sent to the worker processes in fair turns, and the devices
found taken in the holdings.

Invariants: who is searched next, in which lane and with what budget is
:class:`~controller.claims.fairqueue.FairQueue`'s (fair across namespaces; slow claims
alone, fresh ones in batches bounded by a turn; budgets halved per failure). A fresh
claim's reconcile awaits its answer; a slow claim's does not (it would hold one of the
claim workers for as long as the slow lane is busy): its search runs in the background,
the answer is kept and the claim enqueued, and its next reconcile takes the answer.
Each lane runs its round trips one after the other; all claims of a batch see the same
holdings (the worker keeps them apart); a device found is taken (:meth:`SearchBatches._take`)
before any await, after checking it against everything taken meanwhile (by the other
lane too, or seen by the informer), and given back if nobody will write it. So two lanes
never hand out one device.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from controller.claims.context import ClaimContext, ClaimSources
from controller.claims.fairqueue import TURN, FairQueue, Pick
from controller.claims.pinned_config import pin_config
from controller.claims.request import Request
from controller.claims.shared_devices import conflicts
from controller.claims.slicesync import SliceSnapshot
from controller.claims.worker import (
    NOT_RUN,
    TURN_ENDED,
    AllocationAnswer,
    AllocationJob,
    AllocationWorker,
)
from controller.resourceclaims import with_timestamp
from dradriver.allocator import NodeInfo, node_info
from dradriver.allocator.outcome import OUT_OF_TIME
from dradriver.k8s.objects import Obj, now_rfc3339
from dradriver.runtime import RequeueAfter

MAX_BATCH = 32
"""Claims per round trip to the allocation worker, at most."""

Answered = tuple[AllocationAnswer, Obj | None]


@dataclass
class _Waiting:
    """A claim waiting for its search; ``future`` gets the answer and the allocation taken
    (None: a search in the background, whose answer is kept for the next reconcile)."""

    key: str
    effective: Obj
    request: Request
    future: asyncio.Future[Answered] | None
    since: float
    turns: int = 0  # round trips it was sent in

    @property
    def wanted(self) -> bool:
        return self.future is None or not self.future.done()


class SearchBatches:
    """Searches for claims in the worker processes and takes what they found. The slices
    and classes are sent once per change (:meth:`inventory`).

    ``workers``: one (both lanes share it, fresh batches first) or two (the first runs the
    fresh batches, the second the slow claims). ``timeout``: a search's full budget.
    """

    def __init__(
        self,
        context: ClaimContext,
        sources: ClaimSources,
        workers: Sequence[AllocationWorker],
        timeout: float,
        turn: float = TURN,
    ) -> None:
        self.context = context
        self.sources = sources
        self.workers = list(workers)
        self.timeout = timeout
        self.queue: FairQueue[_Waiting] = FairQueue(timeout, turn=turn)
        self._lanes: dict[int, asyncio.Task[None]] = {}
        self._background: set[str] = set()  # slow searches queued or running
        self._ready: dict[str, tuple[Obj, AllocationAnswer]] = {}  # their answers
        self._inventory: SliceSnapshot | None = None
        self._inventory_generation = 0
        self._nodes: tuple[NodeInfo, ...] | None = None
        for informer in (sources.slices, sources.classes):
            informer.add_handler(
                on_add=self._inventory_changed,
                on_update=lambda old, new: self._inventory_changed(new),
                on_delete=self._inventory_changed,
            )
        sources.nodes.add_handler(
            on_add=self._nodes_changed,
            on_update=self._node_updated,
            on_delete=self._nodes_changed,
        )

    def _inventory_changed(self, obj: Obj) -> None:
        self._inventory = None
        self._ready.clear()
        self.queue.changed()

    def _nodes_changed(self, obj: Obj) -> None:
        self._nodes = None

    def _node_updated(self, old: Obj, new: Obj) -> None:
        """Only a new name or new labels matter (not the kubelet's status updates)."""
        if node_info(old) != node_info(new):
            self._nodes = None

    def nodes(self) -> tuple[NodeInfo, ...]:
        """The candidate nodes, one tuple until a node is added, removed or relabelled (the
        worker sends them again only then)."""
        if self._nodes is None:
            self._nodes = tuple(node_info(n) for n in self.sources.nodes.items())
        return self._nodes

    def devices_freed(self) -> None:
        """A claim let go of devices: a search that failed may succeed now."""
        self.queue.changed()
        for key in [k for k, (_e, a) in self._ready.items() if a.allocation is None]:
            del self._ready[key]

    def forget(self, key: str) -> None:
        """Claim ``key`` was deleted."""
        self.queue.forget(key)
        self._ready.pop(key, None)
        self._background.discard(key)

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

    async def search(self, key: str, effective: Obj, request: Request) -> Answered:
        """Claim ``key``'s search and, if it found one, the allocation with its devices
        taken (:meth:`_take`). A fresh claim waits for its turn; a slow one's search runs
        in the background (module docstring) and this raises :class:`RequeueAfter` until
        its answer is there."""
        ready = self._ready.pop(key, None)
        if ready is not None and ready[0] == effective:
            answer = ready[1]
            if answer.allocation is None:
                return answer, None
            return answer, self._take(key, answer, request)
        if self.queue.is_slow(key):
            self._in_background(_Waiting(key, effective, request, None, time.monotonic()))
            raise RequeueAfter(
                self.timeout, "searched alone in the slow lane (an earlier search ran out of time)"
            )
        future: asyncio.Future[Answered] = asyncio.get_running_loop().create_future()
        self.queue.push(key, _Waiting(key, effective, request, future, time.monotonic()))
        self._wake()
        try:
            return await future
        except asyncio.CancelledError:
            # Answered and taken just before the cancellation: nobody will write it.
            answered = future.done() and not future.cancelled() and future.exception() is None
            if answered and future.result()[1] is not None:
                self.context.holdings.unreserve(key)
            raise

    def _in_background(self, w: _Waiting) -> None:
        """Queue ``w``'s search in the slow lane (once); its reconcile does not wait."""
        if w.future is not None and not w.future.done():
            w.future.set_exception(
                RequeueAfter(self.timeout, "its search continues alone in the slow lane")
            )
        if w.key not in self._background:
            self._background.add(w.key)
            self.queue.push(w.key, replace(w, future=None))
            self._wake()

    def _wake(self) -> None:
        """Start the lanes that have no task running."""
        for lane in range(len(self.workers)):
            task = self._lanes.get(lane)
            if task is None or task.done():
                self._lanes[lane] = asyncio.create_task(self._run_lane(lane))

    def _next(self, lane: int) -> Pick[_Waiting]:
        """The next round trip of ``lane``: fresh batches (lane 0), slow claims (lane 1);
        a single worker takes fresh batches first."""
        if lane == 0:
            pick = self.queue.fresh(MAX_BATCH)
            if pick.items or len(self.workers) > 1:
                return pick
        return self.queue.slow()

    async def _run_lane(self, lane: int) -> None:
        while True:
            pick = self._next(lane)
            if not pick.items:
                return
            live = []
            for key, w, budget in pick.items:
                if not w.wanted or (w.future is None and key not in self._background):
                    continue
                if pick.turn is not None and self.queue.is_slow(key):
                    self._in_background(w)  # its namespace's claims ran out meanwhile
                    continue
                live.append((w, budget))
            if live:
                await self._round(self.workers[lane], live, pick.turn)

    async def _round(
        self, worker: AllocationWorker, batch: list[tuple[_Waiting, float]], turn: float | None
    ) -> None:
        """One round trip: what the batch found is taken, what was cut short goes to the
        slow lane, what was not run waits at the front of its namespace's queue."""
        stages = self.context.stages
        now = time.monotonic()
        for w, _budget in batch:
            if not w.turns:
                stages.observe("turn", now - w.since)
            w.turns += 1
        # The informer itself: its slices are listed only when an unreadable claim blocks.
        snapshot = self.context.holdings.snapshot(self.sources.slices)
        nodes = self.nodes()
        jobs = [AllocationJob(w.effective, snapshot, nodes, budget) for w, budget in batch]
        try:
            answers = await worker.allocate_batch(jobs, self.inventory(), turn)
        except BaseException as e:
            for w, _budget in batch:
                if w.future is None:
                    self._background.discard(w.key)  # searched again at its next reconcile
                    continue
                if w.future.done():
                    continue
                if isinstance(e, asyncio.CancelledError):
                    w.future.cancel()
                else:
                    w.future.set_exception(e)
            raise
        elapsed = time.monotonic() - now
        for (w, budget), answer in zip(batch, answers, strict=True):
            if answer.exhausted == NOT_RUN:
                if self.queue.is_slow(w.key):  # its namespace's claims ran out meanwhile
                    self._in_background(w)
                else:
                    self.queue.push(w.key, w, front=True)
                continue
            self.queue.charge(w.key, answer.seconds)
            if answer.exhausted == TURN_ENDED:
                self.queue.cut_short(w.key)
                self._in_background(w)
                continue
            stages.observe("search", elapsed)
            self._answer(w, replace(answer, budget=budget))
        self._wake()

    def _answer(self, w: _Waiting, answer: AllocationAnswer) -> None:
        if answer.allocation is None:
            self.queue.failed(w.key, slow=answer.exhausted == OUT_OF_TIME)
        else:
            self.queue.succeeded(w.key)
        if w.future is None:  # in the background: kept for the claim's next reconcile
            if w.key in self._background:
                self._background.discard(w.key)
                self._ready[w.key] = (w.effective, answer)
                self.context.enqueue(w.key)
            return
        if w.future.done():
            return  # its reconcile was cancelled: nothing is taken for it
        try:
            allocation = None if answer.allocation is None else self._take(w.key, answer, w.request)
        except Exception as e:
            w.future.set_exception(e)
            return
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
            budget = answer.budget or self.timeout
            halved = (
                ""
                if budget >= self.timeout
                else f" of {self.timeout:g} s, halved for each earlier failed search"
            )
            return (
                f"no allocation found within the {budget:g} s allocation "
                f"budget (--allocation-timeout{halved}); retrying with backoff"
            )
        return answer.message or "cannot be allocated"
