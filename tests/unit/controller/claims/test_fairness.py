"""One namespace's unsatisfiable claims do not hold up another namespace's claim: the
reconciler with real allocation worker processes, the fake apiserver.

Without fair turns all of these fail: the searches ran first come first served, each for
its whole budget, so the other namespace's claim waited for every one ahead of it."""

from __future__ import annotations

import asyncio
import time

import pytest

from controller.claims.context import ClaimSettings
from controller.claims.worker import AllocationWorker
from dradriver.api.wellknown import STATUS_ANNOTATION
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import RequeueAfter
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer
from tests.unit.controller.claims.test_worker import (
    gpu_reconciler,
    immediate,
    run,
)
from tests.unit.dradriver.allocator.builders import DRIVER
from tests.unit.dradriver.allocator.builders import claim as bare_claim
from tests.unit.dradriver.allocator.builders import request as bare_request
from tests.unit.dradriver.runtime.test_leaderelection import eventually

MARGIN = 1.5
"""Seconds of slack on a loaded machine (pipes, process wake-ups, the fake apiserver)."""


def unsatisfiable(namespace: str, name: str) -> Obj:
    """17 devices with pairwise distinct ``group`` out of 16 values: each search runs to
    its budget."""
    return immediate(
        bare_claim(
            name,
            bare_request("r", count=17),
            constraints=[{"distinctAttribute": f"{DRIVER}/group"}],
            namespace=namespace,
        )
    )


def easy(namespace: str, name: str) -> Obj:
    return immediate(bare_claim(name, bare_request("r", count=1), namespace=namespace))


class Rig:
    def __init__(self, workers: list[AllocationWorker], budget: float, turn: float) -> None:
        self.api = FakeAPIServer()
        self.claims = FakeInformer()
        self.rec = gpu_reconciler(
            self.api,
            self.claims,
            ClaimSettings(allocation_timeout=budget, allocation_turn=turn, retry_base=0.01),
            worker=workers[0],
            slow_worker=workers[1] if len(workers) > 1 else None,
        )

    def add(self, claim: Obj) -> str:
        ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        self.claims.apply(self.api.put(path_for(RESOURCE_V1, "resourceclaims", ns, name), claim))
        return f"{ns}/{name}"

    def stored(self, key: str) -> Obj:
        ns, name = key.split("/")
        obj = self.api.stored(path_for(RESOURCE_V1, "resourceclaims", ns, name))
        assert obj is not None
        return obj

    def allocated(self, key: str) -> bool:
        return bool(self.stored(key).get("status", {}).get("allocation"))


async def settle(*tasks: asyncio.Task[None]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def reconcile_until_answered(rig: Rig, key: str, deadline: float) -> RequeueAfter | None:
    """Reconcile ``key`` as its re-enqueues would: a slow claim's reconcile returns at once
    (its search goes on in the background) and the next one, once the answer is there,
    takes it. The final verdict: None (allocated), or the RequeueAfter of a failure."""
    ready = rig.rec.searches._ready
    while True:
        try:
            await rig.rec(key)
            return None
        except RequeueAfter as e:
            if "slow lane" not in str(e):
                return e
        await eventually(f"{key}'s answer from the slow lane", lambda: key in ready, deadline)


@pytest.mark.parametrize("workers", [1, 2])
def test_another_namespaces_claim_queued_behind_unsatisfiable_ones_gets_the_first_turn(
    workers: int,
) -> None:
    """Three unsatisfiable claims of namespace ``a`` are queued first, a claim of
    namespace ``b`` last: ``b``'s is allocated within the first turns, while ``a``'s go on
    being searched in the slow lane, without holding their reconciles (first come first
    served, ``b``'s waited 3 x 2.5 s)."""

    async def scenario() -> None:
        pool = [AllocationWorker() for _ in range(workers)]
        try:
            for w in pool:
                await w.start()
            rig = Rig(pool, budget=2.5, turn=0.5)
            keys = [rig.add(unsatisfiable("a", f"unsat-{i}")) for i in range(3)]
            other = rig.add(easy("b", "easy"))
            began = time.monotonic()
            hostile = [asyncio.create_task(rig.rec(k)) for k in keys]
            await asyncio.wait_for(rig.rec(other), 2 * 0.5 + MARGIN)
            assert rig.allocated(other)
            assert time.monotonic() - began < 2 * 0.5 + MARGIN
            # a's reconciles returned (a claim worker each is free again); their searches
            # go on alone in the slow lane.
            for task in hostile:
                with pytest.raises(RequeueAfter, match="slow lane"):
                    await asyncio.wait_for(task, MARGIN)
            assert set(keys) <= rig.rec.searches._background | set(rig.rec.searches._ready)
        finally:
            for w in pool:
                await w.close()

    run(scenario())


def test_with_two_workers_a_claim_arriving_while_slow_searches_run_waits_for_none() -> None:
    """Once namespace ``a``'s claims are known slow they run in the second worker, alone,
    with their own budget: a claim of ``b`` created then is searched at once. A claim of
    ``a`` that can be satisfied is searched in the slow lane too (its namespace's claims
    ran out of time), and allocated from the answer kept for its next reconcile."""

    async def scenario() -> None:
        pool = [AllocationWorker(), AllocationWorker()]
        try:
            for w in pool:
                await w.start()
            rig = Rig(pool, budget=4.0, turn=0.3)
            keys = [rig.add(unsatisfiable("a", f"unsat-{i}")) for i in range(3)]
            hostile = [asyncio.create_task(rig.rec(k)) for k in keys]
            await asyncio.gather(*hostile, return_exceptions=True)
            searches = rig.rec.searches
            await eventually("a slow search running", lambda: pool[1].stats.jobs > 0, MARGIN)
            assert set(keys) <= searches._background
            other = rig.add(easy("b", "easy"))
            began = time.monotonic()
            await asyncio.wait_for(rig.rec(other), 0.3 + MARGIN)
            assert rig.allocated(other) and time.monotonic() - began < 0.3 + MARGIN
            mine = rig.add(easy("a", "easy"))
            assert await reconcile_until_answered(rig, mine, 4 * 4.0 + MARGIN) is None
            assert rig.allocated(mine)
            assert devices(rig, mine) != devices(rig, other)
        finally:
            for w in pool:
                await w.close()

    run(scenario())


def devices(rig: Rig, key: str) -> list[tuple[str, str]]:
    results = rig.stored(key)["status"]["allocation"]["devices"]["results"]
    return [(r["pool"], r["device"]) for r in results]


def test_a_claim_that_keeps_failing_gets_half_the_budget_each_time() -> None:
    async def scenario() -> None:
        worker = AllocationWorker()
        try:
            rig = Rig([worker], budget=2.0, turn=0.2)
            key = rig.add(unsatisfiable("a", "unsat"))
            messages = []
            for _ in range(3):
                failure = await reconcile_until_answered(rig, key, 2.0 + MARGIN)
                assert failure is not None
                messages.append(rig.stored(key)["metadata"]["annotations"][STATUS_ANNOTATION])
                rig.rec.out_of_budget.clear()  # its backoff has passed
            halved = "(--allocation-timeout of 2 s, halved for each earlier failed search)"
            assert messages == [
                "no allocation found within the 2 s allocation budget "
                "(--allocation-timeout); retrying with backoff",
                f"no allocation found within the 1 s allocation budget {halved}; "
                "retrying with backoff",
                f"no allocation found within the 0.5 s allocation budget {halved}; "
                "retrying with backoff",
            ]
            assert rig.rec.searches.queue.budget(key) == 0.5  # the floor
            # Devices freed (another claim deallocated): the full budget again.
            rig.rec._devices_freed()
            assert rig.rec.searches.queue.budget(key) == 2.0
        finally:
            await worker.close()

    run(scenario())
