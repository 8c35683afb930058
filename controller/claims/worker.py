"""Allocation off the event loop: a child process that runs the allocator, within a budget.

The allocator's search is CPU-bound pure Python, and cel-expr-python holds the GIL while
it evaluates: run on the controller's event loop, one unsatisfiable claim (``count: 17``
with a ``distinctAttribute`` over 16 values) kept the loop busy for 17-28 s, longer than
the apiserver's webhook timeout and the Lease's renew deadline (a review waited 17.9 s).
In a thread the loop runs again, but shares the GIL with the search: webhook reviews
measured 23 ms at the median, 77 ms at worst while a search ran, against 6 ms and 47 ms
with the search in a child process (2-CPU dev VM). So allocations run in a child process
(:func:`main`), one at a time, and the event loop only awaits the answer.

* **Budget**: each job carries its wall-clock budget; the child gives the allocator that
  deadline (checked every few hundred search steps) and answers ``exhausted="time"``
  when it passes. A child that does not answer within the budget plus
  :data:`KILL_GRACE` (a selector stuck in C, a CEL worker timing out repeatedly) is
  killed, and the next job starts a new one.
* **Slices**: the child keeps the :class:`~dradriver.allocator.Allocator` of the last
  snapshot it was sent (with its selector-result cache). When the snapshot's generation
  changes, a job carries a :class:`~controller.claims.slicesync.SliceDelta`: the slices
  that changed since the child's copy (another object with another ``resourceVersion``),
  the names of those gone, and the DeviceClasses; a new child gets every slice. The
  child rebuilds its inventory over a :class:`~dradriver.allocator.inventory.PoolCache`,
  so one node's slice change re-sends and re-indexes that node's pool, not 5,000 (at
  40,000 devices a full rebuild cost 1.45 s in the child and 3.2 MiB on the pipe).
* **Nodes**: likewise, the child keeps the candidate nodes it was last sent; a batch sends
  them again only when the parent's tuple is another object (the parent makes a new one
  only when a node's name or labels change: not for every status update).
* **Holdings**: the child keeps its copy of what is allocated; a job carries a snapshot
  of the controller's (:meth:`~dradriver.allocator.AllocatedState.snapshot`), and only
  the claims whose entries changed since the child's copy go over the pipe. (Sending the
  whole state cost about 6 ms a job at 1,000 allocated claims.)
* **Cancellation**: a job whose awaiting coroutine is cancelled (leadership lost,
  shutdown) kills the child: nobody wants its answer.

* **Batches**: :meth:`AllocationWorker.allocate_batch` sends several claims in one
  round trip, all against the same holdings; the child allocates them one after the
  other, each against the holdings plus what the batch's earlier claims got, so no two
  of a batch get the same device (then it forgets the batch's allocations: its copy
  stays the parent's). A round trip costs far more than a small search (about 50 ms
  against 0.4-1.5 ms for one claim over 10,000 devices on the loaded 2-CPU dev VM: pipe,
  thread and process wake-ups), so claims that wait for the worker go together.
* **Turns**: a batch may be given a *turn*, seconds the whole batch may take: each job
  gets what is left of it (at most its budget); a job cut short by the turn is answered
  :data:`TURN_ENDED`, the jobs after it :data:`NOT_RUN` (see
  :mod:`controller.claims.fairqueue`). The child is killed at the turn plus the grace.

The process handling is :class:`dradriver.runtime.childworker.ChildWorker`'s. Protocol
(:data:`~dradriver.runtime.childworker.PICKLE_FRAMES`) on the child's stdin and (a
duplicate of) its stdout: frames of an 8-byte big-endian length and a pickle. The
parent sends ``(slice delta or None, nodes or None, changed, removed, jobs, turn)`` (the
holdings' changes, a list of jobs); the child answers a list of
:class:`AllocationAnswer` s, one per job, after a first ``("ready", pid)``. The child
evaluates callback selectors through :mod:`dradriver.cel.worker` as any allocator does.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from controller.claims.slicesync import SliceDelta, SliceSnapshot
from dradriver.allocator import (
    AllocatedState,
    Allocator,
    Held,
    NodeInfo,
    SliceInventory,
    claim_key,
    explain,
    summarize,
)
from dradriver.allocator.inventory import PoolCache
from dradriver.allocator.outcome import OUT_OF_TIME
from dradriver.k8s.objects import Obj
from dradriver.log import get_logger
from dradriver.runtime.childworker import (
    PICKLE_FRAMES,
    ChildEnd,
    ChildWorker,
    WorkerError,
    WorkerStats,
    WorkerTimeout,
)

__all__ = [
    "KILL_GRACE",
    "NOT_RUN",
    "TURN_ENDED",
    "AllocationAnswer",
    "AllocationJob",
    "AllocationStats",
    "AllocationWorker",
    "main",
    "run_batch",
    "run_job",
]

log = get_logger("controller")

KILL_GRACE = 10.0
"""Seconds past its budget a job may take before the child is killed (one CEL worker
evaluation may take 5 s before it is stopped; the inventory is unpickled and indexed)."""
START_TIMEOUT = 60.0
TURN_ENDED = "turn"
"""``exhausted`` of a job cut short by its batch's turn (not by its own budget)."""
NOT_RUN = "not-run"
"""``exhausted`` of a job not started: its batch's turn had ended."""
_CHILD = "from controller.claims.worker import main; main()"


@dataclass(frozen=True)
class AllocationJob:
    """One claim to allocate against what is held (an :meth:`AllocatedState.snapshot`),
    within ``budget`` s."""

    claim: Obj
    holdings: Mapping[str, tuple[Held, ...]]
    nodes: tuple[NodeInfo, ...]
    budget: float

    @classmethod
    def of(
        cls, claim: Obj, state: AllocatedState, nodes: Sequence[NodeInfo], budget: float
    ) -> AllocationJob:
        return cls(claim, state.snapshot(), tuple(nodes), budget)


@dataclass(frozen=True)
class AllocationAnswer:
    """The allocation, or why not (``message``, the explanation's summary).

    ``exhausted``: ``"time"`` when the budget ran out, ``"steps"`` when the allocator's
    step budget did (on some node), :data:`TURN_ENDED` or :data:`NOT_RUN` (the batch's
    turn), else None. ``budget``: the seconds the search was given (set by the parent).
    """

    allocation: Obj | None
    message: str = ""
    exhausted: str | None = None
    seconds: float = 0.0
    budget: float = 0.0


@dataclass
class AllocationStats(WorkerStats):
    """``kills``: over budget, cancelled, or broken."""

    jobs: int = 0
    inventories_sent: int = 0  # round trips that sent a slice delta
    slices_sent: int = 0  # slices in those deltas
    nodes_sent: int = 0  # round trips that sent the candidate nodes
    batches: int = 0  # round trips (a batch of one or more jobs each)


def _ready(message: Any) -> bool:
    return isinstance(message, tuple) and message[:1] == ("ready",)


def run_job(allocator: Allocator, state: AllocatedState, job: AllocationJob) -> AllocationAnswer:
    """Allocate ``job`` with ``allocator`` against ``state`` (the child's copy of the
    job's holdings), explaining a failure."""
    started = time.monotonic()
    deadline = started + job.budget
    outcome = allocator.allocate([job.claim], state, nodes=job.nodes, deadline=deadline)
    if outcome.ok and outcome.allocations is not None:
        return AllocationAnswer(outcome.allocations[0], seconds=time.monotonic() - started)
    if outcome.exhausted == OUT_OF_TIME:
        message = outcome.error or "out of time"
    else:
        rows = explain(
            allocator, job.claim, state, nodes=job.nodes, outcome=outcome, deadline=deadline
        )
        message = summarize(rows) or outcome.error or "cannot be allocated"
    return AllocationAnswer(None, message, outcome.exhausted, seconds=time.monotonic() - started)


class AllocationWorker:
    """Runs :class:`AllocationJob` s in a child process, one at a time (FIFO).

    :meth:`allocate` is a coroutine for any event loop; the blocking pipe I/O happens in
    one thread of its own, so jobs from several loops queue behind each other.
    """

    def __init__(
        self, grace: float = KILL_GRACE, command: Sequence[str] | None = None, nice: int = 0
    ) -> None:
        """``nice``: added to the child's niceness (a lower CPU priority: the slow lane's
        searches yield the CPU to the fresh lane, the event loop and the webhook)."""
        self.grace = grace
        self.stats = AllocationStats()
        child = f"import os; os.nice({int(nice)}); {_CHILD}" if nice else _CHILD
        self._child = ChildWorker(
            command or [sys.executable, "-c", child],
            PICKLE_FRAMES,
            _ready,
            start_timeout=START_TIMEOUT,
            stats=self.stats,
        )
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="allocation-worker")
        self._generation: int | None = None  # the inventory the child holds
        self._slices: dict[str, Obj] = {}  # its slices, by name
        self._nodes: tuple[NodeInfo, ...] | None = None  # the nodes the child holds
        self._holdings: Mapping[str, tuple[Held, ...]] = {}  # the child's copy of them

    @property
    def command(self) -> list[str]:
        """The child's command line; a change applies from the next child on."""
        return self._child.command

    async def allocate(self, job: AllocationJob, inventory: SliceSnapshot) -> AllocationAnswer:
        """The child's answer; a child that fails or overruns is an answer too, not raised."""
        return (await self.allocate_batch([job], inventory))[0]

    async def allocate_batch(
        self, jobs: Sequence[AllocationJob], inventory: SliceSnapshot, turn: float | None = None
    ) -> list[AllocationAnswer]:
        """One answer per job, in order (module docstring, *Batches*, *Turns*); the jobs
        share the first one's holdings and nodes. A failure or an overrun answers every job."""
        loop = asyncio.get_running_loop()
        abandoned = threading.Event()
        future = loop.run_in_executor(
            self._executor, self._roundtrip, list(jobs), inventory, abandoned, turn
        )
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # Nobody wants the answer: the round trip ends (or is skipped) at once.
            abandoned.set()
            self._child.interrupt()
            raise

    async def start(self) -> None:
        """Start the child now (the fresh lane's, when leadership is won) rather than at
        the first job; a child that fails to start is logged, and the first job tries
        again."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._start)
        except (WorkerError, OSError) as e:
            log.warning("allocation worker did not start", error=str(e))

    async def close(self) -> None:
        """Stop the child (it exits at the end of its input) and the I/O thread."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._stop, False)
        self._executor.shutdown(wait=False)

    @property
    def pid(self) -> int | None:
        return self._child.pid

    # --- in the I/O thread --------------------------------------------------------------

    def _start(self) -> None:
        try:
            if self._child.ensure_started():
                self._forget()
        except WorkerError:
            self._stop(kill=True)
            raise

    def _roundtrip(
        self,
        jobs: list[AllocationJob],
        inventory: SliceSnapshot,
        abandoned: threading.Event,
        turn: float | None = None,
    ) -> list[AllocationAnswer]:
        def every(answer: AllocationAnswer) -> list[AllocationAnswer]:
            return [answer] * len(jobs)

        if abandoned.is_set():
            return every(AllocationAnswer(None, "abandoned"))
        self.stats.jobs += len(jobs)
        self.stats.batches += 1
        started = time.monotonic()
        budget = sum(job.budget for job in jobs)
        if turn is not None:
            budget = min(budget, turn)
        try:
            if self._child.ensure_started():
                self._forget()
            if abandoned.is_set():  # cancelled meanwhile
                return every(AllocationAnswer(None, "abandoned"))
            reply = self._exchange(jobs, inventory, turn, budget + self.grace)
        except WorkerTimeout:
            self._stop(kill=True)
            log.warning(
                "allocation worker overran its budget: stopped",
                budget=budget,
                grace=self.grace,
            )
            return every(
                AllocationAnswer(
                    None,
                    f"no answer within the budget of {budget:g} s (stopped)",
                    OUT_OF_TIME,
                    seconds=time.monotonic() - started,
                )
            )
        except WorkerError as e:
            self._stop(kill=True)
            return every(AllocationAnswer(None, f"the allocating process failed: {e}"))
        if not (
            isinstance(reply, list)
            and len(reply) == len(jobs)
            and all(isinstance(a, AllocationAnswer) for a in reply)
        ):
            self._stop(kill=True)
            return every(AllocationAnswer(None, f"the allocating process answered {reply!r}"))
        return reply

    def _exchange(
        self,
        jobs: list[AllocationJob],
        inventory: SliceSnapshot,
        turn: float | None,
        timeout: float,
    ) -> Any:
        """Send the jobs with what the child lacks (module docstring); its reply."""
        send = None
        if self._generation != inventory.generation:
            send = SliceDelta.between(self._slices, inventory)
        nodes = jobs[0].nodes
        send_nodes = nodes if nodes is not self._nodes else None
        base = self._holdings
        holdings = jobs[0].holdings
        changed = {k: v for k, v in holdings.items() if base.get(k) is not v}
        removed = [k for k in base if k not in holdings]
        bare = [replace(job, holdings={}, nodes=()) for job in jobs]
        self._child.send((send, send_nodes, changed, removed, bare, turn))
        self._holdings = holdings
        if send_nodes is not None:
            self.stats.nodes_sent += 1
            self._nodes = nodes
        if send is not None:
            self.stats.inventories_sent += 1
            self.stats.slices_sent += len(send.changed)
            self._generation = inventory.generation
            self._slices = inventory.by_name
        return self._child.receive(timeout)

    def _stop(self, kill: bool) -> None:
        self._child.stop(kill)
        self._forget()

    def _forget(self) -> None:
        """A new (or no) child: it holds nothing yet."""
        self._generation, self._nodes, self._holdings = None, None, {}
        self._slices = {}


def main() -> None:
    """The child: answer jobs from stdin until it closes."""
    end = ChildEnd(PICKLE_FRAMES, ignore_sigint=True)
    end.send(("ready", os.getpid()))
    allocator: Allocator | None = None
    state = AllocatedState()
    nodes: tuple[NodeInfo, ...] = ()
    slices: dict[str, Obj] = {}
    pools = PoolCache()
    for payload in end.requests():
        delta, sent_nodes, changed, removed, jobs, turn = PICKLE_FRAMES.decode(payload)
        state.update(changed, removed)
        if sent_nodes is not None:
            nodes = sent_nodes  # kept: one object, so the allocator's node order is too
        jobs = [replace(job, nodes=nodes) for job in jobs]
        try:
            if delta is not None:
                delta.apply(slices)
                allocator = Allocator(SliceInventory(slices.values(), delta.classes, pools=pools))
            if allocator is None:
                raise RuntimeError("no inventory was sent")
            answers = run_batch(allocator, state, jobs, turn)
        except Exception as e:  # a bug must cost the claims, not the worker
            failed = AllocationAnswer(None, f"allocation failed: {type(e).__name__}: {e}")
            answers = [failed] * len(jobs)
        end.send(answers)


def run_batch(
    allocator: Allocator,
    state: AllocatedState,
    jobs: Sequence[AllocationJob],
    turn: float | None = None,
) -> list[AllocationAnswer]:
    """Run ``jobs`` in order, each against ``state`` plus what the earlier ones got, within
    ``turn`` seconds in all if given (module docstring, *Turns*); then ``state`` is as it
    was (the parent's copy)."""
    ends = None if turn is None else time.monotonic() + turn
    before: dict[str, tuple[Held, ...] | None] = {}
    answers: list[AllocationAnswer] = []
    try:
        for job in jobs:
            # The first job starts the turn: it has all of it, not the turn less the
            # time taken to get here (a turn as long as its budget never cuts it short).
            if ends is None or turn is None:
                left = job.budget
            else:
                left = turn if not answers else ends - time.monotonic()
            if left <= 0:
                answers.append(AllocationAnswer(None, "the batch's turn ended", NOT_RUN))
                continue
            answer = run_job(allocator, state, replace(job, budget=min(job.budget, left)))
            if answer.exhausted == OUT_OF_TIME and left < job.budget:
                answer = replace(answer, exhausted=TURN_ENDED)
            answers.append(answer)
            if answer.allocation is not None:
                key = claim_key(job.claim)
                if key not in before:
                    before[key] = state.held_by(key)
                state.add(key, answer.allocation)
    finally:
        for key, held in before.items():
            state.remove(key)
            if held is not None:
                state.update({key: held}, [])
    return answers


if __name__ == "__main__":
    main()
