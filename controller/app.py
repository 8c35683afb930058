"""The controller process: informers, leader election, reconcilers, HTTP endpoints.

Informers run in every replica, so a standby has warm caches and takes over
without listing first. The reconcilers run only in the leader: they start when
the Lease is acquired and are cancelled the moment it is lost. On SIGTERM the
leader finishes in-flight reconciles (bounded), then releases the Lease so a
standby takes over at once.

Three places work: the main event loop (informers, the Lease, the reconcilers), a
thread with its own event loop for the HTTP servers (probes and metrics, the admission
webhook: :mod:`controller.serving`), and a child process for the allocator's search
(:mod:`controller.claims.worker`). Nothing CPU-bound without a bound runs on the main
loop, so the Lease keeps being renewed while a claim is being allocated.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from controller.claims.context import ClaimContext, ClaimSettings, ClaimSources
from controller.claims.reconciler import ClaimReconciler
from controller.claims.request import claims_using
from controller.claims.scheduler import SchedulerActivity
from controller.claims.staleness import DEFAULT_CATCHUP, ObservedClient, SchedulerStaleness
from controller.claims.worker import AllocationWorker
from controller.networkpools.pool import pool_of_slice, pools_of_claim
from controller.networkpools.reconciler import NetworkPoolReconciler
from controller.parameters import ParametersReconciler, parameters_used_by
from controller.pinning import ParametersPinReconciler, claims_referencing
from controller.serving import Server, ServingThread
from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.httpserver import HTTPEndpoint, build_app
from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj, allocation_of
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.resourceslice import capabilities
from dradriver.resourceslice.capabilities import say_what_this_cluster_lacks
from dradriver.runtime import (
    Backoff,
    Controller,
    Informer,
    LeaderElectionConfig,
    LeaderElector,
    RuntimeMetrics,
    default_identity,
)
from dradriver.webhook.limits import WebhookLimits

if TYPE_CHECKING:  # the webhook (FastAPI, uvicorn) is imported only by a process serving it
    from fastapi import FastAPI

    from dradriver.webhook.server import WebhookServer

log = get_logger("controller")


@dataclass(frozen=True)
class Options:
    driver_name: str
    leader_elect: bool = True
    lease_namespace: str = "dradriver"
    lease_name: str = "dradriver-controller"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str | None = None
    http_address: str = "127.0.0.1:8081"
    workers: int = 4
    # Claim workers mostly wait on API writes (the searches take turns in the worker
    # process), so more of them means more writes in flight, not more CPU.
    claim_workers: int = 16
    shutdown_grace: float = 10.0
    allocation_namespaces: tuple[str, ...] = ()
    # Drivers besides driver_name whose classes make a claim ours (controller/claims/scope.py).
    allocation_drivers: tuple[str, ...] = ()
    # Wall-clock seconds one claim's search may take (all nodes), in the worker process.
    allocation_timeout: float = 10.0
    # Seconds a batch of fresh searches may take (controller.claims.fairqueue).
    allocation_turn: float = 0.5
    # Worker processes: 1, or 2 (fresh batches and slow claims side by side); 0: 2 where
    # the machine has two cores or more.
    allocation_workers: int = 0
    # After a watch gap, no allocation is written until kube-scheduler caught up (seconds).
    scheduler_catchup: float = DEFAULT_CATCHUP
    # The admission webhook, served over TLS in this process too when an address is given.
    webhook_address: str | None = None
    webhook_cert: Path | None = None
    webhook_key: Path | None = None
    # Body limit, selector budget and validation lanes of the webhook.
    webhook_limits: WebhookLimits = field(default_factory=WebhookLimits)


# How often a cache retries a failed list or watch, at most. An apiserver that is down
# refuses connections at once, so one attempt per informer per second costs little, and
# the caches catch up within a second of its return: with the runtime's default cap of
# 30 s they took 21-24 s after a 60 s outage, and no claim was allocated meanwhile.
RETRY_CAP = 1.0


SLOW_LANE_NICE = 10


def allocation_workers(asked: int) -> int:
    """The allocation worker processes to run: ``asked``, or with 0, two where the machine
    has two cores or more (the fresh and the slow lane side by side), else one."""
    return asked if asked > 0 else (2 if (os.cpu_count() or 1) >= 2 else 1)


def freed(old: Obj, new: Obj | None, activity: SchedulerActivity) -> None:
    """Tell ``activity`` when a claim's allocation goes away (cleared, or the claim deleted)."""
    if allocation_of(old) and (new is None or not allocation_of(new)):
        activity.device_freed()


def retry_backoff() -> Backoff:
    return Backoff(base=0.2, cap=RETRY_CAP)


class ControllerApp:
    def __init__(self, options: Options, client: KubeClient) -> None:
        self.options = options
        self.client = client
        self.metrics = RuntimeMetrics()
        # The informers and the Lease report their failures: kube-scheduler may be stale.
        self.staleness = SchedulerStaleness(options.scheduler_catchup)
        self.observed = ObservedClient(
            client, self.staleness, path_for(RESOURCE_V1, "resourceclaims")
        )
        self._informers()
        self.elector: LeaderElector | None = None
        if options.leader_elect:
            config = LeaderElectionConfig(
                namespace=options.lease_namespace,
                name=options.lease_name,
                lease_duration=options.lease_duration,
                renew_deadline=options.renew_deadline,
                retry_period=options.retry_period,
                identity=options.identity or default_identity(),
            )
            self.elector = LeaderElector(self.observed, config, self._lead, metrics=self.metrics)
        # The second runs the slow lane, at a lower CPU priority than everything else here.
        self.allocation_workers = [
            AllocationWorker(nice=SLOW_LANE_NICE if n else 0)
            for n in range(allocation_workers(options.allocation_workers))
        ]
        self.serving = ServingThread()
        self.http: HTTPEndpoint | None = None
        self.webhook: WebhookServer | None = None
        self.parameters_reconciler = ParametersReconciler(
            client, options.driver_name, self.parameters, self.is_leader, claims=self.claims
        )
        claims_controller = self._claims_controller()
        self.controllers = [
            self._parameters_controller(),
            claims_controller,
            self._pins_controller(),
            self._network_pools_controller(),
        ]
        self._leading = False

    def _informer(self, path: str, name: str, field_selector: str | None = None) -> Informer:
        return Informer(
            self.observed,
            path,
            name=name,
            field_selector=field_selector,
            metrics=self.metrics,
            backoff=retry_backoff(),
        )

    def _informers(self) -> None:
        driver = self.options.driver_name
        self.claims = self._informer(path_for(RESOURCE_V1, "resourceclaims"), "resourceclaims")
        self.parameters = self._informer(
            path_for(f"{driver}/{params.VERSION}", params.PLURAL), "deviceclaimparameters"
        )
        self.slices = self._informer(path_for(RESOURCE_V1, "resourceslices"), "resourceslices")
        self.classes = self._informer(path_for(RESOURCE_V1, "deviceclasses"), "deviceclasses")
        self.nodes = self._informer(path_for("v1", "nodes"), "nodes")
        # Pods not bound yet: the controller holds its writes while the scheduler decides.
        self.pending_pods = self._informer(
            path_for("v1", "pods"), "unscheduled-pods", field_selector="spec.nodeName="
        )
        self.network_pools = self._informer(
            path_for(f"{driver}/{net.VERSION}", net.PLURAL), "networkdevicepools"
        )
        self.informers = [
            self.claims,
            self.parameters,
            self.slices,
            self.classes,
            self.nodes,
            self.pending_pods,
            self.network_pools,
        ]

    def _parameters_controller(self) -> Controller:
        driver = self.options.driver_name
        return (
            Controller(
                "deviceclaimparameters",
                self.parameters_reconciler,
                workers=self.options.workers,
                metrics=self.metrics,
            )
            .watches(self.parameters)
            .watches(self.claims, parameters_used_by(driver))  # the in-use finalizer
        )

    def _claims_controller(self) -> Controller:
        """Immediate allocation. The controller (and its queue) comes first: the claim
        pipeline's parts enqueue keys into it."""
        o = self.options
        controller = Controller(
            "resourceclaims", self._reconcile_claim, workers=o.claim_workers, metrics=self.metrics
        )
        context = ClaimContext.create(
            self.client,
            o.driver_name,
            self.claims,
            scheduler=SchedulerActivity(self.pending_pods, staleness=self.staleness),
            is_leader=self.is_leader,
            enqueue=controller.enqueue,
            namespaces=o.allocation_namespaces,
            registry=self.metrics.registry,
            allocation_drivers=o.allocation_drivers,
        )
        self.claim_reconciler = ClaimReconciler(
            context,
            ClaimSources(self.parameters, self.slices, self.classes, self.nodes),
            ClaimSettings(
                fence_namespace=o.lease_namespace,  # fence claims live by the Lease
                allocation_timeout=o.allocation_timeout,
                allocation_turn=o.allocation_turn,
            ),
            worker=self.allocation_workers[0],
            slow_worker=self.allocation_workers[1] if len(self.allocation_workers) > 1 else None,
        )
        activity = context.scheduler
        self.claims.add_handler(  # a freed device re-queues the scheduler's unschedulable pods
            on_update=lambda old, new: freed(old, new, activity),
            on_delete=lambda obj: freed(obj, None, activity),
        )
        waiting = self.claim_reconciler.waiting_keys
        return (
            controller.watches(self.claims)
            .watches(self.parameters, claims_using(self.claims, o.driver_name))
            .watches(self.slices, waiting)
            .watches(self.classes, self.claim_reconciler.class_keys)
            .watches(self.nodes, waiting)
            .watches(self.pending_pods, self.claim_reconciler.deferred_keys)
        )

    async def _reconcile_claim(self, key: str) -> None:
        await self.claim_reconciler(key)

    def _pins_controller(self) -> Controller:
        """Scheduler-allocated claims that reference parameters: pin them for the node."""
        driver = self.options.driver_name
        self.pin_reconciler = ParametersPinReconciler(
            self.client,
            driver,
            self.claims,
            self.parameters,
            self.is_leader,
            namespaces=self.options.allocation_namespaces,
        )
        return (
            Controller(
                "parameter-pins",
                self.pin_reconciler,
                workers=self.options.workers,
                metrics=self.metrics,
            )
            .watches(self.claims)
            .watches(self.parameters, claims_referencing(self.claims, driver))
        )

    def _network_pools_controller(self) -> Controller:
        """Network-attached pools: publish their slices, attach/detach on allocation."""
        driver = self.options.driver_name
        self.network_reconciler = NetworkPoolReconciler(
            self.client,
            driver,
            self.network_pools,
            self.claims,
            self.slices,
            self.is_leader,
            namespaces=self.options.allocation_namespaces,
        )
        return (
            Controller(
                "networkdevicepools",
                self.network_reconciler,
                workers=self.options.workers,
                metrics=self.metrics,
            )
            .watches(self.network_pools)
            .watches(self.claims, pools_of_claim(driver))
            .watches(self.slices, pool_of_slice(driver))
        )

    def is_leader(self) -> bool:
        return self.elector.is_leader if self.elector is not None else self._leading

    @property
    def synced(self) -> bool:
        return all(i.has_synced for i in self.informers)

    def ready(self) -> tuple[bool, str]:
        """Ready = the leader, or a standby with synced caches (a warm replacement).

        Without leader election there is no standby: ready once the caches synced.
        """
        waiting = [
            f"{i.name} ({i.last_error})" if i.last_error else i.name
            for i in self.informers
            if not i.has_synced
        ]
        if self.elector is not None and self.elector.is_leader:
            return True, "leader" + (f", caches syncing: {', '.join(waiting)}" if waiting else "")
        if waiting:
            return False, f"caches not synced: {', '.join(waiting)}"
        if self.elector is None:
            return True, "caches synced (no leader election)"
        return True, f"standby with synced caches (leader: {self.elector.leader or 'none'})"

    def webhook_app(self) -> FastAPI:
        """The admission webhook's app (POST /validate, /healthz, /readyz, /metrics), with
        this process's readiness and metrics registry. Validation needs no leader: every
        replica serves it. Build it once (it registers the webhook's metrics)."""
        from dradriver.webhook.app import build_app as build_webhook_app
        from dradriver.webhook.validation import Settings as WebhookSettings

        # Every class of the driver (as the standalone webhook and the registration's
        # matchConditions have it): a request naming any of them gets its selectors
        # compiled and cost-checked, not only one naming the class called like the driver.
        limits = self.options.webhook_limits
        settings = limits.settings(WebhookSettings.for_driver(self.options.driver_name))
        return build_webhook_app(
            settings,
            self.metrics.registry,
            self.ready,
            max_body_bytes=limits.max_body_bytes,
            pool_limits=limits.pool,
        )

    def servers(self) -> list[Server]:
        """The HTTP servers: probes and metrics, and the webhook when it has an address."""
        o = self.options
        self.http = HTTPEndpoint(
            build_app(self.ready, self.metrics.registry, "dradriver-controller"), o.http_address
        )
        servers: list[Server] = [self.http]
        if o.webhook_address is not None:
            if o.webhook_cert is None or o.webhook_key is None:
                raise ValueError("the webhook needs a certificate and a key")
            from dradriver.webhook.server import WebhookServer

            self.webhook = WebhookServer(
                self.webhook_app(), o.webhook_address, o.webhook_cert, o.webhook_key
            )
            servers.append(self.webhook)
        return servers

    async def _lead(self) -> None:
        """Runs while this replica leads; cancelled when the Lease is lost. The fresh
        lane's allocation worker starts at once, not at the first claim (a start takes
        about 0.5 s); the slow lane's starts with its first claim (one whose search ran
        out of budget: most clusters never have one), so its memory (about 40 MiB) is
        spent only then."""
        self._leading = True
        try:
            async with asyncio.TaskGroup() as group:  # one failing cancels the others
                for worker in self.allocation_workers[:1]:
                    group.create_task(worker.start(), name="allocation worker start")
                for c in self.controllers:
                    group.create_task(c.run(), name=f"controller {c.name}")
        finally:
            self._leading = False

    async def run(self, stop: asyncio.Event) -> None:
        await say_what_this_cluster_lacks(
            self.client,
            self.options.driver_name,
            "network/capability-probe",
            None,
            capabilities.NETWORK_FEATURES,
        )
        await self.serving.start(self.servers())
        for informer in self.informers:
            informer.start()
        leading = asyncio.create_task(
            self.elector.run() if self.elector is not None else self._lead(), name="leading"
        )
        log.info(
            "controller running",
            driver=self.options.driver_name,
            leader_elect=self.options.leader_elect,
            identity=self.elector.identity if self.elector is not None else "",
            http=self.options.http_address,
            webhook=self.options.webhook_address or "",
        )
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([leading, stopping], return_when=asyncio.FIRST_COMPLETED)
            if leading.done():
                leading.result()  # the leading task failed: exit with its error
                return
            log.info("shutting down", grace_seconds=self.options.shutdown_grace)
            was_leading = self._leading
            await asyncio.gather(
                *(c.shutdown(self.options.shutdown_grace) for c in self.controllers)
            )
            if was_leading:
                # The leading coroutine has returned: the elector releases the Lease.
                await asyncio.wait([leading], timeout=self.options.retry_period * 2)
        finally:
            stopping.cancel()
            leading.cancel()  # releases the Lease if we still hold it
            with contextlib.suppress(asyncio.CancelledError):
                await leading
            for informer in self.informers:
                await informer.stop()
            for worker in self.allocation_workers:
                await worker.close()
            await self.serving.stop()
            log.info("stopped")
