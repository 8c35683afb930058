"""An allocation's CDI spec reads back as what was written: the devices and the resource.

A lost ledger rebuilds device-plugin holds from nothing else, so the names and the
``DRADRIVER_RESOURCE`` variable written at Allocate must survive a round trip through
the spec file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.devices.model import Device
from dradriver.host.cdi import CDIRegistry
from dradriver.host.containeredits import ContainerEdits
from kubeletplugin.legacy.allocspec import (
    CDI_CLASS,
    allocation_devices,
    allocation_edits,
    spec_device_names,
    spec_resources,
)

pytestmark = pytest.mark.unit

DRIVER = "dradriver.dev"
RESOURCE = "dradriver.dev/mock"


def test_the_edits_name_the_resource_and_the_allocation_over_the_device_own() -> None:
    device = Device(
        name="dev-0",
        edits=ContainerEdits(env={"DEVICE": "0", "DRADRIVER_RESOURCE": "theirs"}),
    )
    assert allocation_edits(RESOURCE, "alloc-1", device).env == {
        "DEVICE": "0",
        "DRADRIVER_RESOURCE": RESOURCE,
        "DRADRIVER_ALLOCATION": "alloc-1",
    }


def test_a_written_spec_reads_back_as_its_devices_and_resource(tmp_path: Path) -> None:
    cdi = CDIRegistry(tmp_path, DRIVER, CDI_CLASS)
    devices = [Device(name="dev-10"), Device(name="dev-2")]
    cdi.write_claim("alloc-1", allocation_devices(RESOURCE, "alloc-1", devices))

    spec = cdi.read_claim("alloc-1")

    assert spec is not None and spec["kind"] == f"{DRIVER}/{CDI_CLASS}"
    assert spec_device_names(spec, "alloc-1") == ["dev-10", "dev-2"]
    assert spec_resources(spec) == {RESOURCE}


def test_no_spec_names_nothing() -> None:
    assert spec_device_names(None, "alloc-1") == []
    assert spec_resources(None) == set()
    assert spec_resources({"devices": [{"name": "alloc-1-dev-0"}]}) == set()
