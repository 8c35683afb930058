"""The catch-up period after a watch gap (controller/claims/staleness.py): a failed list or
watch of the controller's own informers makes kube-scheduler count as stale, and no
allocation is written until ``catchup`` seconds after the last failure or until the
scheduler shows it read a claim created after it. Real informer and allocation worker; a
scripted list/watch client (a fault a unit test cannot get from a real apiserver) and the
fake apiserver for the writes. Time is a fake clock: no test waits for the period."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from controller.claims.scheduler import SchedulerActivity
from controller.claims.staleness import (
    EVIDENCE_MARGIN,
    SCHEDULER_MANAGER,
    ObservedClient,
    SchedulerStaleness,
)
from controller.claims.worker import AllocationWorker
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.http import TransportError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import Informer, RequeueAfter
from dradriver.runtime.ratelimit import Backoff
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer
from tests.unit.controller.claims.test_reconciler import new_claim
from tests.unit.controller.claims.test_worker import (
    claim_path,
    gpu_reconciler,
    run,
)
from tests.unit.dradriver.runtime.test_leaderelection import eventually

CLAIMS = path_for(RESOURCE_V1, "resourceclaims")
CATCHUP = 75.0
T0 = 1_000_000.0  # the fake wall clock's start (epoch seconds)


class Clocks:
    """A monotonic and a wall clock that move only when told."""

    def __init__(self) -> None:
        self.now = 100.0
        self.wall_now = T0

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.wall_now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall_now += seconds


def staleness(clocks: Clocks) -> SchedulerStaleness:
    return SchedulerStaleness(CATCHUP, clock=clocks.clock, wall=clocks.wall)


def stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def template_claim(uid: str, created: float, *managers: str) -> Obj:
    return {
        "metadata": {
            "name": f"pod-{uid}",
            "namespace": "ns",
            "uid": uid,
            "creationTimestamp": stamp(created),
            "managedFields": [{"manager": m, "operation": "Update"} for m in managers],
        }
    }


# --- the period and the evidence -------------------------------------------------------


def test_a_gap_makes_the_scheduler_stale_for_catchup_seconds_after_the_last_failure() -> None:
    clocks = Clocks()
    s = staleness(clocks)
    assert s.remaining() == 0
    s.gap("watch", TransportError("refused"))
    assert s.remaining() == CATCHUP
    clocks.advance(50)
    s.gap("watch", TransportError("refused"))  # still failing: counted from the last one
    clocks.advance(CATCHUP - 1)
    assert s.remaining() == 1
    clocks.advance(1)
    assert s.remaining() == 0


def test_the_scheduler_writing_a_claim_created_after_the_gap_ends_the_period() -> None:
    clocks = Clocks()
    s = staleness(clocks)
    s.gap("watch", TransportError("refused"))
    clocks.advance(10)
    created = clocks.wall_now
    s.claim_event("ADDED", template_claim("u1", created, "kube-controller-manager"))
    assert s.remaining() > 0  # created is no evidence yet
    s.claim_event(
        "MODIFIED", template_claim("u1", created, "kube-controller-manager", SCHEDULER_MANAGER)
    )
    assert s.remaining() == 0 and s.evidence == 1
    s.gap("list", TransportError("refused"))  # a new gap: stale again
    assert s.remaining() == CATCHUP


@pytest.mark.parametrize(
    "events",
    [
        # created before the gap (or within the clock margin after it): it may have been read
        # before the outage
        [("ADDED", -30.0, ("kcm",)), ("MODIFIED", -30.0, ("kcm", SCHEDULER_MANAGER))],
        [
            ("ADDED", EVIDENCE_MARGIN - 1, ("kcm",)),
            ("MODIFIED", EVIDENCE_MARGIN - 1, ("kcm", SCHEDULER_MANAGER)),
        ],
        # someone else wrote first: the scheduler may have read it by a GET after a conflict
        [
            ("ADDED", 10.0, ("kcm",)),
            ("MODIFIED", 10.0, ("kcm", "other")),
            ("MODIFIED", 10.0, ("kcm", "other", SCHEDULER_MANAGER)),
        ],
        # the creation was not seen on the watch (a list showed it): no sequence
        [("LIST", 0, ()), ("MODIFIED", 10.0, ("kcm", SCHEDULER_MANAGER))],
        # a claim the scheduler created itself
        [("ADDED", 10.0, (SCHEDULER_MANAGER,)), ("MODIFIED", 10.0, (SCHEDULER_MANAGER,))],
    ],
    ids=["created-before-gap", "within-margin", "other-writer-first", "listed", "own-claim"],
)
def test_what_is_no_evidence(events: list[tuple[str, float, tuple[str, ...]]]) -> None:
    clocks = Clocks()
    s = staleness(clocks)
    s.gap("watch", TransportError("refused"))
    clocks.advance(20)
    for kind, offset, managers in events:
        if kind == "LIST":
            s.claims_listed()
            continue
        s.claim_event(kind, template_claim("u1", T0 + offset, *managers))
    assert s.remaining() > 0 and s.evidence == 0


def test_catchup_zero_turns_the_period_off() -> None:
    s = SchedulerStaleness(0.0)
    s.gap("watch", TransportError("refused"))
    assert s.remaining() == 0


def test_only_allocations_wait_while_catching_up() -> None:
    clocks = Clocks()
    s = staleness(clocks)
    activity = SchedulerActivity(None, staleness=s)
    s.gap("watch", TransportError("refused"))
    # A removal the stale scheduler has not seen yet leaves it counting the device as
    # taken: no collision, so clearing (a deletion, a conflict hold's release) goes on.
    assert activity.quiet()[0]
    with pytest.raises(RequeueAfter) as raised:
        activity.wait_before_allocating("ns/c")
    assert raised.value.delay <= 1.0  # polls: evidence may end the period any time
    clocks.advance(CATCHUP)
    activity.wait_before_allocating("ns/c")  # no pod waits: allocate


# --- what counts as a gap --------------------------------------------------------------


class Scripted:
    """A list/watch/Lease client whose answers the test sets (see the module docstring)."""

    def __init__(self) -> None:
        self.list_error: BaseException | None = None
        self.watch_events: list[Obj] = []
        self.watch_error: BaseException | None = None
        self.lease_error: BaseException | None = None
        self.lists = 0
        self.hang = asyncio.Event()

    async def list(self, path: str, **params: Any) -> Obj:
        self.lists += 1
        if self.list_error is not None:
            raise self.list_error
        return {"metadata": {"resourceVersion": "5"}, "items": []}

    async def watch(self, path: str, resource_version: str, **params: Any) -> AsyncIterator[Obj]:
        for event in self.watch_events:
            yield event
        self.watch_events = []
        if self.watch_error is not None:
            error, self.watch_error = self.watch_error, None
            raise error
        await self.hang.wait()  # a quiet watch, until cancelled

    async def get(self, path: str, **params: Any) -> Obj:
        if self.lease_error is not None:
            raise self.lease_error
        return {}

    async def create(self, path: str, body: Obj) -> Obj:
        return await self.get(path)

    async def replace(self, path: str, body: Obj) -> Obj:
        return await self.get(path)


def api_error(status: int) -> KubeAPIError:
    return KubeAPIError("GET", "/x", status, {"message": "m"})


@pytest.mark.parametrize(
    ("error", "counts"),
    [
        (TransportError("connection refused"), True),
        (api_error(503), True),
        (api_error(429), True),
        (api_error(410), True),  # the watch starts over from a list
        (api_error(404), False),  # a CRD not installed
        (api_error(403), False),
    ],
)
def test_a_failed_list_counts_unless_the_apiserver_answered_for_itself(
    error: BaseException, counts: bool
) -> None:
    async def scenario() -> None:
        client = Scripted()
        client.list_error = error
        s = SchedulerStaleness(CATCHUP)
        observed = ObservedClient(client, s, CLAIMS)
        with pytest.raises(type(error)):
            await observed.list(CLAIMS)
        assert (s.remaining() > 0) is counts

    run(scenario())


@pytest.mark.parametrize(
    ("path", "counts"),
    [
        ("/apis/resource.k8s.io/v1/resourceslices", True),
        ("/api/v1/nodes", True),
        ("/apis/dradriver.dev/v1alpha1/deviceclaimparameters", False),
        ("/apis/dradriver.dev/v1alpha1/networkdevicepools", False),
    ],
)
def test_only_what_the_scheduler_watches_counts(path: str, counts: bool) -> None:
    """A CRD's watch cache answers 429 while it (re)initialises, after the chart installs
    it: that says nothing about what kube-scheduler saw, and must not hold allocations."""

    async def scenario() -> None:
        initialising = KubeAPIError("WATCH", path, 429, {"message": "storage is (re)initializing"})
        client = Scripted()
        client.list_error = initialising
        s = SchedulerStaleness(CATCHUP)
        observed = ObservedClient(client, s, CLAIMS)
        with pytest.raises(KubeAPIError):
            await observed.list(path)
        assert (s.remaining() > 0) is counts

    run(scenario())


def test_lease_conflicts_are_no_gap_but_an_unreachable_apiserver_is() -> None:
    async def scenario() -> None:
        client = Scripted()
        s = SchedulerStaleness(CATCHUP)
        observed = ObservedClient(client, s, CLAIMS)
        client.lease_error = api_error(409)
        with pytest.raises(KubeAPIError):
            await observed.replace("/lease", {})
        assert s.remaining() == 0
        client.lease_error = TransportError("refused")
        with pytest.raises(TransportError):
            await observed.get("/lease")
        assert s.remaining() > 0

    run(scenario())


def test_an_error_event_is_a_gap_and_a_cancelled_watch_is_not() -> None:
    async def scenario() -> None:
        client = Scripted()
        s = SchedulerStaleness(CATCHUP)
        observed = ObservedClient(client, s, CLAIMS)

        async def drain() -> None:
            async for _ in observed.watch(CLAIMS, "5"):
                pass

        task = asyncio.create_task(drain())
        await eventually("the watch waiting", lambda: not task.done(), 1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.remaining() == 0
        client.watch_events = [{"type": "ERROR", "object": {"code": 410}}]
        task = asyncio.create_task(drain())
        await eventually("the error seen", lambda: s.remaining() > 0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())


# --- the whole path: informer -> gap -> no allocation written ---------------------------


@pytest.fixture(scope="module")
def worker() -> Iterator[AllocationWorker]:
    shared = AllocationWorker()
    yield shared
    run(shared.close())


def test_after_a_claim_watch_gap_no_allocation_is_written_until_the_scheduler_caught_up(
    worker: AllocationWorker,
) -> None:
    async def scenario() -> None:
        clocks = Clocks()
        s = staleness(clocks)
        scripted = Scripted()
        scripted.watch_error = TransportError("connection refused")  # the apiserver stops
        informer = Informer(
            ObservedClient(scripted, s, CLAIMS), CLAIMS, backoff=Backoff(base=0.01, cap=0.01)
        )
        informer.start()
        try:
            await eventually("the informer's watch failing", lambda: s.gaps == 1)
            api = FakeAPIServer()
            claims = FakeInformer(api.put(claim_path("c"), new_claim("c")))
            rec = gpu_reconciler(
                api, claims, worker=worker, scheduler=SchedulerActivity(None, staleness=s)
            )
            clocks.advance(CATCHUP - 1)
            with pytest.raises(RequeueAfter, match="catching up"):
                await rec("ns/c")
            stored = api.stored(claim_path("c"))
            assert stored is not None and not (stored.get("status") or {}).get("allocation")
            claims.apply(stored)  # the finalizer written meanwhile, as the watch shows it
            clocks.advance(1)  # the period is over
            await rec("ns/c")
            stored = api.stored(claim_path("c"))
            assert stored is not None and stored["status"]["allocation"]["devices"]["results"]
        finally:
            await informer.stop()

    run(scenario())


# --- a freed device re-queues the scheduler's unschedulable pods ------------------------


def unschedulable_pod(name: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "spec": {"resourceClaims": [{"name": "r", "resourceClaimName": "c"}]},
        "status": {"conditions": [{"type": "PodScheduled", "status": "False"}]},
    }


def test_no_allocation_while_a_freed_device_may_go_to_an_unschedulable_pod() -> None:
    # Seen in bench.torture: a pod's claim and an immediate claim got the same device the
    # moment the pool's devices were freed (the scheduler retried the unschedulable pod).
    pods = FakeInformer(unschedulable_pod("p"))
    activity = SchedulerActivity(cast(Any, pods), quiet_period=0.0, retry_window=12.0)
    activity.wait_before_allocating("ns/c")  # judged unschedulable, nothing freed: go on
    activity.device_freed()
    with pytest.raises(RequeueAfter, match="retried: a device was freed"):
        activity.wait_before_allocating("ns/c")
    activity.last_free -= 12.0  # the scheduler's pod backoff (10 s at most) has passed
    activity.wait_before_allocating("ns/c")
