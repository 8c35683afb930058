"""Hot-plug of a host device, end to end: a node appears, goes and comes back under
another kernel name, and the node's ResourceSlice follows within a second.

The profile's ``devRoot`` and ``sysfsRoot`` point at a tree the module makes (a serial-like
USB device with a by-id link; the node made with mknod using /dev/null's numbers 1:3, so it
is harmless), so nothing on the host changes. The device is named from its by-id link, so
it keeps its name whatever the kernel calls it; while it is gone it is tainted unhealthy.
Latencies (event to slice) over 20 plugs and 20 unplugs are printed (``-s``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import NodePlugin, node_slices, start_node_plugin
from dradriver.devices.hostdev.identity import Identity, device_name
from dradriver.devices.model import unhealthy_taint_key
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for

DRIVER = "hotplug.dradriver.dev"
NODE = "node-1"
# Hot-plug: one serial-like device, known by its by-id link whatever the kernel calls it.
HOT_BY_ID = "usb-Dradriver_Hotplug_HOT123-if00-port0"
HOT_DEVICE = device_name("hot", Identity("byId", HOT_BY_ID))
HOT_ROUNDS = 20
HOT_GOAL = 1.0  # seconds, the plugin's goal; asserted with a margin for CI noise
HOT_LIMIT = 2.0
# The slice publisher syncs a pool at most once per second (SlicePublisher's min_interval),
# coalescing bursts, and the informer's echo of its own write queues one more (no-op) sync a
# second after the write, which restarts that second: an event less than two seconds after
# the last write waits for the rest of it (up to 1 s). Each hot-plug event here is made a
# little more than two intervals after the last write, so what is measured is the event's
# own path (inotify, rediscovery, publishing, the apiserver).
PUBLISH_INTERVAL = 1.0
QUIET = 2 * PUBLISH_INTERVAL + 0.1


@pytest.fixture(scope="module")
def plugin(local_cluster: LocalCluster) -> Iterator[NodePlugin]:
    work = Path(tempfile.mkdtemp(prefix="dradriver-test-hotplug-", dir="/tmp"))
    (work / "hot" / "dev" / "serial" / "by-id").mkdir(parents=True)
    (work / "hot" / "sys").mkdir(parents=True)
    profile = {
        "name": "hot",
        "nodes": [{"path": "/dev/ttyHOT*", "mountPath": "/dev/"}],
        "identity": "byId",
        "devRoot": str(work / "hot" / "dev"),
        "sysfsRoot": str(work / "hot" / "sys"),
    }
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({"driverName": DRIVER, "sources": [{"host": profile}]}))
    with local_cluster.api() as api:
        node_plugin = start_node_plugin(local_cluster, api, config, work, driver=DRIVER)
        try:
            yield node_plugin
        finally:
            node_plugin.stop()
            for s in node_slices(api, NODE, DRIVER):
                api.delete(path_for(RESOURCE_V1, "resourceslices", name=s["metadata"]["name"]))
            shutil.rmtree(work, ignore_errors=True)


def hot_devices(api: AdminAPI) -> list[Obj]:
    return [d for s in node_slices(api, NODE, DRIVER) for d in s["spec"].get("devices", [])]


class HotTree:
    """The hot-plug profile's /dev and /sys: nodes with /dev/null's numbers (1:3)."""

    def __init__(self, work: Path) -> None:
        self.dev = work / "hot" / "dev"
        self.sys = work / "hot" / "sys"
        self.by_id = self.dev / "serial" / "by-id" / HOT_BY_ID
        usb = self.sys / "devices" / "pci0000:00" / "0000:00:14.0" / "usb1" / "1-2"
        usb.mkdir(parents=True, exist_ok=True)
        for name, value in (
            ("idVendor", "0403"),
            ("idProduct", "6001"),
            ("serial", "HOT123"),
            ("busnum", "1"),
            ("devpath", "2"),
        ):
            (usb / name).write_text(value + "\n")
        self.usb = usb
        (self.sys / "class" / "tty").mkdir(parents=True, exist_ok=True)
        (self.sys / "dev" / "char").mkdir(parents=True, exist_ok=True)

    def plug(self, kernel_name: str) -> None:
        """What the kernel and udev do for a new serial device: sysfs, the node, the link."""
        node_dir = self.usb / "1-2:1.0" / kernel_name / "tty" / kernel_name
        node_dir.mkdir(parents=True, exist_ok=True)
        subsystem = node_dir / "subsystem"
        if not subsystem.is_symlink():
            subsystem.symlink_to(os.path.relpath(self.sys / "class" / "tty", node_dir))
        dev_link = self.sys / "dev" / "char" / "1:3"
        if dev_link.is_symlink():
            dev_link.unlink()
        dev_link.symlink_to(os.path.relpath(node_dir, dev_link.parent))
        os.mknod(self.dev / kernel_name, 0o600 | 0o020000, os.makedev(1, 3))
        self.by_id.symlink_to(f"../../{kernel_name}")

    def unplug(self, kernel_name: str) -> None:
        self.by_id.unlink()
        (self.dev / kernel_name).unlink()
        shutil.rmtree(self.usb / "1-2:1.0", ignore_errors=True)


def hot_device(api: AdminAPI) -> Obj | None:
    for device in hot_devices(api):
        if device["name"] == HOT_DEVICE:
            return device
    return None


def tainted(device: Obj) -> bool:
    return any(t.get("key") == unhealthy_taint_key(DRIVER) for t in device.get("taints", []))


def timed(what: str, probe: Any) -> tuple[float, Obj]:
    """Seconds from now until ``probe`` returns the device (polled every 20 ms)."""
    start = time.monotonic()
    device = wait_until(what, probe, 10, interval=0.02)
    return time.monotonic() - start, device


def quiet_since(written: float) -> None:
    """Wait until :data:`QUIET` has passed since the slice write seen at ``written`` (a time
    condition: nothing the test can observe tells when the publisher's interval is over)."""
    wait_until(
        "the slice publisher's minimum interval",
        lambda: time.monotonic() >= written + QUIET,
        QUIET + 1,
        interval=0.02,
    )


def test_hotplug_a_serial_node_appears_is_tainted_when_gone_and_returns_under_its_name(
    plugin: NodePlugin, api: AdminAPI
) -> None:
    plugin.wait_ready()
    tree = HotTree(plugin.workdir)
    assert hot_device(api) is None
    plugs: list[float] = []
    unplugs: list[float] = []
    written = time.monotonic() - QUIET
    for i in range(HOT_ROUNDS):
        kernel_name = f"ttyHOT{i % 3}"  # the same device under changing kernel names
        quiet_since(written)
        tree.plug(kernel_name)

        def present(kernel_name: str = kernel_name) -> Obj | None:
            device = hot_device(api)
            if device is None or tainted(device):
                return None
            path = device["attributes"].get("path", {}).get("string")
            return device if path == f"/dev/{kernel_name}" else None

        took, device = timed(f"{HOT_DEVICE} published, healthy, at /dev/{kernel_name}", present)
        written = time.monotonic()
        plugs.append(took)
        attributes = device["attributes"]
        assert attributes["identity"] == {"string": f"byId:{HOT_BY_ID}"}
        assert attributes["subsystem"] == {"string": "tty"}
        assert (attributes["major"], attributes["minor"]) == ({"int": 1}, {"int": 3})
        assert attributes["vendor"] == {"string": "0403"}
        assert attributes["product"] == {"string": "6001"}
        assert attributes["serial"] == {"string": "HOT123"}
        assert attributes["busPath"] == {"string": "1-2"}

        quiet_since(written)
        tree.unplug(kernel_name)

        def gone() -> Obj | None:
            device = hot_device(api)
            return device if device is not None and tainted(device) else None

        took, device = timed(f"{HOT_DEVICE} tainted unhealthy", gone)
        written = time.monotonic()
        unplugs.append(took)
        # Still the one device of the profile: a device seen once stays known.
        assert [d["name"] for d in hot_devices(api)] == [HOT_DEVICE]

    def ms(values: list[float]) -> str:
        return f"p50 {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"

    print(
        f"\nhot-plug to slice over {HOT_ROUNDS} plugs and {HOT_ROUNDS} unplugs "
        f"(goal {HOT_GOAL:.0f} s; events {QUIET:.1f} s after the last slice write): "
        f"plug {ms(plugs)}; unplug {ms(unplugs)}"
    )
    assert max(plugs) < HOT_LIMIT and max(unplugs) < HOT_LIMIT, (plugs, unplugs)
