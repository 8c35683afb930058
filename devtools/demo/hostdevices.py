"""The host-device part of ``dradriver demo``: /dev/kvm through a claim, in a real container.

A kubelet plugin of its own (driver :data:`DRIVER`) serves a host-device profile for
/dev/kvm shared by two pods (``share: 2``). One pod asks for it through a claim and its
container creates a VM (the probe's ``use kvm:/dev/kvm``); the same pod without the claim,
the host's /dev/kvm bind-mounted in by ``hostPath``, cannot open it: runc's device cgroup
lets a container open only the device nodes its spec names, and the claim is what names
/dev/kvm. Shown only on the real runtime and where the host has /dev/kvm.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.images import PROBE_IMAGE
from devtools.cluster.local import LocalCluster
from devtools.cluster.probe import Use, read_uses
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import node_slices, start_node_plugin
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for

DRIVER = "kvm.demo.dradriver.dev"
NAMESPACE = "dradriver-demo-kvm"
KVM = "/dev/kvm"


def has_kvm() -> bool:
    try:
        return stat.S_ISCHR(os.stat(KVM).st_mode)
    except OSError:
        return False


def _config() -> Obj:
    profile = {"name": "kvm", "nodes": [{"path": KVM}], "share": 2}
    return {"driverName": DRIVER, "sources": [{"host": profile}]}


def _pod(name: str, node: str, with_claim: bool) -> Obj:
    container: Obj = {
        "name": "main",
        "image": PROBE_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/probe", "use", f"kvm:{KVM}"],
    }
    spec: Obj = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": "Never",
        "containers": [container],
    }
    if with_claim:
        container["resources"] = {"claims": [{"name": "kvm"}]}
        spec["resourceClaims"] = [{"name": "kvm", "resourceClaimTemplateName": "kvm"}]
    else:
        container["volumeMounts"] = [{"name": "kvm", "mountPath": KVM}]
        spec["volumes"] = [{"name": "kvm", "hostPath": {"path": KVM, "type": "CharDevice"}}]
    return {"metadata": {"name": name}, "spec": spec}


def describe(use: Use) -> str:
    """What the container's use of /dev/kvm gave, in words."""
    for step in ("open", "api", "vm"):
        value = use.get(step)
        if value in errno.errorcode.values():
            what = {"open": f"open {use.path}", "api": "KVM_GET_API_VERSION", "vm": "KVM_CREATE_VM"}
            code = {name: number for number, name in errno.errorcode.items()}[value]
            return f"{what[step]}: {os.strerror(code)} ({value})"
    if use.get("vm") == "created":
        return f"opened {use.path}, KVM API version {use.get('api')}, VM created"
    return use.text()


def run_host_device_demo(
    cluster: LocalCluster, api: AdminAPI, say: Callable[[str], None], work: Path, timeout: float
) -> int:
    """Start the kvm plugin, run both pods, print what they did, clean up; 0 if as expected."""
    node = cluster.layout.node_name
    work.mkdir(parents=True, exist_ok=True)
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(_config()))
    device_class = path_for(RESOURCE_V1, "deviceclasses", name=DRIVER)
    api.delete(device_class)  # a leftover of an interrupted run
    expression = f'device.driver == "{DRIVER}"'
    api.create(
        path_for(RESOURCE_V1, "deviceclasses"),
        {
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        },
    )
    plugin = start_node_plugin(cluster, api, config, work, driver=DRIVER)
    try:
        say(f"host devices: {KVM} served by a profile shared by 2 pods (driver {DRIVER})")
        wait_until("the kvm device published", lambda: node_slices(api, node, DRIVER), timeout)
        api.delete_namespace(NAMESPACE, timeout)
        api.create_namespace(NAMESPACE)
        request = {"name": "kvm", "exactly": {"deviceClassName": DRIVER}}
        api.create(
            path_for(RESOURCE_V1, "resourceclaimtemplates", NAMESPACE),
            {"metadata": {"name": "kvm"}, "spec": {"spec": {"devices": {"requests": [request]}}}},
        )
        pods = {"with-claim": True, "without-claim": False}
        for name, with_claim in pods.items():
            api.create(path_for("v1", "pods", NAMESPACE), _pod(name, node, with_claim))
        say(
            "created pod with-claim (a claim for /dev/kvm) and pod without-claim "
            "(no claim; the host's /dev/kvm mounted in by hostPath)"
        )
        seen = {name: read_uses(api, NAMESPACE, name, "main", timeout)[0] for name in pods}
        for name, use in seen.items():
            say(f"{name}: {describe(use)}")
            print(f"      the container printed: {use.text()}", flush=True)
        api.delete_namespace(NAMESPACE, timeout)
        say("kvm pods deleted")
        ok = seen["with-claim"].get("vm") == "created" and seen["without-claim"].get("open") == (
            "EPERM"
        )
        return 0 if ok else 1
    finally:
        plugin.stop()
        for s in node_slices(api, node, DRIVER):
            api.delete(path_for(RESOURCE_V1, "resourceslices", name=s["metadata"]["name"]))
        api.delete(device_class)
        shutil.rmtree(work, ignore_errors=True)
