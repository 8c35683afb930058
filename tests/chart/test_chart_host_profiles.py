"""The chart and host profiles' extended resources: one DeviceClass per profile with
``extendedResourceName``, selecting exactly that profile's devices; the plugin's dry-run-only
right to create DeviceClasses (its start-up probe); the names never advertised both ways."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

from dradriver.devices.sources import build_sources, discover_all
from kubeletplugin.extendedresources import ExtendedResources
from tests.chart.test_chart import DRIVER, Obj, _selected, driver_config, failure, one, render

KVM = "example.com/kvm"


def host_values(tmp_path: Path, **extra: Obj) -> str:
    """A values file: a kvm profile with an extended resource, a tty profile without."""
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    for name in ("kvm", "ttyX0"):
        if not (dev / name).exists():
            os.mknod(dev / name, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    common = {"devRoot": str(dev), "sysfsRoot": str(tmp_path / "sys")}
    config: Obj = {
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
            {"host": {**common, "name": "tty", "nodes": [{"path": "/dev/ttyX0"}]}},
        ],
        **extra,
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"kubeletPlugin": {"config": config}}))
    return str(path)


def test_one_class_per_profile_with_an_extended_resource(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, "--values", host_values(tmp_path))
    profile = one(docs, "DeviceClass", f"{DRIVER}-kvm")
    assert profile["spec"]["extendedResourceName"] == KVM
    assert not [
        d for d in docs if d["kind"] == "DeviceClass" and d["metadata"]["name"].endswith("-tty")
    ]
    config = driver_config(docs)
    assert config.extended_resources == "auto"
    sources = build_sources(ExtendedResources(config).config)
    devices = [d.to_api(config.driver_name) for d in discover_all(sources)]
    assert _selected(profile, devices) == {"kvm-0", "kvm-1"}
    assert _selected(one(docs, "DeviceClass", DRIVER), devices) == {"tty"}
    extended = one(docs, "DeviceClass", f"{DRIVER}-mock-extended-resource")
    assert _selected(extended, devices) == set()


def test_the_plugin_creates_device_classes_in_dry_run_only(helm: Path) -> None:
    docs = render(helm)
    role = one(docs, "ClusterRole", "dradriver-kubeletplugin")
    assert {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["deviceclasses"],
        "verbs": ["create"],
    } in role["rules"]
    policy = one(
        docs, "ValidatingAdmissionPolicy", "dradriver-kubeletplugin-dry-run-device-classes"
    )
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["deviceclasses"]
    assert "dryRun" in policy["spec"]["validations"][0]["expression"]
    binding = one(
        docs, "ValidatingAdmissionPolicyBinding", "dradriver-kubeletplugin-dry-run-device-classes"
    )
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_a_shim_resource_with_a_profiles_name_fails(helm: Path, tmp_path: Path) -> None:
    clash = {"enabled": True, "resources": [{"resourceName": KVM, "devices": {"names": ["tty"]}}]}
    stderr = failure(helm, "--values", host_values(tmp_path, devicePlugin=clash))
    assert "kubeletPlugin.config.devicePlugin.resources[0].resourceName" in stderr
    assert "kubeletPlugin.config.sources[0].host.extendedResourceName" in stderr


def test_a_profile_may_not_take_the_mock_classs_name(helm: Path, tmp_path: Path) -> None:
    stderr = failure(
        helm,
        "--values",
        host_values(tmp_path),
        "--set",
        f"deviceClasses.extendedResource.resourceName={KVM}",
    )
    assert "kubeletPlugin.config.sources[0].host.extendedResourceName" in stderr
    assert "deviceClasses.extendedResource.resourceName" in stderr


def test_the_setting_is_schema_checked(helm: Path) -> None:
    stderr = failure(helm, "--set", "kubeletPlugin.config.extendedResources=both")
    assert "values don't meet the specifications of the schema" in stderr
    assert "kubeletPlugin/config" in stderr, stderr
