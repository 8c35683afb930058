"""kubeletplugin.extendedresources: a host profile's extendedResourceName served one way per
node, DRA or the device-plugin shim, from the probe's answer and the extendedResources
setting; the configuration checks; the DeviceClass probe."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.devices.config import DriverConfig, parse_config
from dradriver.devices.configyaml import DriverConfigError
from dradriver.devices.hostdev.source import HostDeviceSource
from dradriver.devices.model import Device
from dradriver.devices.sources import build_sources, discover_all
from dradriver.k8s.objects import Obj
from dradriver.resourceslice.capabilities import (
    keeps_extended_resource_name,
    probe_device_class,
)
from kubeletplugin.extendedresources import (
    DEVICE_PLUGIN,
    DRA,
    ExtendedResources,
    choose,
    shim_config,
)
from kubeletplugin.hostdevices import CAPACITY, HostDevices

DRIVER = "test.dradriver.dev"
KVM = "example.com/kvm"
TTY = "example.com/tty"


def make_config(dev: Path, extra: Obj | None = None, share: int | None = 4) -> DriverConfig:
    """Two profiles with an extended resource (one shared by count), one without."""
    common = {"devRoot": str(dev), "sysfsRoot": str(dev.parent / "sys")}
    kvm: Obj = {"name": "kvm", "nodes": [{"path": "/dev/kvm"}], "extendedResourceName": KVM}
    if share is not None:
        kvm["share"] = share
    doc: Obj = {
        "driverName": DRIVER,
        "sources": [
            {"host": {**common, **kvm}},
            {"host": {**common, "name": "tty", "nodes": [{"path": "/dev/ttyX0"}]}},
            {
                "host": {
                    **common,
                    "name": "modem",
                    "nodes": [{"path": "/dev/ttyX1"}],
                    "extendedResourceName": TTY,
                }
            },
        ],
        **(extra or {}),
    }
    return parse_config(yaml.safe_dump(doc), "driver.yaml")


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    """A devRoot with harmless nodes: /dev/null's numbers (1:3) under the test's own dir."""
    root = tmp_path / "dev"
    root.mkdir()
    for name in ("kvm", "ttyX0", "ttyX1"):
        os.mknod(root / name, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return root


def devices(config: DriverConfig) -> dict[str, Device]:
    return {d.name: d for d in discover_all(build_sources(config))}


# ----- the decision -------------------------------------------------------------------


def test_auto_takes_dra_only_where_the_cluster_keeps_the_field() -> None:
    assert choose("auto", True).path == DRA
    assert choose("auto", False).path == DEVICE_PLUGIN
    assert "DRAExtendedResource" in choose("auto", False).why
    assert choose("auto", None).path == DEVICE_PLUGIN  # no answer: the path every release serves


def test_the_setting_forces_a_path_whatever_the_probe_says() -> None:
    for keeps in (True, False, None):
        assert choose("dra", keeps).path == DRA
        assert choose("devicePlugin", keeps).path == DEVICE_PLUGIN


class FakeClient:
    """Answers the DeviceClass dry run: keeps the field, drops it, or fails."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, Any, Any]] = []

    async def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Obj:
        self.requests.append((method, path, body, params))
        if self.answer == "refused":
            raise PermissionError("deviceclasses is forbidden")
        assert isinstance(body, dict)
        stored = {**body, "spec": dict(body["spec"])}
        if self.answer == "drops":
            del stored["spec"]["extendedResourceName"]
        return stored


@pytest.mark.parametrize(
    ("answer", "path"), [("keeps", DRA), ("drops", DEVICE_PLUGIN), ("refused", DEVICE_PLUGIN)]
)
def test_decide_asks_the_apiserver_with_a_dry_run(dev: Path, answer: str, path: str) -> None:
    client = FakeClient(answer)
    extended = ExtendedResources(make_config(dev))
    choice = asyncio.run(extended.decide(client, DRIVER))
    assert choice is not None and choice.path == path and extended.path == path
    [(method, url, body, params)] = client.requests
    assert (method, url, params) == (
        "POST",
        "/apis/resource.k8s.io/v1/deviceclasses",
        {"dryRun": "All"},
    )
    assert body["spec"]["extendedResourceName"] == f"{DRIVER}/probe"
    said = extended.said()
    assert said["extended_resources_by"] == path
    assert said["extended_resources"] == f"{KVM},{TTY}"


def test_no_probe_when_forced_or_without_extended_resources(dev: Path) -> None:
    client = FakeClient("keeps")
    forced = ExtendedResources(make_config(dev, {"extendedResources": "devicePlugin"}))
    assert asyncio.run(forced.decide(client, DRIVER)) is not None
    assert forced.path == DEVICE_PLUGIN
    plain = ExtendedResources(parse_config(f"driverName: {DRIVER}\n"))
    assert asyncio.run(plain.decide(client, DRIVER)) is None
    assert plain.said() == {} and plain.shim_config() is None and plain.partitioned == []
    assert client.requests == []


def test_the_probe_class_and_its_answers() -> None:
    sent = probe_device_class(DRIVER)
    assert sent["kind"] == "DeviceClass" and sent["metadata"] == {
        "generateName": f"{DRIVER}-probe-"
    }
    assert asyncio.run(keeps_extended_resource_name(FakeClient("keeps"), DRIVER)) is True
    assert asyncio.run(keeps_extended_resource_name(FakeClient("drops"), DRIVER)) is False
    assert asyncio.run(keeps_extended_resource_name(FakeClient("refused"), DRIVER)) is None


# ----- the shim's resources -------------------------------------------------------------


def test_device_plugin_path_generates_partitioned_resources_and_starts_the_shim(
    dev: Path,
) -> None:
    config = make_config(dev)
    assert not config.device_plugin.enabled
    served = shim_config(config, DEVICE_PLUGIN)
    assert served is not None and served.enabled and served.mode == "partitioned"
    assert [r.resource_name for r in served.resources] == [KVM, TTY]
    extended = ExtendedResources(config)
    extended.choice = choose("devicePlugin", None)
    assert extended.partitioned == [KVM, TTY]
    found = devices(extended.config)
    assert {n: served.resource_of(d, DRIVER) for n, d in found.items()} == {
        **{f"kvm-{i}": KVM for i in range(4)},
        "tty": None,
        "modem": TTY,
    }


def test_device_plugin_path_keeps_the_users_own_resources(dev: Path) -> None:
    own = {"resourceName": "example.com/other", "devices": {"names": ["tty"]}}
    config = make_config(
        dev, {"devicePlugin": {"enabled": True, "mode": "shared", "resources": [own]}}
    )
    served = shim_config(config, DEVICE_PLUGIN)
    assert served is not None and served.mode == "shared"
    assert [r.resource_name for r in served.resources] == [KVM, TTY, "example.com/other"]
    # Resources of a disabled shim are not served.
    disabled = make_config(dev, {"devicePlugin": {"enabled": False, "resources": [own]}})
    served = shim_config(disabled, DEVICE_PLUGIN)
    assert served is not None and [r.resource_name for r in served.resources] == [KVM, TTY]


def test_dra_path_does_not_start_the_shim_for_these_names(dev: Path) -> None:
    assert shim_config(make_config(dev), DRA) is None
    own = {"resourceName": "example.com/other", "devices": {"names": ["tty"]}}
    config = make_config(dev, {"devicePlugin": {"enabled": True, "resources": [own]}})
    served = shim_config(config, DRA)
    assert served is not None and [r.resource_name for r in served.resources] == [
        "example.com/other"
    ]
    extended = ExtendedResources(config)
    extended.choice = choose("dra", None)
    assert extended.partitioned == []


def test_dra_path_devices_carry_the_attribute(dev: Path) -> None:
    found = devices(ExtendedResources(make_config(dev)).config)
    attributes = {n: d.to_api(DRIVER)["attributes"] for n, d in found.items()}
    for slot in range(4):
        assert attributes[f"kvm-{slot}"]["extendedResource"] == {"string": KVM}
    assert attributes["modem"]["extendedResource"] == {"string": TTY}
    assert "extendedResource" not in attributes["tty"]


def test_profiles_served_by_the_device_plugin_stay_slot_devices(dev: Path) -> None:
    config = ExtendedResources(make_config(dev)).config
    sources = [s for s in build_sources(config) if isinstance(s, HostDeviceSource)]
    host = HostDevices(sources, on_change=lambda: None)
    host.slots_for([KVM])
    host.use(CAPACITY)
    kvm = sources[0].discover()
    assert [d.name for d in kvm] == [f"kvm-{i}" for i in range(4)]
    assert not any(d.allow_multiple_allocations for d in kvm)
    host.slots_for([])
    host.use(CAPACITY)
    [one] = sources[0].discover()
    assert one.allow_multiple_allocations


# ----- the configuration ------------------------------------------------------------


def test_a_shim_resource_with_a_profiles_name_is_refused_naming_both_fields(dev: Path) -> None:
    clash = {"resourceName": KVM, "devices": {"names": ["tty"]}}
    with pytest.raises(DriverConfigError) as err:
        make_config(dev, {"devicePlugin": {"enabled": True, "resources": [clash]}})
    text = str(err.value)
    assert "devicePlugin.resources[0].resourceName" in text
    assert "sources[0].host.extendedResourceName" in text


def test_profiles_sharing_a_name_serve_it_together(dev: Path) -> None:
    """generic-device-plugin's groups of one resource become profiles with one name."""
    doc = make_config(dev).model_dump(by_alias=True, exclude_defaults=True, mode="json")
    doc["sources"][2]["host"]["extendedResourceName"] = KVM
    config = parse_config(yaml.safe_dump(doc))
    served = shim_config(config, DEVICE_PLUGIN)
    assert served is not None and [r.resource_name for r in served.resources] == [KVM]
    found = devices(ExtendedResources(config).config)
    assert {n for n, d in found.items() if served.resource_of(d, DRIVER) == KVM} == {
        "kvm-0",
        "kvm-1",
        "kvm-2",
        "kvm-3",
        "modem",
    }


def test_the_attribute_is_not_set_by_hand(dev: Path) -> None:
    config = make_config(dev)
    doc = config.model_dump(by_alias=True, exclude_defaults=True, mode="json")
    doc["sources"][0]["host"]["attributes"] = {"extendedResource": "x"}
    with pytest.raises(DriverConfigError, match=r"sources\[0\]\.host\.attributes\.extended"):
        parse_config(yaml.safe_dump(doc))


def test_the_setting_is_checked(dev: Path) -> None:
    assert make_config(dev).extended_resources == "auto"
    with pytest.raises(DriverConfigError, match="extendedResources"):
        make_config(dev, {"extendedResources": "both"})
