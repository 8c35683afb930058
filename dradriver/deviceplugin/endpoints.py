"""The kubelet's device-plugin API v1beta1: serving each resource and registering it.

One :class:`DevicePluginEndpoint` per extended resource: a ``v1beta1.DevicePlugin`` gRPC
server on its own socket in the kubelet's device-plugin directory. The
:class:`DevicePluginManager` serves every endpoint *before* it calls
``v1beta1.Registration/Register`` on ``kubelet.sock`` (the kubelet dials the plugin back
inside Register), and keeps them registered:

* the kubelet deletes every socket in its device-plugin directory when it starts, then
  listens on a new ``kubelet.sock``: a vanished plugin socket is served again, and a
  ``kubelet.sock`` that is not the one we registered with (a different inode or ctime)
  means a kubelet restart, so we register again, all without a process restart;
* while the kubelet is absent, registration is retried with bounded exponential backoff
  (a new ``kubelet.sock`` cuts the wait short), logging the first failure and then
  every tenth, so the log says what is wrong without flooding.

What each endpoint answers is :class:`~dradriver.deviceplugin.server.DevicePluginService`'s
business, and behind it the resource's backend's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from dradriver.deviceplugin.server import DevicePluginBackend, DevicePluginService
from dradriver.kubeletapi import DEVICE_PLUGIN_API_VERSION
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2 as pb
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from dradriver.kubeletapi.sockets import serve_unix
from dradriver.log import get_logger

log = get_logger("plugin.deviceplugin")

KUBELET_SOCKET_NAME = "kubelet.sock"
# A unix socket path must fit in sockaddr_un.sun_path (108 bytes with the NUL).
MAX_SOCKET_PATH = 107
# The kubelet dials the plugin back inside Register with a 10 s timeout.
REGISTER_TIMEOUT_SECONDS = 15.0
LOG_EVERY_NTH_FAILURE = 10


# --- endpoints and registration ----------------------------------------------------


def socket_name(resource_name: str, instance: str = "", plugin_dir: Path | None = None) -> str:
    """``dradriver.dev/mock`` -> ``dradriver.dev_mock.sock`` (a domain has no ``_``, so the
    mapping is unique); hashed when the path would not fit in a unix socket address."""
    suffix = f"-{instance}" if instance else ""
    name = f"{resource_name.replace('/', '_')}{suffix}.sock"
    if plugin_dir is not None and len(str(plugin_dir / name).encode()) > MAX_SOCKET_PATH:
        digest = hashlib.sha256(resource_name.encode()).hexdigest()[:16]
        name = f"dp-{digest}{suffix}.sock"
    return name


FileSignature = tuple[int, int, int]


def file_signature(path: Path) -> FileSignature | None:
    """Identity of a file: a re-created socket differs even if the inode number is reused."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class DevicePluginEndpoint:
    """The gRPC server of one resource and its registration state."""

    def __init__(self, backend: DevicePluginBackend, plugin_dir: Path, name: str) -> None:
        self.backend = backend
        self.service = DevicePluginService(backend)
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / name
        self._server: grpc.aio.Server | None = None
        self._served: FileSignature | None = None
        self.registered = asyncio.Event()
        self.registrations = 0
        self.last_error = ""

    @property
    def resource_name(self) -> str:
        return self.backend.resource_name

    def socket_intact(self) -> bool:
        return self._served is not None and file_signature(self.socket) == self._served

    async def serve(self) -> None:
        """(Re)start the server on a fresh socket."""
        await self.stop_serving()
        self.plugin_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        await serve_unix(server, self.socket)
        self._server = server
        self._served = file_signature(self.socket)
        log.info(
            "serving the device-plugin API", resource=self.resource_name, socket=str(self.socket)
        )

    async def stop_serving(self) -> None:
        if self._server is not None:
            self.service.close_streams()
            await self._server.stop(grace=0.5)
            self._server = None
        if self._served is not None and file_signature(self.socket) == self._served:
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()
        self._served = None


@dataclass
class _RegistrationState:
    registered_with: FileSignature | None = None
    last_seen: FileSignature | None = None
    next_attempt: float = 0.0
    backoff: float = 0.0
    failures: int = 0
    reason: str = "initial"


class DevicePluginManager:
    """Serves the endpoints, registers them with the kubelet and keeps them registered."""

    def __init__(
        self,
        plugin_dir: Path,
        endpoints: Sequence[DevicePluginEndpoint],
        *,
        watch_interval: float = 1.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        register_timeout: float = REGISTER_TIMEOUT_SECONDS,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET_NAME
        self.endpoints = list(endpoints)
        self.watch_interval = watch_interval
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.register_timeout = register_timeout
        # (resource, reason) after each successful Register; reason is "initial",
        # "kubelet-restart" or "socket-removed".
        self.on_registered: Callable[[str, str], None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def endpoint(self, resource_name: str) -> DevicePluginEndpoint:
        for e in self.endpoints:
            if e.resource_name == resource_name:
                return e
        raise KeyError(resource_name)

    @property
    def registered(self) -> bool:
        return all(e.registered.is_set() for e in self.endpoints)

    def not_registered(self) -> list[str]:
        """``resource: last error`` for every endpoint the kubelet has not accepted (yet)."""
        return [
            f"{e.resource_name}: {e.last_error or 'registering'}"
            for e in self.endpoints
            if not e.registered.is_set()
        ]

    async def start(self) -> None:
        """Serve every endpoint first, then register them in the background."""
        for e in self.endpoints:
            await e.serve()
        self._tasks = [
            asyncio.create_task(self._keep_registered(e), name=f"deviceplugin {e.resource_name}")
            for e in self.endpoints
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for e in self.endpoints:
            await e.stop_serving()
            e.registered.clear()
        log.info("device-plugin endpoints stopped", resources=len(self.endpoints))

    async def _keep_registered(self, endpoint: DevicePluginEndpoint) -> None:
        state = _RegistrationState(backoff=self.backoff_initial)
        while True:
            try:
                await self._tick(endpoint, state)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never stop watching; the next tick retries
                log.exception("device-plugin watchdog error", resource=endpoint.resource_name)
                endpoint.last_error = str(e)
            await asyncio.sleep(self.watch_interval)

    async def _tick(self, endpoint: DevicePluginEndpoint, state: _RegistrationState) -> None:
        kubelet = file_signature(self.kubelet_socket)
        if not endpoint.socket_intact():
            # The kubelet wipes all sockets in its directory when it starts.
            restarted = state.registered_with is not None and kubelet != state.registered_with
            reason = "kubelet-restart" if restarted else "socket-removed"
            log.warning(
                "device-plugin socket vanished; serving it again and re-registering",
                resource=endpoint.resource_name,
                socket=str(endpoint.socket),
                reason=reason,
            )
            await endpoint.serve()
            self._unregistered(endpoint, state, reason)
        elif endpoint.registered.is_set() and kubelet != state.registered_with:
            log.warning(
                "the kubelet's registration socket was re-created (kubelet restart); "
                "registering again",
                resource=endpoint.resource_name,
                kubelet_socket=str(self.kubelet_socket),
            )
            self._unregistered(endpoint, state, "kubelet-restart")
        if endpoint.registered.is_set():
            return
        if kubelet != state.last_seen:
            state.last_seen = kubelet
            if kubelet is not None:  # a (new) kubelet appeared: do not wait out the backoff
                state.next_attempt = 0.0
        if time.monotonic() >= state.next_attempt:
            await self._register(endpoint, state, kubelet)

    def _unregistered(
        self, endpoint: DevicePluginEndpoint, state: _RegistrationState, reason: str
    ) -> None:
        endpoint.registered.clear()
        state.reason = reason
        state.next_attempt = 0.0
        state.backoff = self.backoff_initial

    async def _register(
        self,
        endpoint: DevicePluginEndpoint,
        state: _RegistrationState,
        kubelet: FileSignature | None,
    ) -> None:
        try:
            if kubelet is None:
                raise ConnectionError(
                    f"{self.kubelet_socket} does not exist: is the kubelet running, and is "
                    f"{self.plugin_dir} the host's /var/lib/kubelet/device-plugins?"
                )
            await self._call_register(endpoint)
        except (grpc.aio.AioRpcError, OSError) as e:
            state.failures += 1
            error = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
            endpoint.last_error = f"cannot register with the kubelet: {error}"
            state.next_attempt = time.monotonic() + state.backoff
            fields = {
                "resource": endpoint.resource_name,
                "kubelet_socket": str(self.kubelet_socket),
                "attempt": state.failures,
                "retry_in": f"{state.backoff:.1f}s",
                "error": error,
            }
            if state.failures == 1 or state.failures % LOG_EVERY_NTH_FAILURE == 0:
                log.warning("cannot register with the kubelet's device manager; retrying", **fields)
            else:
                log.debug("device-plugin registration failed again", **fields)
            state.backoff = min(state.backoff * 2, self.backoff_max)
            return
        reason = state.reason
        endpoint.registrations += 1
        endpoint.last_error = ""
        state.registered_with = kubelet
        state.backoff = self.backoff_initial
        log.info(
            "registered with the kubelet's device manager",
            resource=endpoint.resource_name,
            endpoint=endpoint.socket.name,
            reason=reason,
            failed_attempts=state.failures,
        )
        state.failures = 0
        state.reason = "initial"
        endpoint.registered.set()
        if self.on_registered is not None:
            self.on_registered(endpoint.resource_name, reason)

    async def _call_register(self, endpoint: DevicePluginEndpoint) -> None:
        backend = endpoint.backend
        request = pb.RegisterRequest(
            version=DEVICE_PLUGIN_API_VERSION,
            endpoint=endpoint.socket.name,
            resource_name=backend.resource_name,
            options=pb.DevicePluginOptions(
                pre_start_required=backend.pre_start_required,
                get_preferred_allocation_available=backend.preferred_allocation_available,
            ),
        )
        async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(request, timeout=self.register_timeout)
