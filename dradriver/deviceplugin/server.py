"""The kubelet's device-plugin API v1beta1: the service one resource answers with.

:class:`DevicePluginService` is the ``v1beta1.DevicePlugin`` gRPC servicer of one
extended resource. Invariants: ListAndWatch sends the list of every
:meth:`~DevicePluginService.publish` (one made while a stream is between two sends is
never lost); GetPreferredAllocation only passes on device IDs this plugin listed, so its
work is bounded by the device count; a :class:`DevicePluginError` the backend raises
reaches the kubelet with its status code and message; every call is timed through
``on_call``. Serving it on a socket and registering with the kubelet is
:mod:`dradriver.deviceplugin.endpoints`' business; what the devices are, how they are
allocated and what a container gets is the :class:`DevicePluginBackend`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from dradriver.kubeletapi import DEVICE_PLUGIN_HEALTHY, DEVICE_PLUGIN_UNHEALTHY
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2 as pb
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from dradriver.log import get_logger

log = get_logger("plugin.deviceplugin")

# The kubelet asks for one container at a time.
MAX_CONTAINER_REQUESTS = 64


# --- what a backend deals in ----------------------------------------------------


@dataclass(frozen=True)
class PluginDevice:
    """One device as ListAndWatch reports it."""

    id: str
    healthy: bool
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class DeviceNodeSpec:
    container_path: str
    host_path: str
    permissions: str = "rwm"


@dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass
class ContainerAllocation:
    """What one container gets: CDI device IDs plus the same edits spelled out directly."""

    cdi_ids: list[str] = field(default_factory=list)
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[MountSpec] = field(default_factory=list)
    devices: list[DeviceNodeSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)

    def to_proto(self) -> Any:
        return pb.ContainerAllocateResponse(
            envs=self.envs,
            mounts=[
                pb.Mount(
                    container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
                )
                for m in self.mounts
            ],
            devices=[
                pb.DeviceSpec(
                    container_path=d.container_path,
                    host_path=d.host_path,
                    permissions=d.permissions,
                )
                for d in self.devices
            ],
            annotations=self.annotations,
            cdi_devices=[pb.CDIDevice(name=i) for i in self.cdi_ids],
        )


class DevicePluginError(Exception):
    """A request the backend refuses; the message reaches the kubelet (and the pod's events)."""

    def __init__(
        self, message: str, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION
    ) -> None:
        super().__init__(message)
        self.code = code


class DevicePluginBackend(Protocol):
    """The device logic behind one resource."""

    @property
    def resource_name(self) -> str: ...

    @property
    def pre_start_required(self) -> bool: ...

    @property
    def preferred_allocation_available(self) -> bool: ...

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]: ...

    async def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation: ...

    async def pre_start(self, device_ids: Sequence[str]) -> None: ...


# --- the DevicePlugin service ----------------------------------------------------


class DevicePluginService(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    """``v1beta1.DevicePlugin`` for one resource; ListAndWatch streams :meth:`publish` calls."""

    def __init__(self, backend: DevicePluginBackend) -> None:
        self.backend = backend
        self._devices: tuple[PluginDevice, ...] = ()
        self._wakeup = asyncio.Event()
        self._closing = asyncio.Event()
        self.version = 0
        self.streams = 0
        # (method, seconds, failed) after every call, for metrics and benchmarks.
        self.on_call: Callable[[str, float, bool], None] | None = None

    @property
    def devices(self) -> tuple[PluginDevice, ...]:
        return self._devices

    def publish(self, devices: Sequence[PluginDevice]) -> bool:
        """Set the device list; open ListAndWatch streams get it at once. True if it changed."""
        new = tuple(sorted(devices, key=lambda d: d.id))
        if new == self._devices:
            return False
        self._devices = new
        self.version += 1
        wakeup, self._wakeup = self._wakeup, asyncio.Event()
        wakeup.set()
        return True

    def close_streams(self) -> None:
        """End the open ListAndWatch streams cleanly (before the server stops)."""
        closing, self._closing = self._closing, asyncio.Event()
        closing.set()
        wakeup, self._wakeup = self._wakeup, asyncio.Event()
        wakeup.set()

    def _list_response(self) -> Any:
        return pb.ListAndWatchResponse(
            devices=[
                pb.Device(
                    ID=d.id,
                    health=DEVICE_PLUGIN_HEALTHY if d.healthy else DEVICE_PLUGIN_UNHEALTHY,
                    topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in d.numa_nodes])
                    if d.numa_nodes
                    else None,
                )
                for d in self._devices
            ]
        )

    def _observe(self, method: str, started: float, failed: bool) -> None:
        if self.on_call is not None:
            self.on_call(method, time.monotonic() - started, failed)

    async def GetDevicePluginOptions(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        return pb.DevicePluginOptions(
            pre_start_required=self.backend.pre_start_required,
            get_preferred_allocation_available=self.backend.preferred_allocation_available,
        )

    async def ListAndWatch(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        self.streams += 1
        log.info(
            "kubelet opened ListAndWatch",
            resource=self.backend.resource_name,
            devices=len(self._devices),
        )
        closing = self._closing
        try:
            while True:
                wakeup = self._wakeup  # taken before yielding: a publish meanwhile is not lost
                yield self._list_response()
                await wakeup.wait()
                if closing.is_set():
                    return
        finally:
            self.streams -= 1

    def _preferred_requests(self, request: Any) -> list[tuple[list[str], list[str], int]]:
        """The request bounded by what this plugin advertised: IDs it never listed are
        dropped (the kubelet only has ours; a device may have gone meanwhile), so the
        work is bounded by the device count whatever the caller sends."""
        if len(request.container_requests) > MAX_CONTAINER_REQUESTS:
            raise DevicePluginError(
                f"GetPreferredAllocation names {len(request.container_requests)} containers; "
                f"at most {MAX_CONTAINER_REQUESTS} are accepted",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        listed = {d.id for d in self._devices}
        out = []
        for req in request.container_requests:
            size = int(req.allocation_size)
            if not 0 <= size <= len(listed):
                raise DevicePluginError(
                    f"allocation size {size} is not between 0 and the {len(listed)} devices "
                    f"of {self.backend.resource_name}",
                    grpc.StatusCode.INVALID_ARGUMENT,
                )
            available = [i for i in dict.fromkeys(req.available_deviceIDs) if i in listed]
            must = [i for i in dict.fromkeys(req.must_include_deviceIDs) if i in listed]
            out.append((available, must, size))
        return out

    def _preferred(self, requests: list[tuple[list[str], list[str], int]]) -> list[list[str]]:
        return [self.backend.preferred_allocation(*r) for r in requests]

    async def GetPreferredAllocation(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        started = time.monotonic()
        response = pb.PreferredAllocationResponse()
        try:
            requests = self._preferred_requests(request)
            # Off the loop: the loop also serves ListAndWatch, Allocate and registration.
            answers = await asyncio.to_thread(self._preferred, requests)
        except DevicePluginError as e:
            self._observe("GetPreferredAllocation", started, True)
            await context.abort(e.code, str(e))
        for ids in answers:
            response.container_responses.append(
                pb.ContainerPreferredAllocationResponse(deviceIDs=ids)
            )
        self._observe("GetPreferredAllocation", started, False)
        return response

    async def Allocate(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.monotonic()
        response = pb.AllocateResponse()
        try:
            for req in request.container_requests:
                allocation = await self.backend.allocate(list(req.devices_ids))
                response.container_responses.append(allocation.to_proto())
        except DevicePluginError as e:
            self._observe("Allocate", started, True)
            await context.abort(e.code, str(e))
        except Exception as e:
            self._observe("Allocate", started, True)
            log.exception("Allocate failed unexpectedly", resource=self.backend.resource_name)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in dradriver: {e}")
        self._observe("Allocate", started, False)
        return response

    async def PreStartContainer(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        started = time.monotonic()
        try:
            await self.backend.pre_start(list(request.devices_ids))
        except DevicePluginError as e:
            self._observe("PreStartContainer", started, True)
            await context.abort(e.code, str(e))
        self._observe("PreStartContainer", started, False)
        return pb.PreStartContainerResponse()
