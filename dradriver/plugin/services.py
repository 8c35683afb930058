"""gRPC services the kubelet calls: registration, DRA v1/v1beta1, dra-health.

One implementation serves both DRA versions: the messages are the same but
for ``Device.share_id`` (v1 only), so the handlers are built per message
module.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import Any

import grpc

from dradriver.kubeletapi import (
    DRA_HEALTH_V1_IDENTIFIER,
    DRA_HEALTH_V1ALPHA1_IDENTIFIER,
    DRA_V1_IDENTIFIER,
    DRA_V1BETA1_IDENTIFIER,
    PLUGIN_TYPE_DRA,
)
from dradriver.kubeletapi.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    drahealth_v1_pb2,
    drahealth_v1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from dradriver.log import get_logger
from dradriver.plugin.interface import (
    ClaimRef,
    DeviceHealth,
    DRADriver,
    PrepareResult,
    claim_ref_problem,
)

log = get_logger("plugin.grpc")

# A kubelet takes the first DRA service of this list it knows; a 1.37+ kubelet
# takes the newest health service listed (1.34-1.36 know only v1alpha1 and
# ignore the unknown v1 entry).
SUPPORTED_VERSIONS = [
    DRA_V1_IDENTIFIER,
    DRA_V1BETA1_IDENTIFIER,
    DRA_HEALTH_V1_IDENTIFIER,
    DRA_HEALTH_V1ALPHA1_IDENTIFIER,
]
# The kubelet marks a device Unknown when it is not re-reported within this time.
HEALTH_TIMEOUT_SECONDS = 30
HEALTH_RESEND_SECONDS = HEALTH_TIMEOUT_SECONDS / 3
# Told (service identifier, method) for every call the kubelet makes: which API
# versions a kubelet really uses is found this way, not assumed from its release.
KubeletCallHook = Callable[[str, str], None]


class RegistrationService(pluginregistration_v1_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    """Answers the kubelet's plugin watcher; records whether registration succeeded."""

    def __init__(self, driver_name: str, endpoint: str) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.registered = asyncio.Event()
        self.last_error = ""
        self.registrations = 0
        self.on_registered: Callable[[], None] | None = None

    async def GetInfo(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        # The kubelet gives GetInfo one second: no I/O here.
        return pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE_DRA,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=SUPPORTED_VERSIONS,
        )

    async def NotifyRegistrationStatus(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        if request.plugin_registered:
            self.registrations += 1
            self.last_error = ""
            self.registered.set()
            if self.on_registered is not None:
                self.on_registered()
            log.info(
                "registered with the kubelet",
                driver=self.driver_name,
                endpoint=self.endpoint,
                times=self.registrations,
            )
        else:
            self.registered.clear()
            self.last_error = request.error
            log.error("the kubelet rejected the registration", error=request.error)
            await context.abort(grpc.StatusCode.UNKNOWN, f"registration failed: {request.error}")
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


def _claim_refs(request: Any) -> tuple[list[ClaimRef], dict[str, str]]:
    """The claims the driver may work on (valid, each UID once), and an error per UID
    that it may not: an invalid reference, or one UID named as two different claims.
    One bad claim costs only its own entry in the response, never the whole call.
    """
    first: dict[str, ClaimRef] = {}
    errors: dict[str, str] = {}
    for c in request.claims:
        claim = ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name)
        problem = claim_ref_problem(claim)
        if problem:
            errors[claim.uid] = problem
            continue
        seen = first.setdefault(claim.uid, claim)
        if seen != claim:
            errors[claim.uid] = (
                f"claim uid {claim.uid} is named twice in one request, as {seen} and {claim}"
            )
    return [c for uid, c in first.items() if uid not in errors], errors


class DRAService:
    """NodePrepareResources / NodeUnprepareResources for one API version."""

    def __init__(
        self,
        driver: DRADriver,
        pb2: ModuleType,
        with_share_id: bool,
        identifier: str = "",
        on_kubelet_call: KubeletCallHook | None = None,
    ) -> None:
        self._driver = driver
        self._pb2 = pb2
        self._with_share_id = with_share_id
        self.identifier = identifier
        self._on_kubelet_call = on_kubelet_call
        self.on_call: Callable[[str, float, bool], None] | None = None

    def _device(self, dev: Any) -> Any:
        fields: dict[str, Any] = {
            "request_names": list(dev.request_names),
            "pool_name": dev.pool,
            "device_name": dev.device,
            "cdi_device_ids": list(dev.cdi_ids),
        }
        if self._with_share_id and dev.share_id:
            fields["share_id"] = dev.share_id
        return self._pb2.Device(**fields)

    def _observe(self, method: str, started: float, failed: bool) -> None:
        if self._on_kubelet_call is not None:
            self._on_kubelet_call(self.identifier, method)
        if self.on_call is not None:
            self.on_call(method, time.monotonic() - started, failed)

    async def NodePrepareResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        started = time.monotonic()
        claims, errors = _claim_refs(request)
        results = await self._driver.prepare_claims(claims) if claims else {}
        response = self._pb2.NodePrepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        failed = bool(errors)
        for claim in claims:
            result = results.get(claim.uid) or PrepareResult(error="driver returned no result")
            entry = response.claims[claim.uid]
            if result.error:
                failed = True
                entry.error = result.error
            else:
                entry.devices.extend(self._device(d) for d in result.devices)
        self._observe("NodePrepareResources", started, failed)
        return response

    async def NodeUnprepareResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        started = time.monotonic()
        claims, refused = _claim_refs(request)
        errors = {**(await self._driver.unprepare_claims(claims) if claims else {}), **refused}
        response = self._pb2.NodeUnprepareResourcesResponse()
        for uid in [*(c.uid for c in claims), *refused]:
            response.claims[uid].error = errors.get(uid, "")
        self._observe("NodeUnprepareResources", started, any(errors.values()))
        return response


class HealthService:
    """dra-health: streams the complete device health list on every change.

    Re-sends the list within the kubelet's health timeout even without changes,
    so devices do not turn Unknown.
    """

    def __init__(
        self,
        pb2: ModuleType,
        resend_interval: float = HEALTH_RESEND_SECONDS,
        identifier: str = "",
        on_kubelet_call: KubeletCallHook | None = None,
    ) -> None:
        self._pb2 = pb2
        self.identifier = identifier
        self._on_kubelet_call = on_kubelet_call
        self._resend_interval = resend_interval
        self._snapshot: list[DeviceHealth] = []
        self._changed = asyncio.Condition()
        self._closing = False

    async def close(self) -> None:
        """End open streams cleanly (before the server stops, so nothing is cancelled)."""
        async with self._changed:
            self._closing = True
            self._changed.notify_all()

    async def publish(self, devices: list[DeviceHealth]) -> None:
        async with self._changed:
            self._snapshot = list(devices)
            self._changed.notify_all()

    def _response(self) -> Any:
        now = int(time.time())
        pb2 = self._pb2
        out = pb2.NodeWatchResourcesResponse()
        for d in self._snapshot:
            health = (
                pb2.UNKNOWN if d.healthy is None else pb2.HEALTHY if d.healthy else pb2.UNHEALTHY
            )
            out.devices.append(
                pb2.DeviceHealth(
                    device=pb2.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                    health=health,
                    last_updated_time=now,
                    health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
                    message=d.message[:1024],
                )
            )
        return out

    async def NodeWatchResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        if self._on_kubelet_call is not None:
            self._on_kubelet_call(self.identifier, "NodeWatchResources")
        yield self._response()
        while not self._closing:
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self._resend_interval)
            if self._closing:
                return
            yield self._response()


def add_dra_services(
    server: grpc.aio.Server,
    driver: DRADriver,
    health_resend: float = HEALTH_RESEND_SECONDS,
    on_kubelet_call: KubeletCallHook | None = None,
) -> tuple[list[DRAService], list[HealthService]]:
    hook = on_kubelet_call
    dra = [
        DRAService(driver, dra_v1_pb2, True, DRA_V1_IDENTIFIER, hook),
        DRAService(driver, dra_v1beta1_pb2, False, DRA_V1BETA1_IDENTIFIER, hook),
    ]
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(dra[0], server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(dra[1], server)
    health = [
        HealthService(drahealth_v1alpha1_pb2, health_resend, DRA_HEALTH_V1ALPHA1_IDENTIFIER, hook),
        HealthService(drahealth_v1_pb2, health_resend, DRA_HEALTH_V1_IDENTIFIER, hook),
    ]
    drahealth_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(health[0], server)
    drahealth_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(health[1], server)
    return dra, health


def add_registration_service(server: grpc.aio.Server, service: RegistrationService) -> None:
    pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(service, server)
