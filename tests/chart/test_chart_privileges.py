"""The node plugin's DaemonSet asks only for what its configuration uses: no ``privileged``
(unless opted in), capabilities from the config (MKNOD for mock devices, what hooks declare),
and only the host directories the configured parts read or write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.host.capabilities import NAMES
from kubeletplugin.privileges import missing
from tests.chart.test_chart import Obj, driver_config, failure, one, render, values

ROOT = "/var/lib/kubelet"
SHIM_DIRS = {f"{ROOT}/device-plugins", f"{ROOT}/pod-resources"}


def plugin_pod(helm: Path, tmp_path: Path, **plugin_values: Any) -> tuple[Obj, list[Obj]]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"kubeletPlugin": plugin_values}))
    docs = render(helm, "--values", str(path))
    return one(docs, "DaemonSet")["spec"]["template"]["spec"], docs


def config_with(**config: Any) -> dict[str, Any]:
    """A driver config: one static source without mock nodes, plus ``config``."""
    return {"sources": [{"static": {"devices": [{"count": 1}]}}], **config}


def mounts(pod: Obj) -> dict[str, Obj]:
    """mountPath -> the mount, with its volume's hostPath (if any) as ``hostPath``."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = {}
    for mount in pod["containers"][0]["volumeMounts"]:
        host = volumes[mount["name"]].get("hostPath")
        out[mount["mountPath"]] = {**mount, "hostPath": host}
    return out


def host_paths(pod: Obj) -> set[str]:
    return {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}


def security(pod: Obj) -> Obj:
    sc: Obj = pod["containers"][0]["securityContext"]
    return sc


def added(pod: Obj) -> set[str]:
    return set(security(pod).get("capabilities", {}).get("add", []))


def test_default_is_root_without_privileged_and_with_mknod_only(helm: Path) -> None:
    docs = render(helm)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert security(pod) == {
        "runAsUser": 0,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["MKNOD"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # The kubelet's plugin dirs and CDI (root-owned, written), the mock dir; nothing else.
    assert host_paths(pod) == {
        f"{ROOT}/plugins_registry",
        f"{ROOT}/plugins",
        "/var/run/cdi",
        "/var/lib/dradriver/mock-devices",
    }
    assert "terminationMessagePath" not in pod["containers"][0]
    assert not driver_config(docs).device_plugin.enabled


def test_shim_off_mounts_neither_device_plugins_nor_pod_resources(
    helm: Path, tmp_path: Path
) -> None:
    pod, _ = plugin_pod(helm, tmp_path, config=config_with(devicePlugin={"enabled": False}))
    assert not host_paths(pod) & SHIM_DIRS
    # No mock nodes to make: no capability at all, and no mock dir.
    assert security(pod)["capabilities"] == {"drop": ["ALL"]}
    assert "/var/lib/dradriver/mock-devices" not in host_paths(pod)


def test_shim_on_mounts_device_plugins_and_pod_resources_read_only(helm: Path) -> None:
    pod = one(render(helm, *values("shim-values.yaml")), "DaemonSet")["spec"]["template"]["spec"]
    found = mounts(pod)
    assert found[f"{ROOT}/device-plugins"]["hostPath"]["path"] == f"{ROOT}/device-plugins"
    assert not found[f"{ROOT}/device-plugins"].get("readOnly")
    assert found[f"{ROOT}/pod-resources"]["readOnly"] is True
    assert security(pod)["privileged"] is False


@pytest.mark.parametrize(
    ("extended_resources", "shim"), [("auto", True), ("devicePlugin", True), ("dra", False)]
)
def test_host_profiles_read_dev_read_only_and_need_the_shim_only_off_the_dra_path(
    helm: Path, tmp_path: Path, extended_resources: str, shim: bool
) -> None:
    profile = {"name": "kvm", "nodes": [{"path": "/dev/kvm"}], "extendedResourceName": "x.io/kvm"}
    config = {"sources": [{"host": profile}], "extendedResources": extended_resources}
    pod, _ = plugin_pod(helm, tmp_path, config=config)
    dev = mounts(pod)["/dev"]
    assert dev["readOnly"] is True
    assert dev["hostPath"] == {"path": "/dev", "type": "Directory"}
    assert bool(host_paths(pod) & SHIM_DIRS) is shim
    # The runtime cannot make /dev/termination-log in the host's read-only /dev.
    assert pod["containers"][0]["terminationMessagePath"] == "/tmp/termination-log"
    assert security(pod)["capabilities"] == {"drop": ["ALL"]}, "reading /dev needs none"


def test_read_only_dirs_of_globs_and_sysfs_roots(helm: Path, tmp_path: Path) -> None:
    config = {
        "sources": [
            {"devglob": {"glob": "/dev/fake*"}},
            {"devglob": {"glob": "/opt/boards/dev[0-3]/node"}},
            {"devglob": {"glob": "/srv/exact/node0"}},
            {"pci": {"vendor": "0x10de"}},
            {"pci": {"vendor": "0x8086", "sysfsRoot": "/host/sys"}},
        ]
    }
    pod, _ = plugin_pod(helm, tmp_path, config=config)
    read_only = {path for path, m in mounts(pod).items() if m.get("readOnly")}
    assert read_only == {"/dev", "/opt/boards", "/srv/exact", "/host/sys", "/etc/dradriver"}
    assert "/sys" not in mounts(pod), "the runtime's own /sys is read-only and enough"


def test_hooks_get_the_capabilities_they_declare(helm: Path, tmp_path: Path) -> None:
    hooks = {
        "setup": {"command": ["/usr/local/bin/make-vf"], "capabilities": ["NET_ADMIN"]},
        "teardown": {"command": ["/usr/local/bin/drop-vf"], "capabilities": ["NET_ADMIN"]},
    }
    pod, docs = plugin_pod(helm, tmp_path, config=config_with(hooks=hooks))
    assert security(pod)["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert security(pod)["allowPrivilegeEscalation"] is False
    # What the chart grants is what the plugin checks at start-up.
    assert missing(driver_config(docs), frozenset(added(pod))) == []
    assert missing(driver_config(docs), frozenset()) == [
        "hooks.setup.capabilities: NET_ADMIN",
        "hooks.teardown.capabilities: NET_ADMIN",
    ]


def test_sys_admin_keeps_privilege_escalation_unset_as_the_api_requires(
    helm: Path, tmp_path: Path
) -> None:
    # The API refuses allowPrivilegeEscalation: false together with SYS_ADMIN.
    config = config_with(
        devicePlugin={
            "enabled": True,
            "resources": [{"resourceName": "x.io/loop"}],
            "preStart": {"command": ["/bin/attach"], "capabilities": ["SYS_ADMIN"]},
        }
    )
    pod, _ = plugin_pod(helm, tmp_path, config=config, extraCapabilities=["SYS_PTRACE"])
    assert added(pod) == {"SYS_ADMIN", "SYS_PTRACE"}
    assert "allowPrivilegeEscalation" not in security(pod)


def test_privileged_is_an_explicit_opt_in(helm: Path, tmp_path: Path) -> None:
    pod, _ = plugin_pod(helm, tmp_path, privileged=True)
    assert security(pod) == {"runAsUser": 0, "privileged": True}


def test_schema_takes_capabilities_as_kubernetes_writes_them(helm: Path, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"kubeletPlugin": {"extraCapabilities": ["CAP_NET_ADMIN"]}}))
    assert "extraCapabilities" in failure(helm, "--values", str(path))
    assert "NET_ADMIN" in NAMES
