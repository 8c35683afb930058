"""Owns everything between a DRA driver and the kubelet but the device logic.

Its scope is Go's kubelet-plugin helper's: the sockets and gRPC services,
registration, health streams, and publishing the node's ResourceSlices
(:meth:`KubeletPluginHelper.publish_resources`); claims reach the driver fetched and
locked through :class:`dradriver.plugin.claims.ClaimRunner`, and device metadata is
:mod:`dradriver.plugin.devicemetadata`'s. The slice publisher is handed in (it is
:class:`dradriver.resourceslice.publisher.SlicePublisher`; frameworks do not import
each other) and run by the helper from :meth:`~KubeletPluginHelper.start` to
:meth:`~KubeletPluginHelper.stop`.

Start order follows the kubelet's expectations: the plugin directory, then
the DRA socket (so the kubelet can connect as soon as it registers us), then
the registration socket in ``plugins_registry``. A watchdog recreates the
registration socket if it disappears (kubelet restart with a wiped registry),
which makes the kubelet register the plugin again without a process restart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from dradriver.kubeletapi.sockets import serve_unix
from dradriver.log import get_logger
from dradriver.plugin.interface import DeviceHealth, DRADriver
from dradriver.plugin.services import (
    HEALTH_RESEND_SECONDS,
    DRAService,
    HealthService,
    KubeletCallHook,
    RegistrationService,
    add_dra_services,
    add_registration_service,
)

log = get_logger("plugin.helper")


class ResourcePublisher(Protocol):
    """What the helper needs of a slice publisher."""

    def set_pool(self, pool: Any) -> None:
        """Publish ``pool`` (replacing what was desired for it)."""
        ...

    async def run(self, on_error: Callable[[BaseException, str], None]) -> None:
        """Sync until cancelled."""
        ...


class Runnable(Protocol):
    """A background loop (the publisher's slice cache)."""

    async def run(self) -> None: ...


@dataclass(frozen=True)
class PluginPaths:
    """Socket paths; all derive from the kubelet root dir so several nodes can share a host."""

    kubelet_root: Path
    driver_name: str
    # Set per pod during rolling updates so old and new plugin never share a socket.
    instance: str = ""

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_root / "plugins" / self.driver_name

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def dra_socket(self) -> Path:
        suffix = f"-{self.instance}" if self.instance else ""
        return self.plugin_dir / f"dra{suffix}.sock"

    @property
    def registration_socket(self) -> Path:
        suffix = f"-{self.instance}" if self.instance else ""
        return self.registry_dir / f"{self.driver_name}{suffix}-reg.sock"


class KubeletPluginHelper:
    def __init__(
        self,
        driver: DRADriver,
        paths: PluginPaths,
        watchdog_interval: float = 1.0,
        health_resend: float = HEALTH_RESEND_SECONDS,
        *,
        publisher: ResourcePublisher | None = None,
        slice_cache: Runnable | None = None,
    ) -> None:
        self.driver = driver
        self.publisher = publisher
        self._publishing = [slice_cache] if slice_cache is not None else []
        self._tasks: list[asyncio.Task[None]] = []
        self._health_resend = health_resend
        self.paths = paths
        self.registration = RegistrationService(paths.driver_name, str(paths.dra_socket))
        self._dra_server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None
        self.dra_services: list[DRAService] = []
        self._health: list[HealthService] = []
        self._watchdog: asyncio.Task[None] | None = None
        self._watchdog_interval = watchdog_interval
        # Set before start(): told (service, method) of every DRA/health call.
        self.on_kubelet_call: KubeletCallHook | None = None

    def publish_resources(self, pool: Any) -> None:
        """Publish the node's pool; a change is synced (from :meth:`start` on)."""
        if self.publisher is None:
            raise RuntimeError(
                "KubeletPluginHelper has no slice publisher: pass publisher= to publish resources"
            )
        self.publisher.set_pool(pool)

    @property
    def registered(self) -> bool:
        return self.registration.registered.is_set()

    async def start(self) -> None:
        self.paths.plugin_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        self.paths.registry_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        self._dra_server = grpc.aio.server()
        self.dra_services, self._health = add_dra_services(
            self._dra_server, self.driver, self._health_resend, self.on_kubelet_call
        )
        await serve_unix(self._dra_server, self.paths.dra_socket)
        log.info("serving DRA", socket=str(self.paths.dra_socket))
        await self._start_registration()
        self._watchdog = asyncio.create_task(self._watch_sockets())
        self._tasks = [asyncio.create_task(loop.run()) for loop in self._publishing]
        if self.publisher is not None:
            self._tasks.append(asyncio.create_task(self.publisher.run(self.driver.handle_error)))

    async def _start_registration(self) -> None:
        if self._reg_server is not None:
            await self._reg_server.stop(grace=None)
        self._reg_server = grpc.aio.server()
        add_registration_service(self._reg_server, self.registration)
        await serve_unix(self._reg_server, self.paths.registration_socket)
        log.info("registration socket ready", socket=str(self.paths.registration_socket))

    async def _watch_sockets(self) -> None:
        while True:
            await asyncio.sleep(self._watchdog_interval)
            if not self.paths.registration_socket.exists():
                log.warning(
                    "registration socket vanished; recreating it",
                    socket=str(self.paths.registration_socket),
                )
                self.registration.registered.clear()
                try:
                    await self._start_registration()
                except Exception as e:  # keep watching; the next round retries
                    self.driver.handle_error(e, "recreating the registration socket")

    async def wait_registered(self) -> None:
        await self.registration.registered.wait()

    async def publish_health(self, devices: list[DeviceHealth]) -> None:
        for service in self._health:
            await service.publish(devices)

    async def stop(self) -> None:
        """Stop serving and remove our sockets, so a successor can start cleanly."""
        for task in [*self._tasks, *([self._watchdog] if self._watchdog else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for health in self._health:
            await health.close()
        servers: list[Any] = [self._reg_server, self._dra_server]
        for server in servers:
            if server is not None:
                await server.stop(grace=1)
        for path in (self.paths.registration_socket, self.paths.dra_socket):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        log.info("stopped", driver=self.paths.driver_name)
