"""The CDI specs dradriver writes, loaded and injected by containerd 2.4.2's own CDI library.

No cluster: the node driver prepares claims (the apiserver is the in-memory fake, it only
hands over allocated claims) and the device-plugin shim allocates, both writing into one
CDI directory through their real code paths; then ``cdicheck`` (built from
runtimebin/containerd, i.e. tags.cncf.io/container-device-interface at the version
containerd v2.4.2 requires) loads that directory into a CDI cache and injects every device
into a container spec, as containerd does at container creation.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from devtools.cluster.cdicheck import CheckReport, LinuxDevice, check_specs, run_checker
from dradriver.devices.config import parse_config
from dradriver.devices.sources import build_sources, discover_all
from dradriver.host.cdi import CDIDevice, CDIRegistry, host_device_node_problem
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.host.state.ledger import Ledger
from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.plugin.interface import ClaimRef
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.legacy.shim import DevicePluginShim
from kubeletplugin.nodedriver import NodeDriver
from tests.fakes.apiserver import FakeAPIServer

pytestmark = pytest.mark.skipif(
    shutil.which("go") is None,
    reason="the Go toolchain is not on PATH: the CDI checker "
    "(runtimebin/containerd/cmd/cdicheck) is built from the Go module proxy",
)

DRIVER = "dradriver.dev"
NODE = "node-1"
NAMESPACE = "team-a"
RESOURCE = "dradriver.dev/mock"
SHARE_A = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
SHARE_B = "b3f1c2d4-1111-4222-8333-944455556666"
SHARE_C = "c0ffee00-2222-4333-8444-a55566667777"


def config_text(root: Path) -> str:
    doc: Obj = {
        "driverName": DRIVER,
        "sources": [
            {
                "static": {
                    "mockDir": str(root / "mock"),
                    "devices": [
                        {"namePrefix": "dev", "count": 3},
                        {
                            "name": "data-0",
                            "edits": {
                                "mounts": [
                                    {
                                        "hostPath": str(root / "data"),
                                        "containerPath": "/data",
                                        "options": ["ro", "bind"],
                                    }
                                ]
                            },
                        },
                        {
                            "name": "shared-0",
                            "allowMultipleAllocations": True,
                            "capacity": {
                                "memory": {
                                    "value": "16Gi",
                                    "requestPolicy": {
                                        "default": "4Gi",
                                        "validRange": {"min": "1Gi"},
                                    },
                                }
                            },
                        },
                    ],
                }
            },
            {"static": {"devices": [{"namePrefix": "virt", "count": 2}]}},  # env only
            {"devglob": {"glob": str(root / "by-id" / "link*")}},
        ],
        "devicePlugin": {
            "enabled": True,
            "mode": "partitioned",
            "resources": [{"resourceName": RESOURCE, "devices": {"names": ["dev-2"]}}],
        },
    }
    return yaml.safe_dump(doc)


def result(device: str, request: str = "gpu", share_id: str | None = None) -> Obj:
    out: Obj = {"request": request, "driver": DRIVER, "pool": NODE, "device": device}
    if share_id:
        out["shareID"] = share_id
    return out


def put_claim(
    api: FakeAPIServer, name: str, uid: str, results: list[Obj], config: list[Obj] | None = None
) -> ClaimRef:
    devices: Obj = {"results": results}
    if config:
        devices["config"] = config
    api.put(
        path_for(RESOURCE_V1, "resourceclaims", NAMESPACE, name),
        {
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
            "status": {"allocation": {"devices": devices}},
        },
    )
    return ClaimRef(NAMESPACE, uid, name)


ENV_CONFIG = [
    {
        "source": "FromClaim",
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": f"{DRIVER}/v1alpha1",
                "kind": "DeviceConfig",
                "env": {"MODE": "turbo"},
            },
        },
    }
]

# name -> (uid, allocation results, opaque config): one spec shape each.
CLAIMS: dict[str, tuple[str, list[Obj], list[Obj] | None]] = {
    "mock-node": ("a1b2c3d4-0000-4000-8000-000000000001", [result("dev-0")], None),
    "config-env": ("a1b2c3d4-0000-4000-8000-000000000002", [result("dev-1")], ENV_CONFIG),
    "mount": ("a1b2c3d4-0000-4000-8000-000000000003", [result("data-0")], None),
    "two-shares": (
        "a1b2c3d4-0000-4000-8000-000000000004",
        [result("shared-0", "a", SHARE_A), result("shared-0", "b", SHARE_B)],
        None,
    ),
    "same-device": (
        "a1b2c3d4-0000-4000-8000-000000000005",
        [result("shared-0", "a", SHARE_C)],
        None,
    ),
    "env-only": ("a1b2c3d4-0000-4000-8000-000000000006", [result("virt-0")], None),
    "digit-uid": ("1f2e3d4c-0000-4000-8000-000000000007", [result("virt-1")], None),
    "symlinked-node": ("a1b2c3d4-0000-4000-8000-000000000008", [result("link0")], None),
}


def write_dradriver_specs(root: Path) -> tuple[Path, list[str]]:
    """Prepare every claim of CLAIMS and one device-plugin allocation; the CDI ids returned."""
    (root / "data").mkdir()
    (root / "hw").mkdir()
    (root / "by-id").mkdir()
    os.mknod(root / "hw" / "node0", stat.S_IFCHR | 0o666, os.makedev(1, 7))  # /dev/full's
    (root / "by-id" / "link0").symlink_to("../hw/node0")
    cdi_dir = root / "cdi"
    config = parse_config(config_text(root))
    sources = build_sources(config)
    inventory = NodeInventory(NODE, lambda: discover_all(sources))
    ledger = Ledger.load(root / "state" / "ledger.json")
    api = FakeAPIServer()
    driver = NodeDriver(
        client=cast(KubeClient, api),
        driver_name=DRIVER,
        inventory=inventory,
        ledger=ledger,
        cdi=CDIRegistry(cdi_dir, DRIVER, durable=False),
    )
    claims = [put_claim(api, name, *spec) for name, spec in CLAIMS.items()]
    prepared = asyncio.run(driver.prepare_claims(claims))
    assert {uid: r.error for uid, r in prepared.items() if r.error} == {}
    ids = [i for r in prepared.values() for d in r.devices for i in d.cdi_ids]
    shim = DevicePluginShim(
        config=config.device_plugin,
        driver_name=DRIVER,
        inventory=inventory,
        ledger=ledger,
        cdi_dir=cdi_dir,
        plugin_dir=root / "device-plugins",
    )
    ids += shim.allocate(RESOURCE, ["dev-2"]).cdi_ids
    return cdi_dir, ids


def injected(report: CheckReport, name: str, device: str) -> Any:
    uid = CLAIMS[name][0]
    return report.devices[f"{DRIVER}/device={uid}-{device}"]


def test_every_spec_dradriver_writes_is_accepted_by_containerds_cdi_library(
    tmp_path: Path,
) -> None:
    cdi_dir, ids = write_dradriver_specs(tmp_path)
    assert len(ids) == 10

    assert check_specs(cdi_dir) == []  # every device of every spec file
    report = run_checker([cdi_dir], ids)  # the ids handed to the kubelet, also all at once
    assert report.errors == []
    assert sorted(report.devices) == sorted(ids)
    assert len(report.specs) == len(CLAIMS) + 1  # one file per claim and per allocation

    mock = injected(report, "mock-node", "dev-0")
    # The type and numbers come from the host node: what runc creates in the container.
    assert mock.linux_devices == (LinuxDevice("/dev/dradriver/dev-0", "c", 1, 3),)
    assert "DRADRIVER_DEVICE_DEV_0=/dev/dradriver/dev-0" in mock.env
    assert f"DRADRIVER_CLAIM={NAMESPACE}/mock-node" in mock.env
    assert "MODE=turbo" in injected(report, "config-env", "dev-1").env
    data = injected(report, "mount", "data-0")
    assert [(m["destination"], m["source"], m["options"]) for m in data.mounts] == [
        ("/data", str(tmp_path / "data"), ["ro", "bind"])
    ]
    for name, share in (("two-shares", SHARE_A), ("two-shares", SHARE_B), ("same-device", SHARE_C)):
        shared = injected(report, name, f"shared-0-{share}")
        assert shared.linux_devices == (LinuxDevice("/dev/dradriver/shared-0", "c", 1, 3),)
    env_only = injected(report, "env-only", "virt-0")
    assert env_only.linux_devices == () and env_only.env == (
        f"DRADRIVER_CLAIM={NAMESPACE}/env-only",
    )
    linked = injected(report, "symlinked-node", "link0")
    assert linked.linux_devices == (LinuxDevice(str(tmp_path / "by-id" / "link0"), "c", 1, 7),)
    (plugin_id,) = [i for i in ids if i.startswith(f"{DRIVER}/deviceplugin=")]
    plugin = report.devices[plugin_id]
    assert plugin.linux_devices == (LinuxDevice("/dev/dradriver/dev-2", "c", 1, 3),)
    assert f"DRADRIVER_RESOURCE={RESOURCE}" in plugin.env

    versions = {
        path.name: yaml.safe_load(path.read_text())["cdiVersion"] for path in cdi_dir.iterdir()
    }
    # The oldest version that covers the content: env only with a letter-first name needs
    # nothing newer than 0.3.0; a name starting with a digit or a hostPath needs 0.5.0.
    assert versions[f"{DRIVER}-device_claim-{CLAIMS['env-only'][0]}.json"] == "0.3.0"
    assert versions[f"{DRIVER}-device_claim-{CLAIMS['digit-uid'][0]}.json"] == "0.5.0"
    assert set(versions.values()) == {"0.3.0", "0.5.0"}


def test_specs_a_runtime_rejects_are_reported_and_dradriver_refuses_the_same_nodes(
    tmp_path: Path,
) -> None:
    os.mknod(tmp_path / "char", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(tmp_path / "block", stat.S_IFBLK | 0o660, os.makedev(7, 0))
    (tmp_path / "file").write_text("what mockDir held before mock devices were nodes\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "char")
    host_paths = ["char", "block", "file", "dir", "link", "missing"]
    cdi_dir = tmp_path / "cdi"
    registry = CDIRegistry(cdi_dir, DRIVER, durable=False)
    ids = {}
    for index, name in enumerate(host_paths):
        node = DeviceNode(path="/dev/dradriver/x", host_path=str(tmp_path / name))
        uid = f"b0000000-0000-4000-8000-00000000000{index}"
        # write_claim itself does not look at the host: the prepare path checks first.
        ids[name] = registry.write_claim(
            uid, [CDIDevice("x", ContainerEdits(device_nodes=(node,)))]
        )["x"]
    (cdi_dir / "broken.json").write_text('{"cdiVersion": "0.3.0", "kind": "x.dev/y", "bogus": 1}')

    report = run_checker([cdi_dir], list(ids.values()))

    rejected_by_runtime = {name for name, cdi_id in ids.items() if cdi_id not in report.devices}
    assert rejected_by_runtime == {"file", "dir", "link", "missing"}
    refused_by_dradriver = {n for n in host_paths if host_device_node_problem(str(tmp_path / n))}
    assert refused_by_dradriver == rejected_by_runtime
    device_errors = {e.split(":")[0] for e in report.errors if e.startswith("device ")}
    assert device_errors == {f"device {ids[n]}" for n in rejected_by_runtime}
    missing = next(e for e in report.errors if e.startswith(f"device {ids['missing']}"))
    assert f'failed to stat CDI host device "{tmp_path / "missing"}": no such file' in missing
    assert any(
        e.startswith(f"spec {cdi_dir / 'broken.json'}: failed to load CDI Spec")
        for e in report.errors
    )
    assert report.devices[ids["block"]].linux_devices == (
        LinuxDevice("/dev/dradriver/x", "b", 7, 0),
    )
    assert check_specs(cdi_dir, [ids["char"]]) == [
        e for e in report.errors if e.startswith("spec ")
    ]  # a spec the cache cannot load is an error whatever devices are asked for
