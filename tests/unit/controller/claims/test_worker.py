"""The allocator's search off the event loop: the child process, its budget, and what the
ClaimReconciler does with its answers (real child processes, the fake apiserver)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest

from controller.claims.context import ClaimContext, ClaimSettings, ClaimSources
from controller.claims.reconciler import ClaimReconciler
from controller.claims.scheduler import SchedulerActivity
from controller.claims.slicesync import SliceDelta, SliceSnapshot
from controller.claims.worker import (
    NOT_RUN,
    TURN_ENDED,
    AllocationJob,
    AllocationWorker,
)
from dradriver.allocator import AllocatedState, node_info
from dradriver.api.wellknown import ALLOCATION_ANNOTATION, FINALIZER, STATUS_ANNOTATION
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import RequeueAfter
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer
from tests.unit.dradriver.allocator.builders import DRIVER, device, device_class, node, node_slice
from tests.unit.dradriver.allocator.builders import claim as bare_claim
from tests.unit.dradriver.allocator.builders import request as bare_request
from tests.unit.dradriver.runtime.test_leaderelection import eventually

GPU = device_class()
NODES = [node(f"node-{i}") for i in range(1, 9)]


def slices(per_node: int = 32) -> tuple[Obj, ...]:
    """Every node: ``per_node`` devices whose attribute ``group`` takes 16 values."""
    return tuple(
        node_slice(
            n["metadata"]["name"],
            [device(f"dev-{i}", {"group": i % 16}) for i in range(per_node)],
        )
        for n in NODES
    )


def gpu_reconciler(
    api: FakeAPIServer,
    claims: FakeInformer,
    settings: ClaimSettings | None = None,
    *,
    worker: AllocationWorker,
    slow_worker: AllocationWorker | None = None,
    scheduler: SchedulerActivity | None = None,
) -> ClaimReconciler:
    """A reconciler for the builders' driver over ``claims``: the GPU class, :func:`slices`
    and NODES, no parameters."""
    return ClaimReconciler(
        ClaimContext.create(
            cast(Any, api),
            "dradriver.dev",
            cast(Any, claims),
            scheduler=scheduler,
            allocation_drivers=[DRIVER],
        ),
        ClaimSources(
            cast(Any, FakeInformer()),
            cast(Any, FakeInformer(*slices())),
            cast(Any, FakeInformer(GPU)),
            cast(Any, FakeInformer(*NODES)),
        ),
        settings,
        worker=worker,
        slow_worker=slow_worker,
    )


def pathological(name: str = "patho", count: int = 17) -> Obj:
    """``count`` devices with pairwise distinct ``group``: 17 cannot be had from 16 values,
    and the search only learns that by trying (about 1,000,000 steps per node)."""
    return bare_claim(
        name,
        bare_request("r", count=count),
        constraints=[{"distinctAttribute": f"{DRIVER}/group"}],
    )


def job(claim: Obj, budget: float = 60.0, state: AllocatedState | None = None) -> AllocationJob:
    return AllocationJob.of(claim, state or AllocatedState(), [node_info(n) for n in NODES], budget)


INVENTORY = SliceSnapshot(1, slices(), (GPU,))


def run(coro: Any) -> Any:
    # A guard against a hang only: a worker that failed to stop a search would block here.
    return asyncio.run(asyncio.wait_for(coro, 120))


@pytest.fixture(scope="module")
def worker() -> Iterator[AllocationWorker]:
    shared = AllocationWorker()
    yield shared
    run(shared.close())


def result_for(pool: str, device: str) -> Obj:
    return {"request": "r", "driver": DRIVER, "pool": pool, "device": device}


def devices_of(allocation: Obj) -> list[tuple[str, str]]:
    return [(r["pool"], r["device"]) for r in allocation["devices"]["results"]]


# --- the worker ------------------------------------------------------------------------


def test_allocates_in_a_child_that_keeps_its_inventory(worker: AllocationWorker) -> None:
    async def scenario() -> None:
        sent = worker.stats.inventories_sent
        answer = await worker.allocate(job(pathological(count=16)), INVENTORY)
        assert answer.allocation is not None and answer.exhausted is None
        assert devices_of(answer.allocation) == [("node-1", f"dev-{i}") for i in range(16)]
        assert worker.pid is not None and worker.pid != os.getpid()
        # The state of the job counts: the next claim gets the next devices.
        state = AllocatedState()
        state.add("ns/first", answer.allocation)
        answer = await worker.allocate(job(pathological("b", count=2), state=state), INVENTORY)
        assert answer.allocation is not None
        assert devices_of(answer.allocation) == [("node-1", "dev-16"), ("node-1", "dev-17")]
        assert worker.stats.inventories_sent == sent + 1  # the child kept it
        # The child's copy of the holdings follows removals and changes too.
        state.remove("ns/first")
        state.add("ns/other", {"devices": {"results": [result_for("node-1", "dev-0")]}})
        answer = await worker.allocate(job(pathological("b", count=2), state=state), INVENTORY)
        assert answer.allocation is not None
        assert devices_of(answer.allocation) == [("node-1", "dev-1"), ("node-1", "dev-2")]
        changed = SliceSnapshot(2, slices(per_node=2), (GPU,))
        answer = await worker.allocate(job(pathological(count=2)), changed)
        assert answer.allocation is not None
        assert worker.stats.inventories_sent == sent + 2
        answer = await worker.allocate(job(pathological(count=3)), changed)
        assert answer.allocation is None
        assert "needs 3 device(s) usable from one node" in answer.message

    run(scenario())


def test_a_slice_change_sends_that_slice_alone(worker: AllocationWorker) -> None:
    """A snapshot that differs in one slice sends that slice; one without a slice sends
    its name; what the child allocates from follows both."""

    async def scenario() -> None:
        base = list(slices(per_node=2))
        answer = await worker.allocate(
            job(pathological(count=2)), SliceSnapshot(100, tuple(base), (GPU,))
        )
        assert answer.allocation is not None
        sent = worker.stats.slices_sent
        # node-1's slice is replaced by one with a third device: only it travels.
        base[0] = node_slice("node-1", [device(f"dev-{i}", {"group": i}) for i in range(3)])
        answer = await worker.allocate(
            job(pathological(count=3)), SliceSnapshot(101, tuple(base), (GPU,))
        )
        assert answer.allocation is not None
        assert devices_of(answer.allocation) == [("node-1", f"dev-{i}") for i in range(3)]
        assert worker.stats.slices_sent == sent + 1
        # The same slices again in new objects of the same resourceVersion: none travels.
        versioned = [
            {**s, "metadata": {**s["metadata"], "resourceVersion": str(k)}}
            for k, s in enumerate(base)
        ]
        await worker.allocate(
            job(pathological(count=2)), SliceSnapshot(102, tuple(versioned), (GPU,))
        )
        assert worker.stats.slices_sent == sent + 1 + len(base)
        copies = [{**s, "metadata": dict(s["metadata"])} for s in versioned]
        await worker.allocate(job(pathological(count=2)), SliceSnapshot(103, tuple(copies), (GPU,)))
        assert worker.stats.slices_sent == sent + 1 + len(base)
        # node-1's slice is gone: its devices with it.
        answer = await worker.allocate(
            job(pathological(count=3)), SliceSnapshot(104, tuple(copies[1:]), (GPU,))
        )
        assert answer.allocation is None
        assert worker.stats.slices_sent == sent + 1 + len(base)

    run(scenario())


def test_the_child_keeps_the_nodes_until_it_is_sent_other_ones(
    worker: AllocationWorker,
) -> None:
    """One tuple of nodes is sent once; another tuple (a node gone) replaces it."""

    async def scenario() -> None:
        both = tuple(node_info(n) for n in NODES)
        second = both[1:]
        state = AllocatedState()
        sent = worker.stats.nodes_sent
        for _ in range(2):
            answer = await worker.allocate(
                AllocationJob.of(pathological(count=1), state, both, 60.0), INVENTORY
            )
            assert answer.allocation is not None
            assert devices_of(answer.allocation)[0][0] == "node-1"
        assert worker.stats.nodes_sent == sent + 1
        answer = await worker.allocate(
            AllocationJob.of(pathological(count=1), state, second, 60.0), INVENTORY
        )
        assert answer.allocation is not None
        assert devices_of(answer.allocation)[0][0] == second[0].name != "node-1"
        assert worker.stats.nodes_sent == sent + 2

    run(scenario())


def test_a_search_out_of_time_is_an_answer_and_the_child_stays(worker: AllocationWorker) -> None:
    async def scenario() -> None:
        await worker.allocate(job(pathological(count=1)), INVENTORY)
        pid, starts = worker.pid, worker.stats.starts
        answer = await worker.allocate(job(pathological(), budget=0.2), INVENTORY)
        assert answer.allocation is None and answer.exhausted == "time"
        assert answer.message == "search ran out of time without a result"
        assert (worker.pid, worker.stats.starts) == (pid, starts)

    run(scenario())


KILL_MARGIN = 2.0
"""Seconds past budget + grace by which a stuck child must be gone (a kill and a reap on a
loaded machine take a fraction of that; a child that is not killed never answers)."""


def test_a_child_that_stops_answering_is_killed_within_its_budget_and_replaced() -> None:
    async def scenario() -> None:
        worker = AllocationWorker(grace=0.2)
        try:
            assert (await worker.allocate(job(pathological(count=1)), INVENTORY)).allocation
            stuck = worker.pid
            assert stuck is not None
            # The fault: SIGSTOP on the real child, which then never answers (as a selector
            # stuck in C would). The budget and the grace pass, and the child is killed.
            os.kill(stuck, signal.SIGSTOP)
            began = time.monotonic()
            answer = await asyncio.wait_for(
                worker.allocate(job(pathological(count=1), budget=0.5), INVENTORY),
                0.5 + 0.2 + KILL_MARGIN,  # the deadline: budget + grace + margin
            )
            assert time.monotonic() - began >= 0.5 + 0.2  # not before its budget and grace
            assert answer.allocation is None and answer.exhausted == "time"
            assert answer.message == "no answer within the budget of 0.5 s (stopped)"
            assert worker.stats.kills == 1
            with pytest.raises(ProcessLookupError):
                os.kill(stuck, 0)  # gone (and reaped)
            answer = await worker.allocate(job(pathological(count=1)), INVENTORY)
            assert answer.allocation is not None
            assert worker.pid not in (None, stuck) and worker.stats.starts == 2
        finally:
            await worker.close()

    run(scenario())


def test_a_stuck_batch_with_a_turn_is_killed_at_the_turn_not_the_sum_of_its_budgets() -> None:
    """A batch of fresh searches may take its turn, not the sum of its jobs' budgets: a
    child stuck in it is killed at turn + grace (here 0.4 s, against 3 x 30 s)."""

    async def scenario() -> None:
        worker = AllocationWorker(grace=0.2)
        try:
            await worker.start()
            stuck = worker.pid
            assert stuck is not None
            os.kill(stuck, signal.SIGSTOP)  # the fault, as above
            jobs = [job(pathological(f"c{i}", count=1), budget=30.0) for i in range(3)]
            answers = await asyncio.wait_for(
                worker.allocate_batch(jobs, INVENTORY, turn=0.2), 0.2 + 0.2 + KILL_MARGIN
            )
            assert [a.message for a in answers] == [
                "no answer within the budget of 0.2 s (stopped)"
            ] * 3
            with pytest.raises(ProcessLookupError):
                os.kill(stuck, 0)
        finally:
            await worker.close()

    run(scenario())


def test_a_batch_turn_cuts_the_search_short_and_leaves_the_rest_unrun(
    worker: AllocationWorker,
) -> None:
    async def scenario() -> None:
        jobs = [job(pathological(f"p{i}"), budget=30.0) for i in range(2)]
        jobs.append(job(pathological("easy", count=1), budget=30.0))
        answers = await worker.allocate_batch(jobs, INVENTORY, turn=0.3)
        assert [a.exhausted for a in answers] == [TURN_ENDED, NOT_RUN, NOT_RUN]
        assert 0.3 <= answers[0].seconds < 0.3 + KILL_MARGIN

    run(scenario())


def test_cancelling_a_job_kills_the_child() -> None:
    async def scenario() -> None:
        worker = AllocationWorker()
        try:
            assert (await worker.allocate(job(pathological(count=1)), INVENTORY)).allocation
            searching = worker.pid
            task = asyncio.create_task(worker.allocate(job(pathological(), 3600), INVENTORY))
            await eventually("the job in the I/O thread", lambda: worker.stats.jobs == 2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The next job queues behind the cancelled one: it is answered only because
            # the hour-long search was stopped.
            answer = await worker.allocate(job(pathological(count=1)), INVENTORY)
            assert answer.allocation is not None
            assert worker.stats.kills == 1 and worker.pid != searching
        finally:
            await worker.close()

    run(scenario())


# --- the reconciler with the worker ------------------------------------------------------


def immediate(claim: Obj) -> Obj:
    claim["metadata"].update(
        {"annotations": {ALLOCATION_ANNOTATION: "Immediate"}, "finalizers": [FINALIZER]}
    )
    return claim


def claim_path(name: str) -> str:
    return path_for(RESOURCE_V1, "resourceclaims", "ns", name)


class Rig:
    def __init__(self, worker: AllocationWorker, budget: float, *claims: Obj) -> None:
        self.api = FakeAPIServer()
        self.claims = FakeInformer(
            *(self.api.put(claim_path(c["metadata"]["name"]), c) for c in claims)
        )
        self.rec = gpu_reconciler(
            self.api, self.claims, ClaimSettings(allocation_timeout=budget), worker=worker
        )

    def stored(self, name: str) -> Obj:
        obj = self.api.stored(claim_path(name))
        assert obj is not None
        return obj

    def events(self) -> list[tuple[str, str]]:
        prefix = path_for("v1", "events", "ns") + "/"
        return [
            (o["reason"], o["message"])
            for path, o in sorted(self.api.objects.items())
            if path.startswith(prefix)
        ]


def test_a_claim_out_of_budget_is_told_so_and_retried_only_after_its_backoff(
    worker: AllocationWorker,
) -> None:
    async def scenario() -> None:
        rig = Rig(worker, 0.3, immediate(pathological()))
        with pytest.raises(RequeueAfter) as first:
            await rig.rec("ns/patho")
        message = (
            "no allocation found within the 0.3 s allocation budget (--allocation-timeout); "
            "retrying with backoff"
        )
        assert rig.stored("patho")["metadata"]["annotations"][STATUS_ANNOTATION] == message
        assert rig.events() == [("AllocationFailed", message)]
        assert first.value.delay == 1.0
        # Enqueued again at once (its own annotation write, a slice changing): no new
        # search until the backoff delay has passed, each one would cost a budget.
        jobs = worker.stats.jobs
        with pytest.raises(RequeueAfter) as again:
            await rig.rec("ns/patho")
        assert worker.stats.jobs == jobs
        assert 0 < again.value.delay <= 1.0
        assert "allocation" not in rig.stored("patho").get("status", {})

    run(scenario())


def test_the_reconciler_writes_what_the_worker_found(worker: AllocationWorker) -> None:
    async def scenario() -> None:
        rig = Rig(worker, 10.0, immediate(pathological(count=16)))
        await rig.rec("ns/patho")
        allocation = rig.stored("patho")["status"]["allocation"]
        assert devices_of(allocation) == [("node-1", f"dev-{i}") for i in range(16)]
        assert allocation["allocationTimestamp"]

    run(scenario())


def test_a_device_taken_during_the_search_is_not_written() -> None:
    async def scenario() -> None:
        worker = AllocationWorker()
        try:
            rig = Rig(worker, 60.0, immediate(pathological(count=1)))
            await worker.allocate(job(pathological(count=1)), INVENTORY)  # a warm child
            assert worker.pid is not None
            os.kill(worker.pid, signal.SIGSTOP)  # the search cannot answer yet
            task = asyncio.create_task(rig.rec("ns/patho"))
            # The reconciler took its snapshot and sent the job.
            await eventually("the job in the I/O thread", lambda: worker.stats.jobs == 2)
            # Meanwhile the informer shows another claim taking the device it will find.
            other = pathological("other", count=1)
            other["status"] = {
                "allocation": {"devices": {"results": [result_for("node-1", "dev-0")]}}
            }
            rig.claims.apply(other)
            os.kill(worker.pid, signal.SIGCONT)
            with pytest.raises(RequeueAfter, match="ns/other took a device during the search"):
                await task
            assert "allocation" not in rig.stored("patho").get("status", {})
            assert "ns/patho" not in rig.rec.holdings.inflight
            # Looked at again, it gets the next device.
            await rig.rec("ns/patho")
            allocation = rig.stored("patho")["status"]["allocation"]
            assert devices_of(allocation) == [("node-1", "dev-1")]
        finally:
            await worker.close()

    run(scenario())


def test_a_slice_delta_carries_what_the_childs_copy_lacks() -> None:
    def sl(name: str, version: str = "") -> Obj:
        meta = {"name": name, **({"resourceVersion": version} if version else {})}
        return {"metadata": meta, "spec": {}}

    same, unversioned = sl("a", "1"), sl("u")
    child = {
        "a": same,
        "b": sl("b", "7"),
        "c": sl("c", "8"),
        "gone": sl("gone", "9"),
        "u": unversioned,
    }
    snapshot = SliceSnapshot(5, (same, sl("b", "7"), sl("c", "9"), sl("d", "1"), sl("u")), (GPU,))
    delta = SliceDelta.between(child, snapshot)
    assert [s["metadata"]["name"] for s in delta.changed] == ["c", "d", "u"]
    assert delta.removed == ("gone",) and not delta.reset
    delta.apply(child)
    assert sorted(child) == ["a", "b", "c", "d", "u"]
    assert child["a"] is same and child["c"]["metadata"]["resourceVersion"] == "9"
    first = SliceDelta.between({}, snapshot)
    assert first.reset and len(first.changed) == 5
