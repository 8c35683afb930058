"""A host profile's extended resource on the device-plugin path, over real unix sockets: the
shim registers the name with the (fake) kubelet and lists the profile's slot devices, DRA
neither publishes nor prepares them (even with devicePlugin.mode: shared), and Allocate
hands out the profile's host node."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import grpc
import yaml

from dradriver.devices.config import DriverConfig, parse_config
from dradriver.devices.sources import build_sources, discover_all
from dradriver.host.state.ledger import Ledger
from dradriver.k8s.objects import Obj
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2 as dp
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from kubeletplugin.extendedresources import ExtendedResources, choose
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.legacy.shim import DevicePluginShim
from kubeletplugin.metrics import PluginMetrics
from tests.grpc.test_deviceplugin import FakeKubelet, next_update

DRIVER = "test.dradriver.dev"
KVM = "example.com/kvm"
NODE = "node-1"


def config(root: Path) -> DriverConfig:
    dev = root / "dev"
    dev.mkdir()
    for name in ("kvm", "other"):
        os.mknod(dev / name, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    common = {"devRoot": str(dev), "sysfsRoot": str(root / "sys")}
    doc: Obj = {
        "driverName": DRIVER,
        "sources": [
            {
                "host": {
                    **common,
                    "name": "kvm",
                    "nodes": [{"path": "/dev/kvm"}],
                    "share": 2,
                    "extendedResourceName": KVM,
                }
            },
            {"host": {**common, "name": "other", "nodes": [{"path": "/dev/other"}]}},
        ],
        "devicePlugin": {
            "enabled": True,
            "mode": "shared",
            "resources": [{"resourceName": "example.com/other", "devices": {"names": ["other"]}}],
        },
    }
    return parse_config(yaml.safe_dump(doc))


def test_the_device_plugin_path_serves_the_profile_and_keeps_it_from_dra(
    sock_dir: Path,
) -> None:
    extended = ExtendedResources(config(sock_dir))
    extended.choice = choose("devicePlugin", None)
    served = extended.shim_config()
    assert served is not None
    sources = build_sources(extended.config)
    inventory = NodeInventory(NODE, lambda: discover_all(sources))
    shim = DevicePluginShim(
        config=served,
        driver_name=DRIVER,
        inventory=inventory,
        ledger=Ledger.load(sock_dir / "state" / "ledger.json"),
        cdi_dir=sock_dir / "cdi",
        plugin_dir=sock_dir / "device-plugins",
        metrics=PluginMetrics(),
        watch_interval=0.05,
        partitioned=extended.partitioned,
    )
    assert shim.resource_names == [KVM, "example.com/other"]

    async def main() -> None:
        kubelet = FakeKubelet(sock_dir / "device-plugins")
        await kubelet.start()
        await shim.start()
        try:
            registered = {}
            for _ in range(2):
                reg = await kubelet.next_registration()
                registered[reg.request.resource_name] = reg
            assert (await next_update(registered[KVM])).keys() == {"kvm-0", "kvm-1"}
            # Shared mode hides only held devices; the profile's are never in the slices.
            published = shim.dra_devices(list(inventory.devices.values()))
            assert [d.name for d in published] == ["other"]
            reason = shim.refuse_for_dra("kvm-0")
            assert reason is not None and KVM in reason and "extendedResourceName" in reason
            assert shim.refuse_for_dra("other") is None  # shared mode: the ledger decides
            # Either slot is the profile's one host node, at its container path.
            response = await allocate_kvm(shim, "kvm-1")
            assert [(d.host_path, d.container_path) for d in response.devices] == [
                (str(sock_dir / "dev" / "kvm"), "/dev/kvm")
            ]
            [hold] = shim.plugin_holds()
            assert hold.resource == KVM
        finally:
            await shim.stop()
            await kubelet.stop(wipe=False)

    asyncio.run(main())


async def allocate_kvm(shim: DevicePluginShim, *ids: str) -> Any:
    endpoint = shim.manager.endpoint(KVM).socket
    async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
        response = await dp_grpc.DevicePluginStub(channel).Allocate(
            dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
        )
    return response.container_responses[0]
