"""kubeletplugin.hostdevices: the sharing form from the start-up probe, and hot-plug events
reaching the plugin."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from dradriver.devices.hostdev.config import HostSourceConfig
from dradriver.devices.hostdev.source import HostDeviceSource
from dradriver.resourceslice.capabilities import CONSUMABLE, DEVICE_TAINTS, Missing
from kubeletplugin.hostdevices import CAPACITY, SLOTS, HostDevices, sharing_form


def test_capacity_only_when_the_probe_saw_the_cluster_keep_it() -> None:
    assert sharing_form([]) == CAPACITY
    assert sharing_form([Missing(DEVICE_TAINTS, ["taints"])]) == CAPACITY
    assert sharing_form([Missing(CONSUMABLE, ["allowMultipleAllocations"])]) == SLOTS
    assert sharing_form(None) == SLOTS  # no answer: the form every release serves


def _profile(dev: Path, share: int | None) -> HostDeviceSource:
    config = HostSourceConfig.model_validate(
        {
            "name": "tty",
            "devRoot": str(dev),
            "sysfsRoot": str(dev.parent / "sys"),
            "nodes": [{"path": "/dev/ttyX*"}],
            **({"share": share} if share else {}),
        }
    )
    return HostDeviceSource("sources[0] (host)", config)


def test_the_form_applies_to_the_host_sources_only(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "ttyX0", stat.S_IFCHR | 0o600, os.makedev(240, 0))
    shared = _profile(dev, 2)
    host = HostDevices([shared, object()], on_change=lambda: None)
    assert host.sources == [shared] and host.shared
    slots = shared.discover()
    assert len(slots) == 2 and not any(d.allow_multiple_allocations for d in slots)
    host.use(CAPACITY)
    devices = shared.discover()
    assert len(devices) == 1 and devices[0].allow_multiple_allocations
    assert not HostDevices([_profile(dev, None)], on_change=lambda: None).shared


def test_a_node_made_under_a_watched_directory_reaches_the_plugin_within_1s(
    tmp_path: Path,
) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    source = _profile(dev, None)

    async def scenario() -> None:
        changed = asyncio.Event()
        host = HostDevices([source], on_change=changed.set)
        host.start()
        try:
            os.mknod(dev / "ttyX3", stat.S_IFCHR | 0o600, os.makedev(240, 3))
            await asyncio.wait_for(changed.wait(), timeout=1.0)
        finally:
            host.stop()

    asyncio.run(scenario())
    assert len(source.discover()) == 1
