"""One pod spec, ``resources.limits: {<name>: 1}``, served on every release from one driver
configuration: a host profile with ``extendedResourceName``.

The plugin chooses per node at start-up: where the apiserver keeps
``DeviceClass.spec.extendedResourceName`` (DRAExtendedResource: beta and on in 1.36, GA in
1.37) DRA serves the name through the profile's DeviceClass (the pod's
``status.extendedResourceClaimStatus`` names the claim the scheduler made, the node
advertises no such resource); elsewhere the device-plugin shim advertises it (the node's
allocatable counts the profile's slot devices, and the pod has no claim). The test expects
the path from what the apiserver did with the class it created itself, so it holds on every
release, and checks the plugin said the same in its start-up line.

The device is harmless and made up: a character node with /dev/null's numbers (1:3) under the
test's own directory, which the profile's ``devRoot`` points at. The plugin runs with its
own driver name, so no other test's devices or classes are involved.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import NodePlugin, node_slices, start_node_plugin
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from kubeletplugin.extendedresources import DEVICE_PLUGIN, DRA
from tests.cluster.conftest import Recorder
from tests.cluster.test_deviceplugin import (
    DEADLINE,
    NODE,
    delete_pods,
    make_plugin_pod,
    node_resource,
    pod,
    pod_resources,
    slice_devices,
    wait_running,
)

DRIVER = "ermig.dradriver.dev"
PROFILE = "kvm"
RESOURCE = f"{DRIVER}/kvm"
CLASS = f"{DRIVER}-{PROFILE}"
SHARE = 2
R = RESOURCE_V1
# The start-up line is logfmt: a value is quoted only when it needs to be.
STARTED_BY = re.compile(r' extended_resources_by="?([^"\s]+)"?')


def driver_config(work: Path) -> Obj:
    """The one configuration: a shared host profile with an extended resource (auto path)."""
    return {
        "driverName": DRIVER,
        "sources": [
            {
                "host": {
                    "name": PROFILE,
                    "nodes": [{"path": "/dev/kvm"}],
                    "devRoot": str(work / "dev"),
                    "sysfsRoot": str(work / "sys"),
                    "share": SHARE,
                    "extendedResourceName": RESOURCE,
                }
            }
        ],
    }


def profile_class() -> Obj:
    """The DeviceClass the chart renders for the profile."""
    return {
        "metadata": {"name": CLASS},
        "spec": {
            "extendedResourceName": RESOURCE,
            "selectors": [
                {
                    "cel": {
                        "expression": (
                            f'device.driver == "{DRIVER}" && '
                            f'"extendedResource" in device.attributes["{DRIVER}"] && '
                            f'device.attributes["{DRIVER}"].extendedResource == "{RESOURCE}"'
                        )
                    }
                }
            ],
        },
    }


def cleanup(api: AdminAPI) -> None:
    for s in node_slices(api, NODE, DRIVER):
        api.delete(path_for(R, "resourceslices", name=s["metadata"]["name"]))
    api.delete(path_for(R, "deviceclasses", name=CLASS))


@pytest.fixture(scope="module")
def migrated(local_cluster: LocalCluster) -> Iterator[tuple[NodePlugin, str]]:
    """The plugin on the node, and the path the cluster calls for (DRA or device plugin)."""
    work = Path("/tmp/dradriver-test-ermig")
    shutil.rmtree(work, ignore_errors=True)
    (work / "dev").mkdir(parents=True, mode=0o700)
    (work / "sys").mkdir()
    os.mknod(work / "dev" / "kvm", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(driver_config(work)))
    api = local_cluster.api()
    cleanup(api)
    created = api.create(path_for(R, "deviceclasses"), profile_class())
    expected = DRA if created["spec"].get("extendedResourceName") == RESOURCE else DEVICE_PLUGIN
    plugin = start_node_plugin(local_cluster, api, config, work, driver=DRIVER)
    try:
        yield plugin, expected
    finally:
        plugin.stop()
        cleanup(api)
        api.close()


def published_form(devices: dict[str, Obj]) -> str | None:
    """How the shared profile is published: "capacity", "slots", or None (not yet)."""
    if len(devices) == 1 and next(iter(devices.values())).get("allowMultipleAllocations"):
        return "capacity"
    if len(devices) == SHARE:
        return "slots"
    return None


def started_by(plugin: NodePlugin) -> str:
    """The path the plugin's start-up line says."""
    for line in plugin.log_path.read_text().splitlines():
        by = STARTED_BY.search(line)
        if by is not None and " msg=starting " in line:
            return by.group(1)
    raise AssertionError(f"no start-up line with extended_resources_by in {plugin.log_path}")


@pytest.mark.compat("host-extended-resource")
def test_one_pod_spec_runs_and_the_expected_path_serves_it(
    migrated: tuple[NodePlugin, str],
    api: AdminAPI,
    local_cluster: LocalCluster,
    namespace: str,
    matrix_notes: Recorder,
) -> None:
    plugin, expected = migrated
    assert started_by(plugin) == expected
    matrix_notes.note("host-extended-resource", f"served by {expected}")
    if expected == DEVICE_PLUGIN:
        wait_until(
            f"{SHARE} {RESOURCE} allocatable",
            lambda: node_resource(api, RESOURCE)[1] == SHARE,
            DEADLINE,
        )
        assert slice_devices(api, DRIVER) == {}  # partitioned: kept from DRA
    else:
        # Shared by count: one device with consumable capacity where the cluster keeps it,
        # else SHARE slot devices (the start-up probe decides; both serve the pod).
        wait_until(
            "the profile's devices published",
            lambda: published_form(slice_devices(api, DRIVER)) is not None,
            DEADLINE,
        )
        for device in slice_devices(api, DRIVER).values():
            assert device["attributes"]["extendedResource"] == {"string": RESOURCE}

    make_plugin_pod(api, namespace, "migrated", RESOURCE)
    wait_running(api, namespace, "migrated")
    status = pod(api, namespace, "migrated")["status"]
    claim_status = status.get("extendedResourceClaimStatus")
    try:
        if expected == DEVICE_PLUGIN:
            assert claim_status is None, claim_status
            held = pod_resources(local_cluster)[(namespace, "migrated")]
            assert [len(ids) for ids in held.values()] == [1] and RESOURCE in held
        else:
            assert node_resource(api, RESOURCE) == (0, 0)  # no device plugin advertises it
            assert claim_status is not None and claim_status.get("resourceClaimName")
            mappings = claim_status.get("requestMappings", [])
            assert [m["resourceName"] for m in mappings] == [RESOURCE]
            claim = api.get(
                path_for(R, "resourceclaims", namespace, claim_status["resourceClaimName"])
            )
            [result] = claim["status"]["allocation"]["devices"]["results"]
            assert result["driver"] == DRIVER
            assert result["device"] == PROFILE or result["device"].startswith(f"{PROFILE}-")
    finally:
        delete_pods(api, namespace, ["migrated"])
