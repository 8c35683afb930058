"""The device-plugin shim over real unix sockets, driven like the kubelet's device manager.

A fake kubelet serves ``v1beta1.Registration`` on ``kubelet.sock`` and, like the real one,
dials the plugin back inside Register (GetDevicePluginOptions), then keeps a ListAndWatch
stream open. A fake pod-resources server answers ``v1.PodResourcesLister/List``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from dradriver.devices.config import parse_config
from dradriver.devices.sources import build_sources, discover_all
from dradriver.devices.static import create_mock_device
from dradriver.host.cdi import CDIDevice, CDIRegistry
from dradriver.host.containeredits import ContainerEdits
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import ClaimDevice, DeviceBusy, DeviceRef
from dradriver.k8s.objects import Obj
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2 as dp
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from dradriver.kubeletapi.gen import podresources_v1_pb2 as pr
from dradriver.kubeletapi.gen import podresources_v1_pb2_grpc as pr_grpc
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.legacy.podresources import Assignment, HoldReconciler, PodResourcesClient
from kubeletplugin.legacy.shim import CDI_CLASS, DevicePluginShim, held_taint_key
from kubeletplugin.metrics import PluginMetrics

DRIVER = "test.dradriver.dev"
RESOURCE = f"{DRIVER}/mock"
NODE = "node-1"
WAIT = 10.0


# ----- the fake kubelet --------------------------------------------------------------


@dataclass
class Registration:
    request: Any
    options: Any
    updates: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)


class FakeKubelet(dp_grpc.RegistrationServicer):  # type: ignore[misc]
    """``v1beta1.Registration`` the way the kubelet answers it."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: asyncio.Queue[Registration] = asyncio.Queue()
        self.count = 0
        self._server: grpc.aio.Server | None = None
        self._channels: list[grpc.aio.Channel] = []
        self._watchers: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        await self._server.start()

    async def Register(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        assert request.version == "v1beta1"
        # Synchronously, like the kubelet: the plugin must already be serving.
        channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}")
        self._channels.append(channel)
        stub = dp_grpc.DevicePluginStub(channel)
        options = await stub.GetDevicePluginOptions(dp.Empty(), timeout=10)
        registration = Registration(request, options)
        self._watchers.append(asyncio.create_task(self._watch(stub, registration)))
        self.count += 1
        await self.registrations.put(registration)
        return dp.Empty()

    async def _watch(self, stub: Any, registration: Registration) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for response in stub.ListAndWatch(dp.Empty()):
                await registration.updates.put(response)

    async def next_registration(self) -> Registration:
        return await asyncio.wait_for(self.registrations.get(), WAIT)

    async def stop(self, wipe: bool = True) -> None:
        """Stop; with ``wipe``, delete every socket in the directory as a starting kubelet does."""
        for task in self._watchers:
            task.cancel()
        for channel in self._channels:
            await channel.close(grace=None)
        if self._server is not None:
            await self._server.stop(grace=None)
        if wipe:
            for path in self.plugin_dir.iterdir():
                if path.is_socket():
                    path.unlink()


async def next_update(registration: Registration) -> dict[str, tuple[str, list[int]]]:
    response = await asyncio.wait_for(registration.updates.get(), WAIT)
    return {d.ID: (d.health, [n.ID for n in d.topology.nodes]) for d in response.devices}


# ----- a fake pod-resources server -------------------------------------------------


class FakePodResources(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        # (namespace, pod, container, resource, device ids)
        self.containers: list[tuple[str, str, str, str, list[str]]] = []
        # (namespace, pod, container, claim namespace, claim name,
        #  [(driver, pool, device, CDI id)]): DRA claims, as dynamic_resources
        self.claims: list[tuple[str, str, str, str, str, list[tuple[str, str, str, str]]]] = []
        self.fail = False

    async def List(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if self.fail:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
        pods: dict[tuple[str, str], Any] = {}
        for ns, pod, container, resource, ids in self.containers:
            p = pods.setdefault((ns, pod), pr.PodResources(name=pod, namespace=ns))
            p.containers.append(
                pr.ContainerResources(
                    name=container,
                    devices=[pr.ContainerDevices(resource_name=resource, device_ids=ids)],
                )
            )
        for ns, pod, container, claim_ns, claim, devices in self.claims:
            p = pods.setdefault((ns, pod), pr.PodResources(name=pod, namespace=ns))
            resources = [
                pr.ClaimResource(
                    cdi_devices=[pr.CDIDevice(name=cdi)],
                    driver_name=driver,
                    pool_name=pool,
                    device_name=device,
                )
                for driver, pool, device, cdi in devices
            ]
            dynamic = pr.DynamicResource(
                claim_name=claim, claim_namespace=claim_ns, claim_resources=resources
            )
            p.containers.append(pr.ContainerResources(name=container, dynamic_resources=[dynamic]))
        return pr.ListPodResourcesResponse(pod_resources=list(pods.values()))


# ----- the plugin under test ---------------------------------------------------------


def config_text(root: Path, mode: str, pre_start: Obj | None = None) -> str:
    # Two NUMA nodes with one PCIe root each; "solo" is DRA-only.
    devices = [
        {
            "name": f"dev-{i}",
            "attributes": {
                "kind": "mock",
                "numaNode": i // 2,
                "resource.kubernetes.io/pcieRoot": f"pci000{i // 2}:00",
            },
        }
        for i in range(4)
    ]
    devices.append({"name": "solo", "attributes": {"kind": "other"}})
    doc: Obj = {
        "driverName": DRIVER,
        "sources": [{"static": {"mockDir": str(root / "mock"), "devices": devices}}],
        "devicePlugin": {
            "enabled": True,
            "mode": mode,
            "resources": [{"resourceName": RESOURCE, "devices": {"attributes": {"kind": "mock"}}}],
        },
    }
    if pre_start is not None:
        doc["devicePlugin"]["preStart"] = pre_start
    return yaml.safe_dump(doc)


@dataclass
class Env:
    root: Path
    shim: DevicePluginShim
    inventory: NodeInventory
    ledger: Ledger
    kubelet: FakeKubelet
    metrics: PluginMetrics

    @property
    def plugin_dir(self) -> Path:
        return self.root / "device-plugins"

    @property
    def cdi(self) -> CDIRegistry:
        return CDIRegistry(self.root / "cdi", DRIVER, CDI_CLASS)

    def stub_channel(self) -> grpc.aio.Channel:
        endpoint = self.shim.manager.endpoint(RESOURCE).socket
        return grpc.aio.insecure_channel(f"unix://{endpoint}")

    def set_health(self, device: str, healthy: bool) -> None:
        mock = self.root / "mock" / device
        if healthy:
            create_mock_device(str(mock))
        else:
            mock.unlink()
        self.inventory.refresh()
        self.shim.refresh()


def make_shim(root: Path, mode: str, pre_start: Obj | None = None) -> DevicePluginShim:
    config = parse_config(config_text(root, mode, pre_start))
    sources = build_sources(config)
    inventory = NodeInventory(NODE, lambda: discover_all(sources))
    ledger = Ledger.load(root / "state" / "ledger.json")
    return DevicePluginShim(
        config=config.device_plugin,
        driver_name=DRIVER,
        inventory=inventory,
        ledger=ledger,
        cdi_dir=root / "cdi",
        plugin_dir=root / "device-plugins",
        metrics=PluginMetrics(),
        watch_interval=0.05,
    )


def run(
    root: Path,
    test: Callable[[Env], Awaitable[None]],
    mode: str = "shared",
    pre_start: Obj | None = None,
    start_kubelet: bool = True,
) -> None:
    async def main() -> None:
        shim = make_shim(root, mode, pre_start)
        kubelet = FakeKubelet(root / "device-plugins")
        if start_kubelet:
            await kubelet.start()
        await shim.start()
        env = Env(root, shim, shim.inventory, shim.ledger, kubelet, shim.metrics)
        try:
            await test(env)
        finally:
            await shim.stop()
            await env.kubelet.stop(wipe=False)

    asyncio.run(main())


async def allocate(env: Env, *ids: str) -> Any:
    async with env.stub_channel() as ch:
        response = await dp_grpc.DevicePluginStub(ch).Allocate(
            dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
        )
    return response.container_responses[0]


async def preferred(env: Env, available: list[str], must: list[str], size: int) -> list[str]:
    async with env.stub_channel() as ch:
        response = await dp_grpc.DevicePluginStub(ch).GetPreferredAllocation(
            dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available,
                        must_include_deviceIDs=must,
                        allocation_size=size,
                    )
                ]
            )
        )
    return list(response.container_responses[0].deviceIDs)


def claim_on(env: Env, device: str, uid: str = "claim-uid-1") -> None:
    env.ledger.begin_prepare(uid, "ns", "gpu-claim", [ClaimDevice(pool=NODE, device=device)])
    env.ledger.complete_prepare(uid)
    env.shim.claims_changed()


# ----- tests ---------------------------------------------------------------------------


def test_serves_before_registering_and_lists_devices_with_topology(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        reg = await env.kubelet.next_registration()
        assert reg.request.resource_name == RESOURCE
        assert reg.request.endpoint == f"{DRIVER}_mock.sock"
        # The fake kubelet called GetDevicePluginOptions inside Register: it was serving.
        assert reg.options.get_preferred_allocation_available
        assert not reg.options.pre_start_required
        assert reg.request.options == reg.options
        first = await next_update(reg)
        assert first == {
            "dev-0": ("Healthy", [0]),
            "dev-1": ("Healthy", [0]),
            "dev-2": ("Healthy", [1]),
            "dev-3": ("Healthy", [1]),
        }
        assert env.plugin_dir.joinpath(reg.request.endpoint).stat().st_mode & 0o077 == 0

    run(sock_dir, body)


def test_list_and_watch_sends_a_new_list_on_every_health_change(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        reg = await env.kubelet.next_registration()
        await next_update(reg)
        env.set_health("dev-2", False)
        assert (await next_update(reg))["dev-2"][0] == "Unhealthy"
        env.set_health("dev-2", True)
        assert (await next_update(reg))["dev-2"][0] == "Healthy"
        env.set_health("solo", False)  # not a device-plugin device: no message
        env.shim.refresh()
        assert reg.updates.empty()
        assert 'health="Unhealthy",resource="test.dradriver.dev/mock"} 0.0' in metrics(env)

    run(sock_dir, body)


def metrics(env: Env) -> str:
    return env.metrics.registry.exposition().decode()


def test_preferred_allocation_is_topology_aware(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        all4 = ["dev-3", "dev-0", "dev-2", "dev-1"]
        # Two devices fit on one NUMA node / PCIe root.
        assert await preferred(env, all4, [], 2) == ["dev-0", "dev-1"]
        # A must-include device pulls its neighbour in.
        assert await preferred(env, all4, ["dev-2"], 2) == ["dev-2", "dev-3"]
        # The request fits only where one device is left: prefer the tighter group.
        assert await preferred(env, ["dev-1", "dev-2", "dev-3"], [], 1) == ["dev-1"]
        assert await preferred(env, ["dev-1", "dev-2", "dev-3"], [], 2) == ["dev-2", "dev-3"]
        # Size is honoured, must-include first.
        picked = await preferred(env, all4, ["dev-3"], 3)
        assert picked[0] == "dev-3" and len(picked) == 3 and picked[1] == "dev-2"
        assert await preferred(env, all4, ["dev-0", "dev-3"], 2) == ["dev-0", "dev-3"]
        # A device held through DRA is avoided while others are available.
        claim_on(env, "dev-0")
        assert await preferred(env, all4, [], 1) == ["dev-1"]

    run(sock_dir, body)


def test_preferred_allocation_is_bounded_by_the_devices_and_runs_off_the_loop(
    sock_dir: Path,
) -> None:
    async def body(env: Env) -> None:
        loop_thread = threading.get_ident()
        threads: list[int] = []
        choose = env.shim.preferred

        def recording(
            resource: str, available: Sequence[str], must: Sequence[str], size: int
        ) -> list[str]:
            threads.append(threading.get_ident())
            assert len(available) == 2 and must == []  # what was never listed is dropped
            return choose(resource, available, must, size)

        env.shim.preferred = recording  # type: ignore[method-assign,assignment]
        ghosts = [f"ghost-{i}" for i in range(6000)]
        assert await preferred(env, [*ghosts, "dev-3", "dev-0"], ghosts[:10], 1) == ["dev-0"]
        assert threads and loop_thread not in threads
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await preferred(env, ["dev-0"], [], 5)  # more than the resource has
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "allocation size 5 is not between 0 and the 4 devices" in str(err.value.details())

    run(sock_dir, body)


def test_allocate_returns_cdi_ids_and_edits_and_records_a_hold(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        await env.kubelet.next_registration()
        response = await allocate(env, "dev-1", "dev-0")
        ids = [c.name for c in response.cdi_devices]
        assert len(ids) == 2 and all(i.startswith(f"{DRIVER}/{CDI_CLASS}=alloc-") for i in ids)
        # The same edits DRA's CDI path gives, resolvable from the spec the plugin wrote.
        edits = env.cdi.resolve_many(ids)
        assert {n.host_path for n in edits.device_nodes} == {
            str(env.root / "mock" / "dev-0"),
            str(env.root / "mock" / "dev-1"),
        }
        assert response.envs["DRADRIVER_DEVICE_DEV_1"] == "/dev/dradriver/dev-1"
        assert response.envs["DRADRIVER_RESOURCE"] == RESOURCE
        assert {d.host_path for d in response.devices} == {
            str(env.root / "mock" / "dev-0"),
            str(env.root / "mock" / "dev-1"),
        }
        assert dict(response.envs) == edits.env
        [hold] = env.ledger.plugin_holds()
        assert hold.state == "allocated" and hold.resource == RESOURCE
        assert {r.device for r in hold.devices} == {"dev-0", "dev-1"}
        assert response.annotations[f"{DRIVER}/allocation"] == hold.pod_uid
        # Claim specs of the DRA path live in another kind: no name can collide.
        assert CDIRegistry(env.root / "cdi", DRIVER).claim_uids_on_disk() == set()
        # Shared mode: DRA's slices taint the held devices.
        published = {d.name: d for d in env.shim.dra_devices(list(env.inventory.devices.values()))}
        assert [t.key for t in published["dev-0"].taints] == [held_taint_key(DRIVER)]
        assert published["dev-2"].taints == ()
        assert "dradriver_deviceplugin_allocations_total" in metrics(env)

    run(sock_dir, body)


def test_allocate_refuses_a_device_held_through_dra(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        reg = await env.kubelet.next_registration()
        await next_update(reg)
        claim_on(env, "dev-2")
        assert (await next_update(reg))["dev-2"][0] == "Unhealthy"  # hidden from the kubelet
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await allocate(env, "dev-2")
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "claim ns/gpu-claim" in (err.value.details() or "")
        assert "recreate it" in (err.value.details() or "")
        assert env.ledger.plugin_holds() == []
        assert env.cdi.claim_uids_on_disk() == set()

    run(sock_dir, body)


def test_dra_prepare_of_a_plugin_held_device_names_the_pod(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        await env.kubelet.next_registration()
        await allocate(env, "dev-3")
        [hold] = env.ledger.plugin_holds()
        env.shim.observed(
            {hold.pod_uid: assignment("ns", "legacy", "main", ["dev-3"])}  # as pod-resources
        )
        with pytest.raises(DeviceBusy) as err:
            env.ledger.begin_prepare("c1", "ns", "claim", [ClaimDevice(pool=NODE, device="dev-3")])
        text = env.shim.explain_busy(err.value)
        assert "through the device plugin" in text and "pod ns/legacy container main" in text
        assert "the kubelet retries" in text

    run(sock_dir, body)


def assignment(ns: str, pod: str, container: str, ids: list[str]) -> Assignment:
    return Assignment(ns, pod, container, RESOURCE, frozenset(ids))


def test_a_reused_device_supersedes_a_stale_hold(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        await env.kubelet.next_registration()
        first = await allocate(env, "dev-0")
        second = await allocate(env, "dev-0")  # the first container ended before the poll
        [hold] = env.ledger.plugin_holds()
        assert second.annotations[f"{DRIVER}/allocation"] == hold.pod_uid
        old = first.annotations[f"{DRIVER}/allocation"]
        assert old not in env.cdi.claim_uids_on_disk()

    run(sock_dir, body)


def test_a_hold_of_another_resource_is_never_taken_over(sock_dir: Path) -> None:
    """dev-0 is held for another resource (devicePlugin.resources changed while its
    container runs): an Allocate of dev-0 for this resource is refused and the other
    hold stays, although a hold of the same resource would be superseded."""

    async def body(env: Env) -> None:
        await env.kubelet.next_registration()
        other = "example.com/renamed"
        refs = [DeviceRef(pool=NODE, device="dev-0")]
        env.ledger.begin_plugin_hold(other, "alloc-other", "main", refs)
        env.ledger.complete_plugin_hold("alloc-other", "main")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await allocate(env, "dev-0")
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert other in (err.value.details() or "")
        assert [(h.resource, h.pod_uid) for h in env.ledger.plugin_holds()] == [
            (other, "alloc-other")
        ]
        # The same resource's stale hold is what may be superseded.
        first = await allocate(env, "dev-1")
        await allocate(env, "dev-1")
        assert first.annotations[f"{DRIVER}/allocation"] not in {
            h.pod_uid for h in env.ledger.plugin_holds()
        }

    run(sock_dir, body)


PRESTART = """\
echo "prestart $DRADRIVER_RESOURCE $DRADRIVER_DEVICE $DRADRIVER_ALLOCATION" >> {log}
if [ -e {fail} ]; then echo "FPGA bitstream rejected" >&2; exit 4; fi
"""


def test_prestart_runs_the_hook_and_fails_with_a_clear_message(sock_dir: Path) -> None:
    log, fail = sock_dir / "prestart.log", sock_dir / "fail"
    script = sock_dir / "prestart.sh"
    script.write_text(PRESTART.format(log=log, fail=fail))

    async def body(env: Env) -> None:
        reg = await env.kubelet.next_registration()
        assert reg.options.pre_start_required
        response = await allocate(env, "dev-1")
        alloc = response.annotations[f"{DRIVER}/allocation"]
        async with env.stub_channel() as ch:
            stub = dp_grpc.DevicePluginStub(ch)
            await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["dev-1"]))
            assert log.read_text().splitlines() == [f"prestart {RESOURCE} dev-1 {alloc}"]
            fail.touch()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["dev-1"]))
        details = err.value.details() or ""
        assert "preStart hook for test.dradriver.dev/mock device dev-1 failed" in details
        assert "exited 4" in details and "FPGA bitstream rejected" in details

    run(sock_dir, body, pre_start={"command": ["sh", str(script)], "timeoutSeconds": 5})


def test_reregisters_when_the_kubelet_restarts(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        reg = await env.kubelet.next_registration()
        socket = env.plugin_dir / reg.request.endpoint
        # A restarting kubelet wipes every socket in the directory, then listens again.
        await env.kubelet.stop(wipe=True)
        assert not socket.exists()
        env.kubelet = FakeKubelet(env.plugin_dir)
        await env.kubelet.start()
        again = await env.kubelet.next_registration()
        assert again.request.endpoint == reg.request.endpoint and socket.exists()
        assert len(await next_update(again)) == 4
        # Only kubelet.sock re-created (our socket kept): registering again as well.
        await env.kubelet.stop(wipe=False)
        (env.plugin_dir / "kubelet.sock").unlink(missing_ok=True)  # grpc removes it on stop
        env.kubelet = FakeKubelet(env.plugin_dir)
        await env.kubelet.start()
        await env.kubelet.next_registration()
        await registrations(env, 3)
        text = metrics(env)
        assert 'reason="kubelet-restart",resource="test.dradriver.dev/mock"} 2.0' in text
        assert 'reason="initial",resource="test.dradriver.dev/mock"} 1.0' in text

    run(sock_dir, body)


async def registrations(env: Env, count: int) -> None:
    """Until the plugin has seen ``count`` Register calls succeed (it learns after the kubelet)."""
    endpoint = env.shim.manager.endpoint(RESOURCE)
    async with asyncio.timeout(WAIT):
        while endpoint.registrations < count:  # noqa: ASYNC110 - a counter, no event to await
            await asyncio.sleep(0.01)


def test_registration_waits_for_an_absent_kubelet(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        endpoint = env.shim.manager.endpoint(RESOURCE)
        deadline = asyncio.get_running_loop().time() + WAIT
        while "does not exist" not in endpoint.last_error:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        assert not endpoint.registered.is_set()
        assert "is the kubelet running" in env.shim.not_registered()[0]
        await env.kubelet.start()  # the kubelet appears: registered without waiting out backoff
        await env.kubelet.next_registration()
        await asyncio.wait_for(endpoint.registered.wait(), WAIT)

    run(sock_dir, body, start_kubelet=False)


@contextlib.asynccontextmanager
async def pod_resources(
    root: Path,
) -> AsyncIterator[tuple[FakePodResources, PodResourcesClient]]:
    fake = FakePodResources()
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    path = root / "pod-resources.sock"
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield fake, PodResourcesClient(path)
    finally:
        await server.stop(grace=None)


def test_pod_resources_release_adoption_and_conflicts(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        await env.kubelet.next_registration()
        async with pod_resources(env.root) as (fake, client):
            reconciler = HoldReconciler(env.shim, client, interval=0.05, grace=60, settle=0)
            response = await allocate(env, "dev-0")
            alloc = response.annotations[f"{DRIVER}/allocation"]
            # Not yet listed, younger than the grace period: kept.
            await reconciler.reconcile_once()
            assert [h.pod_uid for h in env.ledger.plugin_holds()] == [alloc]
            fake.containers = [("ns", "legacy", "main", RESOURCE, ["dev-0"])]
            plan = await reconciler.reconcile_once()
            assert plan.live[alloc].describe() == "pod ns/legacy container main"
            # A failing List changes nothing.
            fake.fail = True
            with pytest.raises(grpc.aio.AioRpcError):
                await reconciler.reconcile_once()
            fake.fail = False
            # The pod ended: hold and CDI spec go, DRA may use the device again.
            fake.containers = []
            plan = await reconciler.reconcile_once()
            assert [r.kind for r in plan.release] == ["pod-ended"]
            assert env.ledger.plugin_holds() == []
            assert alloc not in env.cdi.claim_uids_on_disk()
            assert not any(
                d.taints for d in env.shim.dra_devices(list(env.inventory.devices.values()))
            )
            # A device in use that no hold covers (lost ledger) is adopted...
            fake.containers = [("ns", "old", "main", RESOURCE, ["dev-2"])]
            plan = await reconciler.reconcile_once()
            [adopted] = env.ledger.plugin_holds()
            assert [r.device for r in adopted.devices] == ["dev-2"]
            # ... and one a DRA claim holds is reported as a double allocation.
            claim_on(env, "dev-3")
            fake.containers.append(("ns", "clash", "main", RESOURCE, ["dev-3"]))
            await reconciler.reconcile_once()
            assert "dradriver_deviceplugin_conflicts_total 1.0" in metrics(env)

    run(sock_dir, body)


def test_assignments_the_kubelet_reports_are_held_before_the_plugin_serves(
    sock_dir: Path,
) -> None:
    """The ledger and the CDI specs are gone (a lost ledger after a reboot's wipe of
    /var/run/cdi): pod-resources is what remains of a running container's devices."""

    async def main() -> None:
        shim = make_shim(sock_dir, "shared")
        async with pod_resources(sock_dir) as (fake, client):
            fake.containers = [("ns", "legacy", "main", RESOURCE, ["dev-1"])]
            await HoldReconciler(shim, client, interval=1, grace=60).prime()
            assert [[r.device for r in h.devices] for h in shim.ledger.plugin_holds()] == [
                ["dev-1"]
            ]
            with pytest.raises(DeviceBusy, match="device-plugin resource"):
                shim.ledger.begin_prepare(
                    "uid-1", "ns", "c", [ClaimDevice(pool=NODE, device="dev-1")]
                )
        # No kubelet to ask: logged, nothing changes, nothing raises.
        await HoldReconciler(
            shim, PodResourcesClient(sock_dir / "absent.sock"), interval=1, grace=60
        ).prime()

    asyncio.run(main())


def test_holds_are_kept_while_the_kubelet_settles_and_released_after_grace(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        await env.kubelet.next_registration()
        async with pod_resources(env.root) as (_fake, client):
            settling = HoldReconciler(env.shim, client, interval=0.05, grace=0, settle=3600)
            await allocate(env, "dev-1")
            assert not settling.may_release()
            await settling.reconcile_once()
            assert len(env.ledger.plugin_holds()) == 1  # a fresh kubelet may not list pods yet
            settled = HoldReconciler(env.shim, client, interval=0.05, grace=0, settle=0)
            plan = await settled.reconcile_once()
            assert [r.kind for r in plan.release] == ["never-seen"]
            assert env.ledger.plugin_holds() == []

    run(sock_dir, body)


def test_partitioned_mode_keeps_the_sets_apart(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        reg = await env.kubelet.next_registration()
        assert sorted(await next_update(reg)) == ["dev-0", "dev-1", "dev-2", "dev-3"]
        published = env.shim.dra_devices(list(env.inventory.devices.values()))
        assert [d.name for d in published] == ["solo"]
        reason = env.shim.refuse_for_dra("dev-1")
        assert reason is not None and "partitioned" in reason and RESOURCE in reason
        assert env.shim.refuse_for_dra("solo") is None
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await allocate(env, "solo")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    run(sock_dir, body, mode="partitioned")


def test_start_reconciles_allocation_specs(sock_dir: Path) -> None:
    async def body(env: Env) -> None:
        env.shim.reconcile_cdi()  # the start of a fresh node: nothing to rebuild
        await env.kubelet.next_registration()
        response = await allocate(env, "dev-0")
        alloc = response.annotations[f"{DRIVER}/allocation"]
        spec = env.cdi.read_claim(alloc)
        env.cdi.remove_claim(alloc)  # what a reboot does to /var/run/cdi
        orphan = CDIDevice("dev-3", ContainerEdits(env={"X": "1"}))
        env.cdi.write_claim("alloc-orphan", [orphan])  # a spec without a hold
        counts = env.shim.reconcile_cdi()
        assert counts == {"holds": 1, "regenerated": 1, "rebuilt": 0, "orphans": 1}
        assert env.cdi.read_claim(alloc) == spec
        assert env.cdi.claim_uids_on_disk() == {alloc}

    run(sock_dir, body)
