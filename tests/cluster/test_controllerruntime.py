"""The controller runtime against the real apiserver: informers and leader election on a Lease."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from devtools.cluster.local import LocalCluster
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.k8s.http import TransportError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import path_for
from dradriver.runtime import Backoff, Informer, LeaderElectionConfig, LeaderElector

LEASE, RENEW, RETRY = 15.0, 10.0, 2.0  # the defaults the controller uses


def run(coro: Coroutine[Any, Any, None], timeout: float = 120) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout))


async def eventually(what: str, cond: Callable[[], bool], deadline: float = 30) -> None:
    """Poll ``cond`` until true; fail after ``deadline`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out after {deadline:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)


class GatedClient(KubeClient):
    """Holds new watch requests while the gate is closed (to make changes during a gap).

    ``expire_next`` makes the next watch answer like the apiserver does for a
    compacted resourceVersion (an ERROR event, code 410). A fake, because a young
    cluster's watch cache still serves old versions: the 410 cannot be caused on
    demand. Everything else (lists, the following watch) is the real apiserver.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = 0
        self.expire_next = False

    async def watch(self, path: str, resource_version: str, **params: Any) -> AsyncIterator[Obj]:
        if not self.gate.is_set():
            self.held += 1
            await self.gate.wait()
        if self.expire_next:
            self.expire_next = False
            yield {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "Expired",
                    "message": f"too old resource version: {resource_version}",
                    "code": 410,
                },
            }
            return
        async for event in super().watch(path, resource_version, **params):
            yield event


class PartitionableClient(KubeClient):
    """Every request fails while ``partitioned`` (the leader loses the apiserver)."""

    partitioned = False

    async def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Obj:
        if self.partitioned:
            raise TransportError("simulated network partition")
        return await super().request(method, path, *args, **kwargs)


def kubeconfig(cluster: LocalCluster) -> str:
    return str(cluster.layout.admin_kubeconfig)


def configmap(ns: str, name: str, value: str, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {"test": "informer"}},
        "data": {"value": value},
    }


class Recorder:
    def __init__(self, informer: Informer) -> None:
        self.events: list[tuple[str, str, str]] = []
        informer.add_handler(
            on_add=lambda o: self._rec("add", o),
            on_update=lambda old, new: self._rec("update", new),
            on_delete=lambda o: self._rec("delete", o),
        )

    def _rec(self, kind: str, o: Obj) -> None:
        self.events.append((kind, o["metadata"]["name"], (o.get("data") or {}).get("value", "")))

    def has(self, *event: str) -> bool:
        return tuple(event) in self.events


def test_informer_sees_add_update_delete(local_cluster: LocalCluster, namespace: str) -> None:
    async def scenario() -> None:
        client = KubeClient(load_connection(kubeconfig(local_cluster)))
        cms = path_for("v1", "configmaps", namespace)
        try:
            await client.create(cms, configmap(namespace, "before", "0"))
            informer = Informer(client, cms, name="configmaps", label_selector="test=informer")
            rec = Recorder(informer)
            informer.start()
            async with asyncio.timeout(30):
                await informer.wait_for_sync()
            assert rec.events == [("add", "before", "0")]

            await client.create(cms, configmap(namespace, "a", "1"))
            await client.create(cms, configmap(namespace, "other", "x", {"test": "no"}))
            await eventually("add a", lambda: rec.has("add", "a", "1"))
            current = await client.get(path_for("v1", "configmaps", namespace, "a"))
            current["data"] = {"value": "2"}
            await client.replace(path_for("v1", "configmaps", namespace, "a"), current)
            await eventually("update a", lambda: rec.has("update", "a", "2"))
            assert informer.get(f"{namespace}/a") is not None
            assert informer.get(f"{namespace}/a")["data"] == {"value": "2"}  # type: ignore[index]
            await client.delete(path_for("v1", "configmaps", namespace, "a"))
            await eventually("delete a", lambda: rec.has("delete", "a", "2"))
            assert informer.get(f"{namespace}/a") is None
            assert not any(name == "other" for _, name, _ in rec.events)  # label selector
            assert informer.lists == 1 and informer.expired == 0
            await informer.stop()
        finally:
            await client.aclose()

    run(scenario())


def test_watch_ends_are_resumed_without_relisting(
    local_cluster: LocalCluster, namespace: str
) -> None:
    async def scenario() -> None:
        client = KubeClient(load_connection(kubeconfig(local_cluster)))
        cms = path_for("v1", "configmaps", namespace)
        try:
            # timeoutSeconds of 1..2: the server ends the stream often.
            informer = Informer(client, cms, name="configmaps", watch_timeout=2)
            rec = Recorder(informer)
            informer.start()
            async with asyncio.timeout(30):
                await informer.wait_for_sync()
            for i in range(3):
                await eventually(f"watch {i + 1}", lambda i=i: informer.watch_starts > i)  # type: ignore[misc]
                await client.create(cms, configmap(namespace, f"cm-{i}", str(i)))
            await eventually(
                "all adds", lambda: all(rec.has("add", f"cm-{i}", str(i)) for i in range(3))
            )
            assert informer.lists == 1 and informer.expired == 0
            assert informer.watch_starts >= 3
            await informer.stop()
        finally:
            await client.aclose()

    run(scenario())


def test_gone_relists_without_losing_events(local_cluster: LocalCluster, namespace: str) -> None:
    """Changes made while no watch runs, then a watch from a too-old resourceVersion (410)."""

    async def scenario() -> None:
        client = GatedClient(load_connection(kubeconfig(local_cluster)))
        writer = KubeClient(load_connection(kubeconfig(local_cluster)))
        cms = path_for("v1", "configmaps", namespace)
        try:
            for name in ("a", "b", "c"):
                await writer.create(cms, configmap(namespace, name, "1"))
            informer = Informer(
                client,
                cms,
                name="configmaps",
                label_selector="test=informer",
                backoff=Backoff(0.05, 1),
            )
            rec = Recorder(informer)
            informer.start()
            async with asyncio.timeout(30):
                await informer.wait_for_sync()
            await eventually("watching", lambda: informer.watch_starts == 1)

            client.gate.clear()
            client.expire_next = True
            informer.restart_watch("1")
            await eventually("the watch is held", lambda: client.held == 1)
            mark = len(rec.events)
            a = await writer.get(path_for("v1", "configmaps", namespace, "a"))
            a["data"] = {"value": "2"}
            await writer.replace(path_for("v1", "configmaps", namespace, "a"), a)
            await writer.delete(path_for("v1", "configmaps", namespace, "b"))
            await writer.create(cms, configmap(namespace, "d", "1"))
            client.gate.set()

            await eventually("a relist after 410", lambda: informer.lists == 2)
            assert informer.expired == 1
            await eventually("the changes", lambda: len(rec.events) >= mark + 3)
            assert sorted(rec.events[mark:]) == [
                ("add", "d", "1"),
                ("delete", "b", "1"),
                ("update", "a", "2"),
            ]
            listed = await writer.list(cms, labelSelector="test=informer")
            server = {o["metadata"]["name"] for o in listed["items"]}
            cached = {o["metadata"]["name"] for o in informer.items()}
            assert cached == server == {"a", "c", "d"}
            # And the watch after the relist delivers new events.
            await writer.create(cms, configmap(namespace, "e", "1"))
            await eventually("add e", lambda: rec.has("add", "e", "1"))
            assert informer.lists == 2
            await informer.stop()
        finally:
            await client.aclose()
            await writer.aclose()

    run(scenario())


class Candidate:
    """One elector with its own client, recording when it led."""

    def __init__(self, cluster: LocalCluster, namespace: str, name: str, **cfg: Any) -> None:
        self.client = PartitionableClient(load_connection(kubeconfig(cluster)))
        self.intervals: list[list[float]] = []
        config = LeaderElectionConfig(
            namespace=namespace,
            name="test-lease",
            identity=name,
            lease_duration=LEASE,
            renew_deadline=RENEW,
            retry_period=RETRY,
            **cfg,
        )
        self.elector = LeaderElector(self.client, config, self._lead, self._stopped)
        self.task: asyncio.Task[None] | None = None

    async def _lead(self) -> None:
        self.intervals.append([time.monotonic(), float("inf")])
        await asyncio.Event().wait()

    def _stopped(self) -> None:
        self.intervals[-1][1] = time.monotonic()

    @property
    def leading(self) -> bool:
        return bool(self.intervals) and self.intervals[-1][1] == float("inf")

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run())

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.client.aclose()


def never_both(a: Candidate, b: Candidate) -> bool:
    return all(e1 <= s2 or e2 <= s1 for s1, e1 in a.intervals for s2, e2 in b.intervals)


async def lease_holder(client: KubeClient, namespace: str) -> str | None:
    lease = await client.get(path_for("coordination.k8s.io/v1", "leases", namespace, "test-lease"))
    holder: str | None = lease["spec"].get("holderIdentity")
    return holder


def test_only_one_leads_and_a_crashed_leader_is_replaced_within_the_lease(
    local_cluster: LocalCluster, namespace: str
) -> None:
    async def scenario() -> None:
        a = Candidate(local_cluster, namespace, "a", release_on_cancel=False)
        b = Candidate(local_cluster, namespace, "b", release_on_cancel=False)
        try:
            a.start()
            b.start()
            await eventually("a leader", lambda: a.leading or b.leading)
            leader, standby = (a, b) if a.leading else (b, a)
            ident = leader.elector.identity
            await eventually("the standby sees the leader", lambda: standby.elector.leader == ident)
            assert await lease_holder(leader.client, namespace) == ident
            # A few renewals: the standby stays a standby.
            renewed = leader.elector.last_renew
            await eventually("a renewal", lambda: leader.elector.last_renew != renewed)
            assert not standby.leading and never_both(a, b)

            last_renew = leader.elector.last_renew
            assert last_renew is not None
            crashed = time.monotonic()
            await leader.stop()  # cancelled without releasing: a crash
            await eventually("the standby leads", lambda: standby.leading, deadline=LEASE + 10)
            took_over = standby.intervals[0][0]
            # Not before the lease expired, and within lease + observation lag after it.
            assert took_over - last_renew >= LEASE
            assert took_over - crashed <= LEASE + 2 * RETRY * 1.2 + 1
            assert never_both(a, b)
            assert await lease_holder(standby.client, namespace) == standby.elector.identity
        finally:
            await a.stop()
            await b.stop()

    run(scenario())


def test_graceful_release_hands_over_at_once(local_cluster: LocalCluster, namespace: str) -> None:
    async def scenario() -> None:
        a = Candidate(local_cluster, namespace, "a")
        b = Candidate(local_cluster, namespace, "b")
        try:
            a.start()
            await eventually("a leads", lambda: a.leading)
            b.start()
            await eventually("b sees a", lambda: b.elector.leader == "a")
            released = time.monotonic()
            await a.stop()
            await eventually("b leads", lambda: b.leading, deadline=10)
            assert b.intervals[0][0] - released <= RETRY * 1.2 + 1
            assert never_both(a, b)
        finally:
            await a.stop()
            await b.stop()

    run(scenario())


def test_partitioned_leader_stops_before_the_standby_starts(
    local_cluster: LocalCluster, namespace: str
) -> None:
    async def scenario() -> None:
        a = Candidate(local_cluster, namespace, "a")
        b = Candidate(local_cluster, namespace, "b")
        try:
            a.start()
            await eventually("a leads", lambda: a.leading)
            b.start()
            await eventually("b sees a", lambda: b.elector.leader == "a")
            a.client.partitioned = True
            last_renew = a.elector.last_renew
            assert last_renew is not None
            await eventually("a steps down", lambda: not a.leading, deadline=RENEW + 5)
            assert a.intervals[0][1] - last_renew <= RENEW + 0.5
            await eventually("b leads", lambda: b.leading, deadline=LEASE + 10)
            assert never_both(a, b)
            assert b.intervals[0][0] - a.intervals[0][1] >= LEASE - RENEW - 0.5
        finally:
            await a.stop()
            await b.stop()

    run(scenario())
