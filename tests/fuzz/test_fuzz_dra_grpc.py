"""The kubelet-facing DRA servers (v1 and v1beta1) on malformed and oversized requests.

The real plugin helper and node driver serve a unix socket in tmp (claims from
:class:`~tests.fakes.apiserver.FakeAPIServer`, ledger and CDI specs in tmp, no hooks);
a blocking client sends what a kubelet, or anything else that reaches the socket,
could. Every request gets a status, and after each one the server still prepares a
real claim.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import grpc
import pytest
from dradriver.kubeletapi.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)
from hypothesis import event, given, settings
from hypothesis import strategies as st

from dradriver.devices.model import Device
from dradriver.host.cdi import CDIRegistry
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.host.ledger import Ledger
from dradriver.k8s.client import KubeClient
from dradriver.plugin.helper import KubeletPluginHelper, PluginPaths
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.nodedriver import NodeDriver
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.claims import DRIVER, NODE, allocated_claim, result, store_claim
from tests.fuzz.serverthread import LoopThread

FUZZ = settings.get_profile("fuzz")
RPC_TIMEOUT = 30.0  # a hang guard, not a latency bound
# The default limit of a gRPC server's incoming message.
MAX_MESSAGE = 4 * 1024 * 1024
VERSIONS: dict[str, tuple[ModuleType, ModuleType, str]] = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc, "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"),
    "v1beta1": (
        dra_v1beta1_pb2,
        dra_v1beta1_pb2_grpc,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
    ),
}
METHODS = ("NodePrepareResources", "NodeUnprepareResources")
# "No status" would be a hang or a dead server.
NO_ANSWER = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str


class NodePlugin:
    """The plugin on its own loop; claims claim-0..2 are allocated dev-0..2 on this node."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dra-fuzz-", dir="/tmp"))
        self.loop = LoopThread()
        self.claims: list[Claim] = []
        self.helper = self.loop.run(self._start())
        self.channel = grpc.insecure_channel(f"unix://{self.helper.paths.dra_socket}")

    async def _start(self) -> KubeletPluginHelper:
        api = FakeAPIServer()
        for i in range(3):
            stored = store_claim(api, allocated_claim(f"claim-{i}", [result(f"dev-{i}")]))
            meta = stored["metadata"]
            self.claims.append(Claim(meta["namespace"], meta["name"], meta["uid"]))
        devices = [
            Device(
                name=f"dev-{i}",
                edits=ContainerEdits(
                    device_nodes=(DeviceNode(path=f"/dev/mock{i}", host_path="/dev/null"),)
                ),
            )
            for i in range(3)
        ]
        driver = NodeDriver(
            client=cast(KubeClient, api),
            driver_name=DRIVER,
            inventory=NodeInventory(NODE, lambda: list(devices)),
            ledger=Ledger.load(self.root / "state" / "ledger.json"),
            cdi=CDIRegistry(self.root / "cdi", DRIVER, durable=False),
        )
        helper = KubeletPluginHelper(driver, PluginPaths(self.root / "kubelet", DRIVER))
        await helper.start()
        return helper

    def stop(self) -> None:
        self.channel.close()
        self.loop.run(self.helper.stop())
        self.loop.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def call(self, version: str, method: str, claims: list[Claim]) -> tuple[grpc.StatusCode, Any]:
        pb2, pb2_grpc, _ = VERSIONS[version]
        stub = pb2_grpc.DRAPluginStub(self.channel)
        request_type = getattr(pb2, f"{method}Request")
        request = request_type(
            claims=[pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]
        )
        try:
            return grpc.StatusCode.OK, getattr(stub, method)(request, timeout=RPC_TIMEOUT)
        except grpc.RpcError as e:
            return cast(grpc.Call, e).code(), None

    def call_raw(self, version: str, method: str, body: bytes) -> grpc.StatusCode:
        rpc = self.channel.unary_unary(
            f"/{VERSIONS[version][2]}/{method}", None, None
        )  # bytes in and out
        try:
            rpc(body, timeout=RPC_TIMEOUT)
        except grpc.RpcError as e:
            return cast(grpc.Call, e).code()
        return grpc.StatusCode.OK

    def still_serving(self) -> None:
        """A real claim prepares, over both versions (idempotent: prepared once)."""
        claim = self.claims[0]
        for version in VERSIONS:
            code, response = self.call(version, "NodePrepareResources", [claim])
            assert code == grpc.StatusCode.OK
            entry = response.claims[claim.uid]
            assert entry.error == "" and [d.device_name for d in entry.devices] == ["dev-0"]


@pytest.fixture(scope="module")
def plugin() -> Iterator[NodePlugin]:
    node = NodePlugin()
    yield node
    node.stop()


uids = st.one_of(
    st.uuids().map(str),
    st.sampled_from(["", "-", "..", "../../etc/passwd", "a/b", "a" * 129, "x" * 5000]),
    st.text(max_size=40),
)
texts = st.sampled_from(["", "default", "claim-0", "a" * 300]) | st.text(max_size=40)


def claim_list(plugin: NodePlugin) -> st.SearchStrategy[list[Claim]]:
    stored = st.sampled_from(plugin.claims)
    mixed_up = st.builds(
        lambda c, ns, name: Claim(ns, name, c.uid), stored, texts, texts
    )  # a real uid under another name
    made_up = st.builds(Claim, texts, texts, uids)
    return st.lists(st.one_of(stored, mixed_up, made_up), max_size=8)


@settings(FUZZ, derandomize=True, max_examples=150, deadline=None)
@given(data=st.data(), version=st.sampled_from(list(VERSIONS)), method=st.sampled_from(METHODS))
def test_every_request_gets_a_status_and_the_server_keeps_serving(
    plugin: NodePlugin, data: st.DataObject, version: str, method: str
) -> None:
    claims = data.draw(claim_list(plugin))
    code, _ = plugin.call(version, method, claims)
    event(code.name)
    assert code not in NO_ANSWER
    plugin.still_serving()


@settings(FUZZ, derandomize=True, max_examples=100, deadline=None, report_multiple_bugs=False)
@given(data=st.data(), version=st.sampled_from(list(VERSIONS)), method=st.sampled_from(METHODS))
def test_every_claim_gets_its_own_answer(
    plugin: NodePlugin, data: st.DataObject, version: str, method: str
) -> None:
    claims = data.draw(claim_list(plugin))
    code, response = plugin.call(version, method, claims)
    assert code == grpc.StatusCode.OK
    assert set(response.claims) == {c.uid for c in claims}
    if method == "NodePrepareResources":
        for uid, entry in response.claims.items():
            assert bool(entry.error) != bool(entry.devices), uid


@settings(FUZZ, derandomize=True, max_examples=150, deadline=None)
@given(
    body=st.binary(max_size=400),
    version=st.sampled_from(list(VERSIONS)),
    method=st.sampled_from(METHODS),
)
def test_malformed_messages_get_a_status_and_the_server_keeps_serving(
    plugin: NodePlugin, body: bytes, version: str, method: str
) -> None:
    code = plugin.call_raw(version, method, body)
    event(code.name)
    assert code not in NO_ANSWER
    plugin.still_serving()


@pytest.mark.parametrize("version", list(VERSIONS))
def test_an_oversized_request_is_refused_and_the_server_keeps_serving(
    plugin: NodePlugin, version: str
) -> None:
    huge = Claim("default", "n" * (MAX_MESSAGE + 1), plugin.claims[1].uid)
    for method in METHODS:
        code, _ = plugin.call(version, method, [huge])
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    plugin.still_serving()


@pytest.mark.parametrize("version", list(VERSIONS))
def test_a_request_for_thousands_of_unknown_claims_answers_each(
    plugin: NodePlugin, version: str
) -> None:
    unknown = [
        Claim("default", f"gone-{i}", f"00000000-0000-4000-8000-{i:012d}") for i in range(3000)
    ]
    for method in METHODS:
        code, response = plugin.call(version, method, unknown)
        assert code == grpc.StatusCode.OK
        assert set(response.claims) == {c.uid for c in unknown}
        if method == "NodePrepareResources":
            assert all(entry.error for entry in response.claims.values())
    plugin.still_serving()
