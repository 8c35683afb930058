"""Device nodes a runtime would refuse fail the claim (or Allocate) at prepare, not the pod.

containerd's CDI library (container-device-interface v1.1.1 in containerd 2.4)
``lstat``s each device node's host path when it creates a container and refuses anything
but a device node. These tests check that dradriver refuses those paths first, per claim,
with a message naming device and path.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import cast

import pytest
import yaml

from dradriver.deviceplugin.server import DevicePluginError
from dradriver.devices.config import parse_config
from dradriver.devices.sources import build_sources, discover_all
from dradriver.host.cdi import (
    CDIDevice,
    CDIRegistry,
    HostDeviceNodeError,
    check_host_device_nodes,
    host_device_node_problem,
)
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.host.state.ledger import Ledger
from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.plugin.interface import ClaimRef
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.legacy.shim import CDI_CLASS, DevicePluginShim
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.nodedriver import NodeDriver
from tests.fakes.apiserver import FakeAPIServer
from tests.metricsample import sample_value

pytestmark = pytest.mark.unit

DRIVER = "dradriver.dev"
NODE = "node-1"
NAMESPACE = "team-a"
RESOURCE = "dradriver.dev/mock"


def node_edits(host_path: Path) -> ContainerEdits:
    return ContainerEdits(device_nodes=(DeviceNode(path="/dev/x", host_path=str(host_path)),))


def test_device_nodes_pass_everything_else_is_named(tmp_path: Path) -> None:
    os.mknod(tmp_path / "char", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.mknod(tmp_path / "block", stat.S_IFBLK | 0o600, os.makedev(7, 0))
    (tmp_path / "file").write_text("a mock file of an older dradriver\n")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "char")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")

    problems = {p.name: host_device_node_problem(str(p)) for p in sorted(tmp_path.iterdir())}
    problems["missing"] = host_device_node_problem(str(tmp_path / "missing"))
    link = (
        "is a symbolic link, which container runtimes do not follow for device nodes; "
        "use the path of the device node itself"
    )
    assert problems == {
        "block": None,
        "char": None,
        "dir": "is a directory, not a character or block device",
        "fifo": "is a FIFO, not a character or block device",
        "file": "is a regular file, not a character or block device",
        "link": link,
        "loop": link,  # lstat: never walked, so no loop to get lost in
        "missing": "does not exist",
    }


def test_the_error_names_every_bad_device_and_path(tmp_path: Path) -> None:
    os.mknod(tmp_path / "good", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    (tmp_path / "file").touch()
    devices = [
        CDIDevice("dev-0", node_edits(tmp_path / "good")),
        CDIDevice("dev-1", node_edits(tmp_path / "file")),
        CDIDevice("net-0", ContainerEdits(env={"A": "1"})),  # no device nodes: nothing to check
        CDIDevice("dev-2", ContainerEdits(device_nodes=(DeviceNode(path=str(tmp_path / "no")),))),
    ]
    with pytest.raises(HostDeviceNodeError) as exc:
        check_host_device_nodes(devices)
    assert str(exc.value) == (
        f"device dev-1: host path {tmp_path / 'file'} of device node /dev/x is a regular file, "
        f"not a character or block device; device dev-2: host path {tmp_path / 'no'} of device "
        f"node {tmp_path / 'no'} does not exist (the container runtime would refuse every "
        "container using it)"
    )
    check_host_device_nodes(devices[:1] + devices[2:3])


# ----- the node driver: one bad device fails its claim only ---------------------------------


def driver_config(root: Path, device_plugin: bool = False) -> str:
    doc: Obj = {
        "driverName": DRIVER,
        "sources": [{"static": {"mockDir": str(root / "mock"), "devices": [{"count": 3}]}}],
    }
    if device_plugin:
        doc["devicePlugin"] = {
            "enabled": True,
            "mode": "partitioned",
            "resources": [{"resourceName": RESOURCE, "devices": {"names": ["dev-2"]}}],
        }
    return yaml.safe_dump(doc)


def inventory_for(root: Path, device_plugin: bool = False) -> tuple[NodeInventory, Ledger]:
    config = parse_config(driver_config(root, device_plugin))
    sources = build_sources(config)
    inventory = NodeInventory(NODE, lambda: discover_all(sources))  # makes the mock nodes
    return inventory, Ledger.load(root / "state" / "ledger.json")


def allocated_claim(api: FakeAPIServer, name: str, device: str) -> ClaimRef:
    stored = api.put(
        path_for(RESOURCE_V1, "resourceclaims", NAMESPACE, name),
        {
            "metadata": {"name": name, "namespace": NAMESPACE},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
                        ]
                    }
                }
            },
        },
    )
    return ClaimRef(NAMESPACE, stored["metadata"]["uid"], name)


def test_a_regular_file_at_a_device_node_fails_only_that_claim(tmp_path: Path) -> None:
    inventory, ledger = inventory_for(tmp_path)
    cdi = CDIRegistry(tmp_path / "cdi", DRIVER)
    api = FakeAPIServer()
    driver = NodeDriver(
        client=cast(KubeClient, api),
        driver_name=DRIVER,
        inventory=inventory,
        ledger=ledger,
        cdi=cdi,
    )
    bad = allocated_claim(api, "bad", "dev-0")
    good = allocated_claim(api, "good", "dev-1")
    mock = tmp_path / "mock" / "dev-0"
    mock.unlink()
    mock.write_text("restored as a plain file\n")  # still "healthy": the file exists

    results = asyncio.run(driver.prepare_claims([bad, good]))

    assert results[bad.uid].error == (
        f"ResourceClaim {NAMESPACE}/bad: device dev-0: host path {mock} of device node "
        "/dev/dradriver/dev-0 is a regular file, not a character or block device (the "
        "container runtime would refuse every container using it)"
    )
    assert results[bad.uid].devices == []
    assert results[good.uid].error == ""
    assert [d.device for d in results[good.uid].devices] == ["dev-1"]
    assert [c.uid for c in ledger.claims()] == [good.uid]  # the bad one holds nothing
    assert cdi.claim_uids_on_disk() == {good.uid}
    assert sample_value(driver.metrics.registry, "dradriver_prepare_errors_total") == 1


def test_device_plugin_allocate_refuses_a_bad_device_node(tmp_path: Path) -> None:
    inventory, ledger = inventory_for(tmp_path, device_plugin=True)
    config = parse_config(driver_config(tmp_path, device_plugin=True))
    metrics = PluginMetrics()
    shim = DevicePluginShim(
        config=config.device_plugin,
        driver_name=DRIVER,
        inventory=inventory,
        ledger=ledger,
        cdi_dir=tmp_path / "cdi",
        plugin_dir=tmp_path / "device-plugins",
        metrics=metrics,
    )
    mock = tmp_path / "mock" / "dev-2"
    mock.unlink()
    mock.write_text("restored as a plain file\n")

    with pytest.raises(DevicePluginError) as exc:
        shim.allocate(RESOURCE, ["dev-2"])
    assert str(exc.value) == (
        f"cannot allocate {RESOURCE} devices dev-2: device dev-2: host path {mock} of device "
        "node /dev/dradriver/dev-2 is a regular file, not a character or block device (the "
        "container runtime would refuse every container using it)"
    )
    assert ledger.plugin_holds() == []
    assert CDIRegistry(tmp_path / "cdi", DRIVER, CDI_CLASS).claim_uids_on_disk() == set()
    refused = {"resource": RESOURCE, "reason": "invalid"}
    assert (
        sample_value(metrics.registry, "dradriver_deviceplugin_allocation_errors_total", refused)
        == 1
    )
