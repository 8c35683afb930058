"""Releasing device-plugin holds: the device-plugin API has no deallocate call.

The kubelet's pod-resources API (``<kubelet root>/pod-resources/kubelet.sock``, v1 ``List``)
says which container holds which device of which extended resource. Allocate does not
name the pod, so a hold is keyed by an allocation ID and matched to a container by its
device IDs (the kubelet never gives one device of a resource to two containers). Every
poll:

* a hold whose devices some container reports is live (and we remember the container);
* a live hold whose devices nobody reports any more is released (its container ended);
* a hold never seen is released once it is older than the grace period (the pod failed
  admission after Allocate, or ended between two polls);
* devices a container reports that no hold covers (ledger lost, or a hold released too
  early) are adopted into a new hold; one that a DRA claim holds is a double allocation,
  reported loudly.

Nothing is released while the pod-resources socket is younger than the settle time: a
kubelet that just started may not know all its pods yet, and releasing then could hand a
device in use to DRA. A failed List changes nothing.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

import grpc

from dradriver.host.state.schema import PluginHold
from dradriver.kubeletapi.gen import podresources_v1_pb2 as pb
from dradriver.kubeletapi.gen import podresources_v1_pb2_grpc as pb_grpc
from dradriver.log import get_logger

log = get_logger("kubeletplugin.podresources")

LIST_TIMEOUT_SECONDS = 10.0
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# After a kubelet (re)start, wait this long before trusting an absence in List.
DEFAULT_SETTLE_SECONDS = 20.0


@dataclass(frozen=True)
class Assignment:
    """Devices of one extended resource that the kubelet gave to one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    devices: frozenset[str]

    def describe(self) -> str:
        return f"pod {self.namespace}/{self.pod} container {self.container}"


class PodResourcesClient:
    """``v1.PodResourcesLister/List`` over a fresh connection per call (the socket is
    re-created when the kubelet restarts; a long-lived channel would sit in backoff)."""

    def __init__(self, socket: Path, timeout: float = LIST_TIMEOUT_SECONDS) -> None:
        self.socket = socket
        self.timeout = timeout

    async def pods(self) -> list[pb.PodResources]:
        """The List answer's pods (device-plugin devices and DRA claims per container)."""
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        async with grpc.aio.insecure_channel(f"unix://{self.socket}", options=options) as ch:
            response = await pb_grpc.PodResourcesListerStub(ch).List(
                pb.ListPodResourcesRequest(), timeout=self.timeout
            )
        return list(response.pod_resources)

    async def list(self) -> list[Assignment]:
        return [
            Assignment(pod.namespace, pod.name, c.name, d.resource_name, frozenset(d.device_ids))
            for pod in await self.pods()
            for c in pod.containers
            for d in c.devices
            if d.device_ids
        ]

    def age(self) -> float | None:
        """Seconds since the kubelet created its socket (None if there is none)."""
        try:
            return time.time() - os.stat(self.socket).st_ctime
        except FileNotFoundError:
            return None


@dataclass(frozen=True)
class Release:
    hold: PluginHold
    kind: str  # "pod-ended" or "never-seen" (the metric label)
    reason: str  # for the log


@dataclass
class ReconcilePlan:
    live: dict[str, Assignment] = field(default_factory=dict)
    release: list[Release] = field(default_factory=list)
    adopt: list[Assignment] = field(default_factory=list)


def _age(hold: PluginHold, now: float) -> float:
    return now - datetime.fromisoformat(hold.updated).timestamp()


def plan_reconcile(
    holds: Iterable[PluginHold],
    assignments: Iterable[Assignment],
    *,
    pool: str,
    resources: Collection[str],
    seen: Mapping[str, Assignment],
    in_flight: Collection[str],
    may_release: bool,
    grace: float,
    now: float,
) -> ReconcilePlan:
    """What to do with the ledger's device-plugin holds given one List answer."""
    users: dict[tuple[str, str], Assignment] = {}
    for a in assignments:
        for device in a.devices:
            users[(a.resource, device)] = a
    plan = ReconcilePlan()
    covered: set[tuple[str, str]] = set()
    for hold in holds:
        devices = [r.device for r in hold.devices if r.pool == pool]
        covered.update((hold.resource, d) for d in devices)
        found = [users[(hold.resource, d)] for d in devices if (hold.resource, d) in users]
        if found:
            plan.live[hold.pod_uid] = found[0]
            continue
        if hold.pod_uid in in_flight or not may_release:
            continue
        before = seen.get(hold.pod_uid)
        if before is not None:
            plan.release.append(
                Release(hold, "pod-ended", f"{before.describe()} no longer holds its devices")
            )
        elif _age(hold, now) >= grace:
            plan.release.append(
                Release(
                    hold,
                    "never-seen",
                    f"no container reported these devices within {grace:.0f}s of Allocate "
                    "(admission failed, or the pod ended between two polls)",
                )
            )
    by_assignment: dict[Assignment, set[str]] = {}
    for (resource, device), a in users.items():
        if resource in resources and (resource, device) not in covered:
            by_assignment.setdefault(a, set()).add(device)
    for a, uncovered in sorted(by_assignment.items(), key=lambda kv: kv[0].describe()):
        plan.adopt.append(
            Assignment(a.namespace, a.pod, a.container, a.resource, frozenset(uncovered))
        )
    return plan


class HoldKeeper(Protocol):
    """What the reconciler needs from the device-plugin shim."""

    @property
    def pool(self) -> str: ...

    @property
    def resource_names(self) -> Collection[str]: ...

    def plugin_holds(self) -> list[PluginHold]: ...

    def in_flight(self) -> Collection[str]: ...

    def release(self, hold: PluginHold, kind: str, reason: str) -> None: ...

    def adopt(self, assignment: Assignment) -> None: ...

    def observed(self, live: Mapping[str, Assignment]) -> None: ...


class HoldReconciler:
    """Polls pod-resources and applies :func:`plan_reconcile`."""

    def __init__(
        self,
        keeper: HoldKeeper,
        client: PodResourcesClient,
        *,
        interval: float,
        grace: float,
        settle: float = DEFAULT_SETTLE_SECONDS,
        on_error: Callable[[], None] | None = None,
        on_pass: Callable[[], None] | None = None,
    ) -> None:
        self.keeper = keeper
        self.client = client
        self.interval = interval
        self.grace = grace
        self.settle = settle
        self.on_error = on_error
        self.on_pass = on_pass
        self.seen: dict[str, Assignment] = {}
        self.passes = 0
        self._failing = False

    def may_release(self) -> bool:
        age = self.client.age()
        return age is not None and age >= self.settle

    async def reconcile_once(self) -> ReconcilePlan:
        """One poll; raises on a failed List (nothing is changed then)."""
        assignments = await self.client.list()
        may_release = self.may_release()
        plan = plan_reconcile(
            self.keeper.plugin_holds(),
            assignments,
            pool=self.keeper.pool,
            resources=self.keeper.resource_names,
            seen=self.seen,
            in_flight=self.keeper.in_flight(),
            may_release=may_release,
            grace=self.grace,
            now=time.time(),
        )
        for r in plan.release:
            self.keeper.release(r.hold, r.kind, r.reason)
            self.seen.pop(r.hold.pod_uid, None)
        for assignment in plan.adopt:
            self.keeper.adopt(assignment)
        live_ids = {h.pod_uid for h in self.keeper.plugin_holds()}
        self.seen = {k: v for k, v in {**self.seen, **plan.live}.items() if k in live_ids}
        self.keeper.observed(self.seen)
        self.passes += 1
        if self.on_pass is not None:
            self.on_pass()
        return plan

    async def prime(self) -> None:
        """One pass before the device plugin serves: what the kubelet reports in use that
        no hold covers (the ledger was lost) is held again before Allocate can give it out.
        A kubelet that cannot answer yet is logged; the periodic passes catch up."""
        try:
            plan = await self.reconcile_once()
        except (grpc.aio.AioRpcError, OSError) as e:
            error = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
            log.warning(
                "cannot list pod resources before serving; device-plugin holds the ledger "
                "lost are taken back once it answers",
                socket=str(self.client.socket),
                error=error,
            )
            return
        log.info("pod resources listed before serving", adopted=len(plan.adopt))

    async def run(self) -> None:
        while True:
            try:
                await self.reconcile_once()
                if self._failing:
                    log.info("pod-resources API reachable again", socket=str(self.client.socket))
                self._failing = False
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, OSError) as e:
                if self.on_error is not None:
                    self.on_error()
                error = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
                if not self._failing:
                    log.warning(
                        "cannot list pod resources; device-plugin holds are kept until it works",
                        socket=str(self.client.socket),
                        error=error,
                    )
                self._failing = True
            except Exception:
                log.exception("device-plugin hold reconciliation failed")
            await asyncio.sleep(self.interval)
