"""The controller process: informers, leader election, reconcilers, HTTP endpoints.

Informers run in every replica, so a standby has warm caches and takes over
without listing first. The reconcilers run only in the leader: they start when
the Lease is acquired and are cancelled the moment it is lost. On SIGTERM the
leader finishes in-flight reconciles (bounded), then releases the Lease so a
standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from controller.reconcilers import ClaimReconciler, ParametersReconciler, claims_using
from dradriver import parameters as params
from dradriver.controllerruntime import (
    Controller,
    Informer,
    LeaderElectionConfig,
    LeaderElector,
    RuntimeMetrics,
    default_identity,
)
from dradriver.httpserver import HTTPEndpoint, build_app
from dradriver.kube.client import KubeClient
from dradriver.kube.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger

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
    shutdown_grace: float = 10.0
    allocation_namespaces: tuple[str, ...] = ()


class ControllerApp:
    def __init__(self, options: Options, client: KubeClient) -> None:
        self.options = options
        self.client = client
        self.metrics = RuntimeMetrics()
        driver = options.driver_name
        self.claims = Informer(
            client,
            path_for(RESOURCE_V1, "resourceclaims"),
            name="resourceclaims",
            metrics=self.metrics,
        )
        self.parameters = Informer(
            client,
            path_for(f"{driver}/{params.VERSION}", params.PLURAL),
            name="deviceclaimparameters",
            metrics=self.metrics,
        )
        self.slices = Informer(
            client,
            path_for(RESOURCE_V1, "resourceslices"),
            name="resourceslices",
            metrics=self.metrics,
        )
        self.classes = Informer(
            client,
            path_for(RESOURCE_V1, "deviceclasses"),
            name="deviceclasses",
            metrics=self.metrics,
        )
        self.nodes = Informer(client, path_for("v1", "nodes"), name="nodes", metrics=self.metrics)
        # Pods not bound yet: the controller holds its writes while the scheduler decides.
        self.pending_pods = Informer(
            client,
            path_for("v1", "pods"),
            name="unscheduled-pods",
            field_selector="spec.nodeName=",
            metrics=self.metrics,
        )
        self.informers = [
            self.claims,
            self.parameters,
            self.slices,
            self.classes,
            self.nodes,
            self.pending_pods,
        ]
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
            self.elector = LeaderElector(client, config, self._lead, metrics=self.metrics)
        self.parameters_reconciler = ParametersReconciler(
            client, driver, self.parameters, self.is_leader
        )
        self.claim_reconciler = ClaimReconciler(
            client,
            driver,
            self.claims,
            self.parameters,
            self.slices,
            self.classes,
            self.nodes,
            self.is_leader,
            namespaces=options.allocation_namespaces,
            pending_pods=self.pending_pods,
        )
        waiting = self.claim_reconciler.waiting_keys
        claims_controller = (
            Controller(
                "resourceclaims",
                self.claim_reconciler,
                workers=options.workers,
                metrics=self.metrics,
            )
            .watches(self.claims)
            .watches(self.parameters, claims_using(self.claims, driver))
            .watches(self.slices, waiting)
            .watches(self.classes, waiting)
            .watches(self.nodes, waiting)
            .watches(self.pending_pods, self.claim_reconciler.deferred_keys)
        )
        self.claim_reconciler.enqueue = claims_controller.enqueue
        self.controllers = [
            Controller(
                "deviceclaimparameters",
                self.parameters_reconciler,
                workers=options.workers,
                metrics=self.metrics,
            ).watches(self.parameters),
            claims_controller,
        ]
        self._leading = False

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

    async def _lead(self) -> None:
        """Runs while this replica leads; cancelled when the Lease is lost."""
        self._leading = True
        try:
            async with asyncio.TaskGroup() as group:  # one failing cancels the others
                for c in self.controllers:
                    group.create_task(c.run(), name=f"controller {c.name}")
        finally:
            self._leading = False

    async def run(self, stop: asyncio.Event) -> None:
        http = HTTPEndpoint(
            build_app(self.ready, self.metrics.registry, "dradriver-controller"),
            self.options.http_address,
        )
        await http.start()
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
            await http.stop()
            log.info("stopped")
