"""The shim's hold semantics at Allocate: a hold is never taken over by another resource.

The real shim (two resources over mock devices, ledger and CDI specs in tmp, no kubelet:
Allocate is called directly). Only a stale hold of the *same* resource may be superseded
(:mod:`tests.grpc.test_deviceplugin` covers that); a hold of another resource keeps its
device whatever the caller names.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import yaml

from dradriver.deviceplugin.server import DevicePluginError
from dradriver.devices.config import parse_config
from dradriver.devices.sources import build_sources, discover_all
from dradriver.host.cdi import CDIRegistry
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import DeviceRef, PluginHold
from dradriver.k8s.objects import Obj
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.legacy.allocspec import CDI_CLASS
from kubeletplugin.legacy.holds import UNKNOWN_CONTAINER
from kubeletplugin.legacy.shim import DevicePluginShim
from kubeletplugin.metrics import PluginMetrics
from tests.metricsample import sample_value

pytestmark = pytest.mark.unit

DRIVER = "dradriver.dev"
NODE = "node-1"
RESOURCE_A = "dradriver.dev/a"
RESOURCE_B = "dradriver.dev/b"


def config_text(root: Path) -> str:
    # dev-0 and dev-1 are served as A, dev-2 as B.
    devices = [
        {"name": f"dev-{i}", "attributes": {"kind": "a" if i < 2 else "b"}} for i in range(3)
    ]
    doc: Obj = {
        "driverName": DRIVER,
        "sources": [{"static": {"mockDir": str(root / "mock"), "devices": devices}}],
        "devicePlugin": {
            "enabled": True,
            "mode": "shared",
            "resources": [
                {"resourceName": RESOURCE_A, "devices": {"attributes": {"kind": "a"}}},
                {"resourceName": RESOURCE_B, "devices": {"attributes": {"kind": "b"}}},
            ],
        },
    }
    return yaml.safe_dump(doc)


def make_shim(root: Path) -> DevicePluginShim:
    config = parse_config(config_text(root))
    sources = build_sources(config)
    return DevicePluginShim(
        config=config.device_plugin,
        driver_name=DRIVER,
        inventory=NodeInventory(NODE, lambda: discover_all(sources)),
        ledger=Ledger.load(root / "state" / "ledger.json"),
        cdi_dir=root / "cdi",
        plugin_dir=root / "device-plugins",
        metrics=PluginMetrics(),
    )


def holds_of(shim: DevicePluginShim) -> list[tuple[str, str, list[str]]]:
    return [
        (h.resource, h.pod_uid, [r.device for r in h.devices]) for h in shim.ledger.plugin_holds()
    ]


def errors(shim: DevicePluginShim, resource: str, reason: str) -> float | None:
    return sample_value(
        shim.metrics.registry,
        "dradriver_deviceplugin_allocation_errors_total",
        {"resource": resource, "reason": reason},
    )


def test_an_allocate_of_another_resource_naming_a_held_device_is_refused(tmp_path: Path) -> None:
    shim = make_shim(tmp_path)
    held = shim.allocate(RESOURCE_A, ["dev-0"]).annotations[f"{DRIVER}/allocation"]

    with pytest.raises(DevicePluginError) as exc:
        shim.allocate(RESOURCE_B, ["dev-0"])

    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(exc.value) == (
        f"device dev-0 does not belong to resource {RESOURCE_B} (devicePlugin.resources)"
    )
    assert holds_of(shim) == [(RESOURCE_A, held, ["dev-0"])]
    assert CDIRegistry(tmp_path / "cdi", DRIVER, CDI_CLASS).claim_uids_on_disk() == {held}
    assert errors(shim, RESOURCE_B, "invalid") == 1


def test_a_hold_of_another_resource_is_never_superseded(tmp_path: Path) -> None:
    """A hold of A on a device B serves now (devicePlugin.resources changed across a
    restart while the container kept running): B's Allocate of it is refused as busy, and
    the hold stays A's, where a stale hold of B itself would have been released."""
    shim = make_shim(tmp_path)
    shim.ledger.begin_plugin_hold(
        RESOURCE_A, "alloc-old", UNKNOWN_CONTAINER, [DeviceRef(pool=NODE, device="dev-2")]
    )
    shim.ledger.complete_plugin_hold("alloc-old", UNKNOWN_CONTAINER)
    [before] = shim.ledger.plugin_holds()

    with pytest.raises(DevicePluginError) as exc:
        shim.allocate(RESOURCE_B, ["dev-2"])

    assert exc.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert str(exc.value).startswith(f"cannot allocate {RESOURCE_B} devices dev-2: device ")
    assert f"device-plugin resource {RESOURCE_A} for pod alloc-old" in str(exc.value)
    [after] = shim.ledger.plugin_holds()
    assert after == before
    assert isinstance(after, PluginHold) and after.state == "allocated"
    assert CDIRegistry(tmp_path / "cdi", DRIVER, CDI_CLASS).claim_uids_on_disk() == set()
    assert errors(shim, RESOURCE_B, "busy") == 1
    assert shim.in_flight() == set()
    released = sample_value(
        shim.metrics.registry,
        "dradriver_deviceplugin_releases_total",
        {"resource": RESOURCE_A, "reason": "superseded"},
    )
    assert released in (None, 0)
