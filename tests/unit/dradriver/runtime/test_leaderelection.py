"""LeaderElector against an in-memory Lease store with resourceVersion checks (short durations)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.runtime import LeaderElectionConfig, LeaderElector, RuntimeMetrics
from tests.metricsample import sample_value

LEASE = 1.0
RENEW = 0.6
RETRY = 0.1


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


async def eventually(what: str, cond: Callable[[], bool], deadline: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}")
        await asyncio.sleep(0.005)


class LeaseStore:
    """One Lease with the apiserver's create/update semantics."""

    def __init__(self) -> None:
        self.lease: Obj | None = None
        self.rv = 0
        self.writes: list[str | None] = []

    def client(self) -> FakeLeaseClient:
        return FakeLeaseClient(self)


class FakeLeaseClient:
    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.partitioned = False
        self.refused = 0

    def _check(self, method: str, path: str) -> None:
        if self.partitioned:
            self.refused += 1
            raise ConnectionError("network partition")

    async def get(self, path: str, **params: Any) -> Obj:
        self._check("GET", path)
        if self.store.lease is None:
            raise KubeAPIError("GET", path, 404, {"reason": "NotFound"})
        return copy.deepcopy(self.store.lease)

    async def create(self, path: str, body: Obj) -> Obj:
        self._check("POST", path)
        if self.store.lease is not None:
            raise KubeAPIError("POST", path, 409, {"reason": "AlreadyExists"})
        return self._write(body)

    async def replace(self, path: str, body: Obj) -> Obj:
        self._check("PUT", path)
        current = self.store.lease
        if current is None:
            raise KubeAPIError("PUT", path, 404, {"reason": "NotFound"})
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise KubeAPIError("PUT", path, 409, {"reason": "Conflict"})
        return self._write(body)

    def _write(self, body: Obj) -> Obj:
        self.store.rv += 1
        lease = copy.deepcopy(body)
        lease["metadata"]["resourceVersion"] = str(self.store.rv)
        self.store.lease = lease
        self.store.writes.append(lease["spec"].get("holderIdentity"))
        return copy.deepcopy(lease)


class Candidate:
    """An elector plus a record of when it led (monotonic start/stop)."""

    def __init__(self, store: LeaseStore, name: str, **config: Any) -> None:
        self.client = store.client()
        self.intervals: list[list[float]] = []
        self.work_cancelled = asyncio.Event()
        timing: dict[str, Any] = {
            "lease_duration": LEASE,
            "renew_deadline": RENEW,
            "retry_period": RETRY,
        }
        cfg = LeaderElectionConfig(namespace="ns", name="lease", identity=name, **timing | config)
        self.metrics = RuntimeMetrics()
        self.elector = LeaderElector(
            self.client, cfg, self._lead, self._stopped, metrics=self.metrics
        )
        self.task: asyncio.Task[None] | None = None

    async def _lead(self) -> None:
        self.intervals.append([time.monotonic(), float("inf")])
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.work_cancelled.set()
            raise

    def _stopped(self) -> None:
        self.intervals[-1][1] = time.monotonic()

    @property
    def leading(self) -> bool:
        return bool(self.intervals) and self.intervals[-1][1] == float("inf")

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run())

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def assert_never_both(a: Candidate, b: Candidate) -> None:
    for s1, e1 in a.intervals:
        for s2, e2 in b.intervals:
            assert e1 <= s2 or e2 <= s1, (a.intervals, b.intervals)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="lease_duration"):
        LeaderElectionConfig("ns", "l", "me", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match="renew_deadline"):
        LeaderElectionConfig("ns", "l", "me", renew_deadline=2, retry_period=2)
    assert LeaderElectionConfig("ns", "l").identity  # generated


def test_one_of_two_leads_and_the_lease_records_it() -> None:
    async def scenario() -> None:
        store = LeaseStore()
        a, b = Candidate(store, "a"), Candidate(store, "b")
        a.start()
        b.start()
        await eventually("a leader", lambda: a.leading or b.leading)
        leader, standby = (a, b) if a.leading else (b, a)
        # Several renewals later, still exactly one leader, and the standby knows it.
        await eventually("renewals", lambda: store.writes.count(leader.elector.identity) >= 4)
        assert not standby.leading
        assert standby.elector.leader == leader.elector.identity
        assert leader.elector.is_leader and not standby.elector.is_leader
        assert store.lease is not None
        spec = store.lease["spec"]
        assert spec["holderIdentity"] == leader.elector.identity
        assert spec["leaseDurationSeconds"] == 1
        assert spec["renewTime"].endswith("Z") and "." in spec["renewTime"]
        labels = {"lease": "ns/lease"}
        assert sample_value(leader.metrics.registry, "dradriver_leader", labels) == 1
        await a.stop()
        await b.stop()
        assert_never_both(a, b)

    run(scenario())


def test_graceful_stop_releases_and_standby_takes_over_fast() -> None:
    async def scenario() -> None:
        store = LeaseStore()
        a = Candidate(store, "a")
        a.start()
        await eventually("a leads", lambda: a.leading)
        b = Candidate(store, "b")
        b.start()
        await eventually("b sees a", lambda: b.elector.leader == "a")
        stopped = time.monotonic()
        await a.stop()
        assert store.lease is not None and "holderIdentity" not in store.lease["spec"]
        await eventually("b leads", lambda: b.leading)
        # Released: no waiting for the lease to expire.
        assert b.intervals[0][0] - stopped < LEASE
        await b.stop()
        assert_never_both(a, b)

    run(scenario())


def test_crashed_leader_is_replaced_only_after_the_lease_expires() -> None:
    async def scenario() -> None:
        store = LeaseStore()
        a = Candidate(store, "a", release_on_cancel=False)
        a.start()
        await eventually("a leads", lambda: a.leading)
        b = Candidate(store, "b")
        b.start()
        await eventually("b sees a", lambda: b.elector.leader == "a")
        last_renew = a.elector.last_renew
        assert last_renew is not None
        await a.stop()  # crash: no release
        assert store.lease is not None and store.lease["spec"]["holderIdentity"] == "a"
        await eventually("b leads", lambda: b.leading, deadline=LEASE * 3)
        waited = b.intervals[0][0] - last_renew
        assert LEASE <= waited < LEASE + 1.0  # poll period and observation lag, with slack
        assert store.lease["spec"]["leaseTransitions"] == 1
        await b.stop()

    run(scenario())


def test_partitioned_leader_stops_before_anyone_else_starts() -> None:
    async def scenario() -> None:
        store = LeaseStore()
        a, b = Candidate(store, "a"), Candidate(store, "b")
        a.start()
        await eventually("a leads", lambda: a.leading)
        b.start()
        await eventually("b sees a", lambda: b.elector.leader == "a")
        last_renew = a.elector.last_renew
        assert last_renew is not None
        a.client.partitioned = True
        await eventually("a steps down", lambda: not a.leading)
        assert a.work_cancelled.is_set()
        stepped_down = a.intervals[0][1]
        assert stepped_down - last_renew <= RENEW + 0.5
        await eventually("b leads", lambda: b.leading, deadline=LEASE * 3)
        assert_never_both(a, b)
        # When the partition heals, a stays a standby.
        a.client.partitioned = False
        await eventually("a sees b", lambda: a.elector.leader == "b")
        assert not a.leading
        await b.stop()
        await eventually("a leads again", lambda: a.leading)
        await a.stop()
        assert_never_both(a, b)

    run(scenario())


def test_leading_task_failure_steps_down_and_raises() -> None:
    async def scenario() -> None:
        store = LeaseStore()
        stopped = asyncio.Event()

        async def lead() -> None:
            raise RuntimeError("controller crashed")

        cfg = LeaderElectionConfig(
            "ns", "lease", "x", lease_duration=LEASE, renew_deadline=RENEW, retry_period=RETRY
        )
        elector = LeaderElector(store.client(), cfg, lead, stopped.set)
        with pytest.raises(RuntimeError, match="controller crashed"):
            await elector.run()
        assert stopped.is_set()
        assert store.lease is not None and "holderIdentity" not in store.lease["spec"]

    run(scenario())


def test_simultaneous_candidates_never_both_acquire() -> None:
    """Many candidates start at once against an absent Lease: create/update conflicts decide."""

    async def scenario() -> None:
        store = LeaseStore()
        cands = [Candidate(store, f"c{i}") for i in range(6)]
        for c in cands:
            c.start()
        await eventually("a leader", lambda: any(c.leading for c in cands))
        await eventually("renewals", lambda: len(store.writes) >= 6)
        assert sum(c.leading for c in cands) == 1
        for c in cands:
            await c.stop()
        for i, x in enumerate(cands):
            for y in cands[i + 1 :]:
                assert_never_both(x, y)

    run(scenario())


def test_after_an_outage_the_candidate_polls_again_soon_not_a_retry_period_later() -> None:
    """The apiserver is unreachable when the candidate starts and comes back: the candidate
    leads long before the next ``retry_period`` poll (60 s here), by ``error_retry``."""

    async def scenario() -> None:
        store = LeaseStore()
        a = Candidate(
            store,
            "a",
            lease_duration=90.0,
            renew_deadline=80.0,
            retry_period=60.0,
            error_retry=0.05,
        )
        a.client.partitioned = True
        a.start()
        await eventually("a polled twice during the outage", lambda: a.client.refused >= 2)
        a.client.partitioned = False
        await eventually("a leads after the outage", lambda: a.leading, deadline=10.0)
        await a.stop()

    run(scenario())


def test_error_retry_must_be_positive() -> None:
    with pytest.raises(ValueError, match="error_retry"):
        LeaderElectionConfig("ns", "l", "me", error_retry=0)
