"""The claim reconciler's writes overlap where nothing depends on them: the finalizer patch
is in flight while the search runs (the allocation is written after it, at the version it
returned), and the ``Allocated`` event does not hold up the worker. Real allocation worker,
the fake apiserver."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from controller.claims.reconciler import EVENTS_IN_FLIGHT, ClaimReconciler
from controller.claims.worker import AllocationJob, AllocationWorker, run_batch
from dradriver.allocator import AllocatedState, Allocator, SliceInventory, node_info
from dradriver.api.wellknown import ALLOCATION_ANNOTATION, FINALIZER
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer
from tests.unit.controller.claims.test_worker import (
    GPU,
    NODES,
    claim_path,
    gpu_reconciler,
    immediate,
    run,
)
from tests.unit.dradriver.allocator.builders import claim as bare_claim
from tests.unit.dradriver.allocator.builders import device, node_slice
from tests.unit.dradriver.allocator.builders import request as bare_request
from tests.unit.dradriver.runtime.test_leaderelection import eventually


class HeldFinalizerAPI(FakeAPIServer):
    """Holds every finalizer patch until ``release`` is set (the apiserver is slow)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.held = 0

    async def merge_patch(self, path: str, body: Obj) -> Obj:
        if not path.endswith("/status") and FINALIZER in body["metadata"].get("finalizers", []):
            self.held += 1
            await self.release.wait()
        return await super().merge_patch(path, body)


def new_claim(name: str) -> Obj:
    """Immediate, without our finalizer yet (a claim just created)."""
    obj = bare_claim(name, bare_request("r", count=1))
    obj["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: "Immediate"}
    return obj


def reconciler(api: FakeAPIServer, worker: AllocationWorker, *claims: Obj) -> ClaimReconciler:
    informer = FakeInformer(*(api.put(claim_path(c["metadata"]["name"]), c) for c in claims))
    return gpu_reconciler(api, informer, worker=worker)


@pytest.fixture(scope="module")
def worker() -> Iterator[AllocationWorker]:
    shared = AllocationWorker()
    yield shared
    run(shared.close())


def claim_writes(api: FakeAPIServer, name: str) -> list[str]:
    path = claim_path(name)
    return [
        "status" if w.path.endswith("/status") else "metadata"
        for w in api.history
        if w.path.startswith(path)
    ]


def test_the_search_runs_while_the_finalizer_write_is_in_flight(worker: AllocationWorker) -> None:
    async def scenario() -> None:
        api = HeldFinalizerAPI()
        rec = reconciler(api, worker, new_claim("c"))
        jobs = worker.stats.jobs
        task = asyncio.create_task(rec("ns/c"))
        # Done one after the other, the search would wait for the held patch: never sent.
        await eventually(
            "the search sent with the finalizer write held", lambda: worker.stats.jobs == jobs + 1
        )
        assert not task.done() and api.held == 1 and claim_writes(api, "c") == []
        api.release.set()
        await task
        stored = api.stored(claim_path("c"))
        assert stored is not None and FINALIZER in stored["metadata"]["finalizers"]
        assert stored["status"]["allocation"]["devices"]["results"]
        assert claim_writes(api, "c") == ["metadata", "status"]  # finalizer first

    run(scenario())


def test_a_failed_finalizer_write_writes_no_allocation_and_gives_the_devices_back(
    worker: AllocationWorker,
) -> None:
    async def scenario() -> None:
        api = FakeAPIServer()
        rec = reconciler(api, worker, new_claim("c"))
        api.fail("PATCH", claim_path("c"), 409, times=1)
        with pytest.raises(KubeAPIError):
            await rec("ns/c")
        stored = api.stored(claim_path("c"))
        assert stored is not None and "allocation" not in (stored.get("status") or {})
        assert "ns/c" not in rec.holdings.state.claims() and not rec.holdings.inflight
        await rec("ns/c")  # the retry allocates
        stored = api.stored(claim_path("c"))
        assert stored is not None and stored["status"]["allocation"]

    run(scenario())


def test_the_allocated_event_is_posted_after_the_reconcile_returns(
    worker: AllocationWorker,
) -> None:
    """The event waits for nothing of ours: the reconcile returns with it still on its way."""

    class HeldEventAPI(FakeAPIServer):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()

        async def create(self, path: str, body: Obj) -> Obj:
            if body.get("kind") == "Event":
                await self.release.wait()
            return await super().create(path, body)

    async def scenario() -> None:
        api = HeldEventAPI()
        rec = reconciler(api, worker, new_claim("c"))
        await asyncio.wait_for(rec("ns/c"), 60)  # would hang if the event were awaited
        assert rec.events.posted == 0
        api.release.set()
        await eventually("the event posted", lambda: rec.events.posted == 1)

    run(scenario())


def test_allocated_events_are_posted_at_most_two_at_a_time(worker: AllocationWorker) -> None:
    """A burst of allocations does not become a burst of event POSTs beside the writes
    claims wait for; every event still goes out."""

    class CountingEventAPI(FakeAPIServer):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()
            self.in_flight = 0
            self.most = 0

        async def create(self, path: str, body: Obj) -> Obj:
            if body.get("kind") == "Event":
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
                await self.release.wait()
                self.in_flight -= 1
            return await super().create(path, body)

    async def scenario() -> None:
        api = CountingEventAPI()
        rec = reconciler(api, worker, *(new_claim(f"c-{i}") for i in range(6)))
        await asyncio.wait_for(asyncio.gather(*(rec(f"ns/c-{i}") for i in range(6))), 60)
        await eventually("two events on their way", lambda: api.in_flight == EVENTS_IN_FLIGHT)
        api.release.set()
        await eventually("every event posted", lambda: rec.events.posted == 6)
        assert api.most == EVENTS_IN_FLIGHT

    run(scenario())


def test_claims_waiting_together_go_in_one_batch_and_get_distinct_devices(
    worker: AllocationWorker,
) -> None:
    async def scenario() -> None:
        api = FakeAPIServer()
        claims = [immediate(new_claim(f"c-{i}")) for i in range(8)]
        rec = reconciler(api, worker, *claims)
        batches, jobs = worker.stats.batches, worker.stats.jobs
        await asyncio.gather(*(rec(f"ns/c-{i}") for i in range(8)))
        assert worker.stats.jobs == jobs + 8
        assert worker.stats.batches == batches + 1  # one round trip for the eight
        devices = set()
        for i in range(8):
            stored = api.stored(claim_path(f"c-{i}"))
            assert stored is not None
            (result,) = stored["status"]["allocation"]["devices"]["results"]
            devices.add((result["pool"], result["device"]))
        assert len(devices) == 8

    run(scenario())


def test_a_batch_sees_what_its_earlier_claims_got_and_leaves_the_holdings_as_they_were() -> None:
    """In the child: two claims for the only device; the second finds it taken. After the
    batch the child's copy of the holdings is the parent's again."""
    only = (node_slice("node-1", [device("dev-0", {"group": 0})]),)
    allocator = Allocator(SliceInventory(only, (GPU,)))
    state = AllocatedState()
    nodes = tuple(node_info(n) for n in NODES[:1])
    jobs = [
        AllocationJob(bare_claim(name, bare_request("r", count=1)), {}, nodes, 10.0)
        for name in ("a", "b")
    ]
    first, second = run_batch(allocator, state, jobs)
    assert first.allocation is not None and second.allocation is None
    assert state.snapshot() == {}
