"""The plugin helper over real unix sockets, driven by a client that acts like the kubelet."""

from __future__ import annotations

import asyncio
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
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

from dradriver.plugin.helper import KubeletPluginHelper, PluginPaths
from dradriver.plugin.interface import ClaimRef, DeviceHealth, PreparedDevice, PrepareResult
from dradriver.plugin.services import HEALTH_TIMEOUT_SECONDS

DRIVER = "test.dradriver.dev"


class RecordingDriver:
    """A DRADriver that prepares a fixed device per claim and records calls."""

    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.unprepared: list[str] = []
        self.errors: list[str] = []

    async def prepare_claims(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        out = {}
        for c in claims:
            self.prepared.append(c.uid)
            if c.name == "bad":
                out[c.uid] = PrepareResult(error="opaque config: field 'mode' is invalid")
            else:
                out[c.uid] = PrepareResult(
                    devices=[
                        PreparedDevice(
                            ("req",), "node-1", "dev-0", (f"{DRIVER}/device=claim-{c.uid}",), "ab12"
                        )
                    ]
                )
        return out

    async def unprepare_claims(self, claims: list[ClaimRef]) -> dict[str, str]:
        self.unprepared += [c.uid for c in claims]
        return {c.uid: "" for c in claims}

    def handle_error(self, error: BaseException, context: str) -> None:
        self.errors.append(f"{context}: {error}")


async def eventually(probe: Callable[[], bool], deadline: float = 10) -> None:
    """Poll a file-system condition (there is no event to wait on) until a deadline."""
    async with asyncio.timeout(deadline):
        while not probe():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def run(
    test: Callable[[KubeletPluginHelper, RecordingDriver], Awaitable[None]],
    root: Path,
    health_resend: float = 10.0,
) -> None:
    async def main() -> None:
        driver = RecordingDriver()
        helper = KubeletPluginHelper(
            driver, PluginPaths(root, DRIVER), watchdog_interval=0.05, health_resend=health_resend
        )
        await helper.start()
        try:
            await test(helper, driver)
        finally:
            await helper.stop()

    asyncio.run(main())


async def register(helper: KubeletPluginHelper) -> Any:
    async with grpc.aio.insecure_channel(f"unix://{helper.paths.registration_socket}") as ch:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(ch)
        info = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=1)
        await stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=5
        )
        return info


def test_registration_info_and_status(sock_dir: Path) -> None:
    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        assert not helper.registered
        info = await register(helper)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(sock_dir / "plugins" / DRIVER / "dra.sock")
        assert list(info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        assert helper.registered

    run(body, sock_dir)


def test_failed_registration_is_recorded(sock_dir: Path) -> None:
    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        await register(helper)
        async with grpc.aio.insecure_channel(f"unix://{helper.paths.registration_socket}") as ch:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(ch)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.NotifyRegistrationStatus(
                    pluginregistration_v1_pb2.RegistrationStatus(
                        plugin_registered=False, error="version mismatch"
                    )
                )
        assert not helper.registered
        assert helper.registration.last_error == "version mismatch"

    run(body, sock_dir)


def test_sockets_are_not_world_accessible(sock_dir: Path) -> None:
    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        for sock in (helper.paths.dra_socket, helper.paths.registration_socket):
            mode = sock.stat().st_mode
            assert stat.S_ISSOCK(mode)
            assert mode & 0o077 == 0, f"{sock} is {oct(mode)}"
        assert helper.paths.plugin_dir.stat().st_mode & 0o002 == 0

    run(body, sock_dir)


def test_prepare_and_unprepare_v1_and_v1beta1(sock_dir: Path) -> None:
    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        async with grpc.aio.insecure_channel(f"unix://{helper.paths.dra_socket}") as ch:
            v1 = dra_v1_pb2_grpc.DRAPluginStub(ch)
            resp = await v1.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[
                        dra_v1_pb2.Claim(namespace="ns", uid="u1", name="good"),
                        dra_v1_pb2.Claim(namespace="ns", uid="u2", name="bad"),
                    ]
                )
            )
            dev = resp.claims["u1"].devices[0]
            assert (dev.pool_name, dev.device_name, dev.share_id) == ("node-1", "dev-0", "ab12")
            assert list(dev.cdi_device_ids) == [f"{DRIVER}/device=claim-u1"]
            assert "field 'mode'" in resp.claims["u2"].error
            beta = dra_v1beta1_pb2_grpc.DRAPluginStub(ch)
            resp_b = await beta.NodePrepareResources(
                dra_v1beta1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1beta1_pb2.Claim(namespace="ns", uid="u3", name="good")]
                )
            )
            assert resp_b.claims["u3"].devices[0].device_name == "dev-0"
            un = await v1.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace="ns", uid="u1", name="good")]
                )
            )
            assert un.claims["u1"].error == ""
        assert driver.prepared == ["u1", "u2", "u3"]
        assert driver.unprepared == ["u1"]

    run(body, sock_dir)


def test_health_stream_sends_complete_list_on_change(sock_dir: Path) -> None:
    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        await helper.publish_health(
            [DeviceHealth("node-1", "dev-0", True), DeviceHealth("node-1", "dev-1", True)]
        )
        async with grpc.aio.insecure_channel(f"unix://{helper.paths.dra_socket}") as ch:
            stub = drahealth_v1alpha1_pb2_grpc.DRAResourceHealthStub(ch)
            stream = stub.NodeWatchResources(drahealth_v1alpha1_pb2.NodeWatchResourcesRequest())
            first = await stream.read()
            assert [d.health for d in first.devices] == [drahealth_v1alpha1_pb2.HEALTHY] * 2
            assert first.devices[0].health_check_timeout_seconds > 0
            await helper.publish_health(
                [
                    DeviceHealth("node-1", "dev-0", True),
                    DeviceHealth("node-1", "dev-1", False, "file gone"),
                ]
            )
            second = await stream.read()
            by_name = {d.device.device_name: d for d in second.devices}
            assert by_name["dev-1"].health == drahealth_v1alpha1_pb2.UNHEALTHY
            assert by_name["dev-1"].message == "file gone"
            assert len(second.devices) == 2
            stream.cancel()

    run(body, sock_dir)


def test_an_invalid_claim_reference_fails_only_its_own_entry(sock_dir: Path) -> None:
    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        bad = {"u2\n": "is not a valid UID", "u3/..": "is not a valid UID", "u4": "name 'Bad_Name'"}
        async with grpc.aio.insecure_channel(f"unix://{helper.paths.dra_socket}") as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
            claims = [
                dra_v1_pb2.Claim(namespace="ns", uid="u1", name="good"),
                dra_v1_pb2.Claim(namespace="ns", uid="u2\n", name="good"),  # trailing newline
                dra_v1_pb2.Claim(namespace="ns", uid="u3/..", name="good"),
                dra_v1_pb2.Claim(namespace="ns", uid="u4", name="Bad_Name"),
            ]
            resp = await stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=claims)
            )
            assert resp.claims["u1"].error == "" and resp.claims["u1"].devices
            for uid, message in bad.items():
                assert message in resp.claims[uid].error and not resp.claims[uid].devices
            un = await stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims)
            )
            assert un.claims["u1"].error == ""
            assert all(message in un.claims[uid].error for uid, message in bad.items())
        assert driver.prepared == ["u1"] and driver.unprepared == ["u1"]

    run(body, sock_dir)


def test_a_uid_named_twice_is_worked_on_once_or_refused_if_the_names_differ(
    sock_dir: Path,
) -> None:
    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        async with grpc.aio.insecure_channel(f"unix://{helper.paths.dra_socket}") as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
            resp = await stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[
                        dra_v1_pb2.Claim(namespace="ns", uid="u1", name="good"),
                        dra_v1_pb2.Claim(namespace="ns", uid="u1", name="good"),
                        dra_v1_pb2.Claim(namespace="ns", uid="u2", name="good"),
                        dra_v1_pb2.Claim(namespace="ns", uid="u2", name="bad"),
                    ]
                )
            )
        assert resp.claims["u1"].error == "" and len(resp.claims["u1"].devices) == 1
        assert resp.claims["u2"].error == (
            "claim uid u2 is named twice in one request, as ns/good and ns/bad"
        )
        assert driver.prepared == ["u1"]

    run(body, sock_dir)


def test_health_v1_stream_is_sent_again_without_changes(sock_dir: Path) -> None:
    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        await helper.publish_health(
            [DeviceHealth("node-1", "dev-0", True), DeviceHealth("node-1", "dev-1", None)]
        )
        async with grpc.aio.insecure_channel(f"unix://{helper.paths.dra_socket}") as ch:
            stub = drahealth_v1_pb2_grpc.DRAResourceHealthStub(ch)
            stream = stub.NodeWatchResources(drahealth_v1_pb2.NodeWatchResourcesRequest())
            first = await stream.read()
            # Nothing changes: the list comes again anyway, before the kubelet's timeout
            # would turn the devices Unknown.
            async with asyncio.timeout(10):
                again = await stream.read()
            for response in (first, again):
                assert [(d.device.device_name, d.health) for d in response.devices] == [
                    ("dev-0", drahealth_v1_pb2.HEALTHY),
                    ("dev-1", drahealth_v1_pb2.UNKNOWN),
                ]
                assert all(
                    d.health_check_timeout_seconds == HEALTH_TIMEOUT_SECONDS
                    for d in response.devices
                )
            assert again.devices[0].last_updated_time >= first.devices[0].last_updated_time
            stream.cancel()

    run(body, sock_dir, health_resend=0.05)


def test_registration_socket_is_recreated_after_deletion(sock_dir: Path) -> None:
    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        await register(helper)
        sock = helper.paths.registration_socket
        sock.unlink()
        await eventually(sock.exists)
        assert not helper.registered
        await register(helper)
        assert helper.registration.registrations == 2

    run(body, sock_dir)


def test_rolling_update_instances_use_distinct_sockets(sock_dir: Path) -> None:
    a = PluginPaths(sock_dir, DRIVER, instance="pod-a")
    b = PluginPaths(sock_dir, DRIVER, instance="pod-b")
    assert a.dra_socket != b.dra_socket
    assert a.registration_socket != b.registration_socket
    assert a.plugin_dir == b.plugin_dir


def test_stop_removes_sockets(sock_dir: Path) -> None:
    paths = PluginPaths(sock_dir, DRIVER)

    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        assert paths.dra_socket.exists()

    run(body, sock_dir)
    assert not paths.dra_socket.exists()
    assert not paths.registration_socket.exists()


def test_a_live_socket_of_another_instance_is_not_stolen(sock_dir: Path) -> None:
    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        intruder = KubeletPluginHelper(RecordingDriver(), PluginPaths(sock_dir, DRIVER))
        with pytest.raises(RuntimeError, match=r"another process serves .*--instance"):
            await intruder.start()
        info = await register(helper)  # the first instance still answers
        assert info.name == DRIVER

    run(body, sock_dir)


def test_a_dead_socket_is_replaced(sock_dir: Path) -> None:
    paths = PluginPaths(sock_dir, DRIVER)
    paths.plugin_dir.mkdir(parents=True)

    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(paths.dra_socket))
    leftover.close()  # bound but nobody listens: what a crashed plugin leaves

    async def body(helper: KubeletPluginHelper, driver: RecordingDriver) -> None:
        assert helper.paths.dra_socket.is_socket()

    run(body, sock_dir)


def test_every_kubelet_call_is_reported_with_the_service_version_it_used(sock_dir: Path) -> None:
    """The version matrix reads which DRA and health versions a kubelet really calls from this."""
    calls: list[tuple[str, str]] = []

    async def main() -> None:
        helper = KubeletPluginHelper(RecordingDriver(), PluginPaths(sock_dir, DRIVER))
        helper.on_kubelet_call = lambda service, method: calls.append((service, method))
        await helper.start()
        try:
            target = f"unix://{helper.paths.dra_socket}"
            async with grpc.aio.insecure_channel(target) as ch:
                claim = dra_v1beta1_pb2.Claim(namespace="ns", uid="u-1", name="c")
                await dra_v1beta1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                    dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=5
                )
                v1 = dra_v1_pb2.Claim(namespace="ns", uid="u-1", name="c")
                await dra_v1_pb2_grpc.DRAPluginStub(ch).NodeUnprepareResources(
                    dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[v1]), timeout=5
                )
                stream = drahealth_v1_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
                    drahealth_v1_pb2.NodeWatchResourcesRequest()
                )
                await stream.read()
                stream.cancel()
        finally:
            await helper.stop()

    asyncio.run(main())
    assert calls == [
        ("v1beta1.DRAPlugin", "NodePrepareResources"),
        ("v1.DRAPlugin", "NodeUnprepareResources"),
        ("v1.DRAResourceHealth", "NodeWatchResources"),
    ]
