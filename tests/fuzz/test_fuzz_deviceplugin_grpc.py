"""The device-plugin server (v1beta1) on malformed and oversized requests.

The real shim (inventory of mock devices, ledger and CDI specs in tmp, no kubelet to
register with) serves its resource socket; a blocking client sends Allocate,
GetPreferredAllocation and PreStartContainer with any device IDs, and raw bytes.
Every request gets a status, and after each one the server still allocates a device.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2 as dp
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kubeletplugin.legacy.shim import DevicePluginShim
from tests.fuzz.serverthread import LoopThread
from tests.fuzz.test_fuzz_dra_grpc import MAX_MESSAGE, NO_ANSWER, RPC_TIMEOUT
from tests.grpc.test_deviceplugin import RESOURCE, make_shim

FUZZ = settings.get_profile("fuzz")
SERVED = ["dev-0", "dev-1", "dev-2", "dev-3"]  # "solo" is on the node but DRA-only
METHODS = ("GetDevicePluginOptions", "Allocate", "GetPreferredAllocation", "PreStartContainer")


class DevicePluginNode:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dp-fuzz-", dir="/tmp"))
        self.loop = LoopThread()
        self.shim = self.loop.run(self._start())
        socket = self.shim.manager.endpoint(RESOURCE).socket
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub = dp_grpc.DevicePluginStub(self.channel)

    async def _start(self) -> DevicePluginShim:
        shim = make_shim(self.root, "shared")
        await shim.start()  # no kubelet.sock: registration retries in the background
        return shim

    def stop(self) -> None:
        self.channel.close()
        self.loop.run(self.shim.stop())
        self.loop.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def call(self, method: str, request: Any) -> tuple[grpc.StatusCode, Any]:
        try:
            return grpc.StatusCode.OK, getattr(self.stub, method)(request, timeout=RPC_TIMEOUT)
        except grpc.RpcError as e:
            return cast(grpc.Call, e).code(), None

    def call_raw(self, method: str, body: bytes) -> grpc.StatusCode:
        rpc = self.channel.unary_unary(
            f"/v1beta1.DevicePlugin/{method}", None, None
        )  # bytes in and out
        try:
            rpc(body, timeout=RPC_TIMEOUT)
        except grpc.RpcError as e:
            return cast(grpc.Call, e).code()
        return grpc.StatusCode.OK

    def still_serving(self) -> None:
        code, _ = self.call("GetDevicePluginOptions", dp.Empty())
        assert code == grpc.StatusCode.OK
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=["dev-0"])]
        )
        code, response = self.call("Allocate", request)
        assert code == grpc.StatusCode.OK, code
        [container] = response.container_responses
        assert [d.name for d in container.cdi_devices]


@pytest.fixture(scope="module")
def node() -> Iterator[DevicePluginNode]:
    plugin = DevicePluginNode()
    yield plugin
    plugin.stop()


device_ids = st.one_of(
    st.sampled_from([*SERVED, "solo"]),
    st.sampled_from(["", "dev-", "../dev-0", "dev-0\n", "x" * 5000]),
    st.text(max_size=20),
)
id_lists = st.lists(device_ids, max_size=6)


@settings(FUZZ, derandomize=True, max_examples=150, deadline=None)
@given(requests=st.lists(id_lists, max_size=4))
def test_allocate_answers_every_request_and_keeps_serving(
    node: DevicePluginNode, requests: list[list[str]]
) -> None:
    request = dp.AllocateRequest(
        container_requests=[dp.ContainerAllocateRequest(devices_ids=ids) for ids in requests]
    )
    code, response = node.call("Allocate", request)
    event(code.name)
    assert code not in NO_ANSWER
    if code == grpc.StatusCode.OK:
        assert len(response.container_responses) == len(requests)
    node.still_serving()


@settings(FUZZ, derandomize=True, max_examples=150, deadline=None)
@given(
    requests=st.lists(
        st.tuples(id_lists, id_lists, st.integers(-(2**31), 2**31 - 1) | st.integers(0, 6)),
        max_size=3,
    )
)
def test_preferred_allocation_answers_every_request_and_keeps_serving(
    node: DevicePluginNode, requests: list[tuple[list[str], list[str], int]]
) -> None:
    request = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
            for available, must, size in requests
        ]
    )
    code, response = node.call("GetPreferredAllocation", request)
    event(code.name)
    assert code not in NO_ANSWER
    if code == grpc.StatusCode.OK:
        assert len(response.container_responses) == len(requests)
    node.still_serving()


@settings(FUZZ, derandomize=True, max_examples=60, deadline=None)
@given(ids=id_lists)
def test_pre_start_answers_and_keeps_serving(node: DevicePluginNode, ids: list[str]) -> None:
    code, _ = node.call("PreStartContainer", dp.PreStartContainerRequest(devices_ids=ids))
    event(code.name)
    assert code not in NO_ANSWER
    node.still_serving()


@settings(FUZZ, derandomize=True, max_examples=150, deadline=None)
@given(body=st.binary(max_size=400), method=st.sampled_from(METHODS))
def test_malformed_messages_get_a_status_and_the_server_keeps_serving(
    node: DevicePluginNode, body: bytes, method: str
) -> None:
    code = node.call_raw(method, body)
    event(code.name)
    assert code not in NO_ANSWER
    node.still_serving()


@pytest.mark.parametrize("method", ["Allocate", "GetPreferredAllocation"])
def test_an_oversized_request_is_refused_and_the_server_keeps_serving(
    node: DevicePluginNode, method: str
) -> None:
    huge = ["d" * (MAX_MESSAGE + 1)]
    request: Any = (
        dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=huge)])
        if method == "Allocate"
        else dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(available_deviceIDs=huge, allocation_size=1)
            ]
        )
    )
    code, _ = node.call(method, request)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    node.still_serving()
