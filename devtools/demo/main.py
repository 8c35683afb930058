"""``dradriver demo``: the driver on a real local cluster, printed as a timeline.

It starts (or reuses) the local cluster, runs dradriver's kubelet plugin for
node-1 with four mock devices, and creates three pods: one with its own claim
(from a template) and two sharing one claim, plus one asking for the device
plugin's extended resource. For every pod it prints when its claim was
allocated, prepared and the pod started, then what each container got: on the
real runtime (the default) what the container itself printed (``ls -l`` of its
device nodes and its ``DRADRIVER_*`` env, read through the pod log API), on the
fake one what the CDI specs the plugin wrote would give it. Then it deletes the
pods, showing the devices being released. Then dradriver-controller joins
(:mod:`devtools.demo.controller`): an immediate claim, a network-attached device
with its binding condition, and ``dradriver explain`` of a claim that cannot be
allocated. On the real runtime, where the host has /dev/kvm, a pod then asks for
/dev/kvm through a claim and creates a VM, while the same pod without the claim
cannot open it (:mod:`devtools.demo.hostdevices`). Finally it stops what it started.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.config import Layout
from devtools.cluster.images import PROBE_IMAGE
from devtools.cluster.kubeletstate import device_plugin_devices, kubelet_cdi_ids
from devtools.cluster.local import LocalCluster, running_cluster
from devtools.cluster.wait import wait_until
from devtools.demo.controller import run_controller_demo
from devtools.demo.hostdevices import has_kvm, run_host_device_demo
from devtools.harness.nodeplugin import (
    NodePlugin,
    start_node_plugin,
    wait_for_slices,
)
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.host.cdi import CDIRegistry
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for

NAMESPACE = "dradriver-demo"
LEGACY_RESOURCE = "dradriver.dev/mock"
DRIVER = DEFAULT_DRIVER_NAME
PAUSE = "registry.k8s.io/pause:3.10"
# On the real runtime each container shows what it got, then idles until stopped.
END = "--- end of report"
REPORT = f'ls -l /dev/dradriver; env | grep ^DRADRIVER_ | sort; echo "{END}"; exec probe pause'


@dataclass
class Timeline:
    start: float = field(default_factory=time.monotonic)

    def say(self, text: str) -> None:
        print(f"{time.monotonic() - self.start:7.2f}s  {text}", flush=True)


def _container(name: str, real: bool, resources: Obj) -> Obj:
    if not real:
        return {"name": name, "image": PAUSE, "resources": resources}
    return {
        "name": name,
        "image": PROBE_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", REPORT],
        "resources": resources,
    }


def _pod(name: str, claim_ref: Obj, containers: list[str], node: str, real: bool) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            # On a reused multi-node cluster, stay where the demo's plugin runs.
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "dev", **claim_ref}],
            "containers": [_container(c, real, {"claims": [{"name": "dev"}]}) for c in containers],
        },
    }


def _one_device_spec() -> Obj:
    return {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": DRIVER}}]}}


def run_demo(
    layout: Layout,
    gates: dict[str, bool],
    kube_version: str | None = None,
    timeout: float = 120,
) -> int:
    timeline = Timeline()
    with running_cluster(layout, gates, kube_version) as (cluster, state, started):
        print(
            f"dradriver demo: the DRA driver on a real Kubernetes {state.kube_version} cluster",
            flush=True,
        )
        how = "started" if started else "reused the running"
        timeline.say(f"{how} cluster: node {state.node_name} Ready")
        work = Path(tempfile.mkdtemp(prefix="dradriver-demo-"))
        try:
            with cluster.api() as api:
                code = _scenario(cluster, api, timeline, work, timeout)
                if code == 0 and cluster.layout.node(1).runtime == "real" and has_kvm():
                    print("\nHost devices: /dev/kvm through a claim\n", flush=True)
                    code = run_host_device_demo(cluster, api, timeline.say, work / "host", timeout)
                return code
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _scenario(
    cluster: LocalCluster, api: AdminAPI, timeline: Timeline, work: Path, timeout: float
) -> int:
    node = cluster.layout.node_name
    config = work / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "driverName": DRIVER,
                "sources": [
                    {
                        "static": {
                            "mockDir": str(work / "mock"),
                            "devices": [
                                {
                                    "namePrefix": "dev",
                                    "count": 4,
                                    "attributes": {"model": "mock-accelerator"},
                                    "capacity": {"memory": "16Gi"},
                                }
                            ],
                        }
                    }
                ],
                # dev-3 is served the classic way, as the extended resource below.
                "devicePlugin": {
                    "enabled": True,
                    "mode": "partitioned",
                    "resources": [
                        {"resourceName": LEGACY_RESOURCE, "devices": {"names": ["dev-3"]}}
                    ],
                },
            }
        )
    )
    plugin = start_node_plugin(cluster, api, config, work)
    try:
        timeline.say(f"dradriver-kubeletplugin registered with the kubelet on {node}")
        wait_for_slices(api, node, DRIVER, 3)
        timeline.say(f"ResourceSlice published: pool {node}, devices dev-0..dev-2 (DRA)")

        def legacy_allocatable() -> bool:
            node_obj = api.get(path_for("v1", "nodes", name=node))
            return bool(node_obj["status"].get("allocatable", {}).get(LEGACY_RESOURCE) == "1")

        wait_until(f"{LEGACY_RESOURCE} in the node's allocatable", legacy_allocatable, 60)
        timeline.say(f"device plugin registered: {node} allocatable {LEGACY_RESOURCE}: 1 (dev-3)")
        code = _workloads(cluster, api, plugin, timeline, timeout)
        if code != 0:
            return code
        print("\nThe control plane: dradriver-controller\n", flush=True)
        return run_controller_demo(cluster, api, plugin, timeline.say, timeout)
    finally:
        plugin.stop()
        timeline.say("plugin stopped")


def _workloads(
    cluster: LocalCluster, api: AdminAPI, plugin: NodePlugin, timeline: Timeline, timeout: float
) -> int:
    node = cluster.layout.node_name
    real = cluster.layout.node(1).runtime == "real"
    api.delete_namespace(NAMESPACE, timeout)  # a leftover of an interrupted run
    api.create_namespace(NAMESPACE)
    api.create(
        path_for(RESOURCE_V1, "resourceclaimtemplates", NAMESPACE),
        {"metadata": {"name": "one-device"}, "spec": {"spec": _one_device_spec()}},
    )
    api.create(
        path_for(RESOURCE_V1, "resourceclaims", NAMESPACE),
        {"metadata": {"name": "shared"}, "spec": _one_device_spec()},
    )
    pods = {
        "solo": _pod(
            "solo", {"resourceClaimTemplateName": "one-device"}, ["main", "sidecar"], node, real
        ),
        "shared-a": _pod("shared-a", {"resourceClaimName": "shared"}, ["main"], node, real),
        "shared-b": _pod("shared-b", {"resourceClaimName": "shared"}, ["main"], node, real),
    }
    for pod in pods.values():
        api.create(path_for("v1", "pods", NAMESPACE), pod)
    legacy_limits = {"limits": {LEGACY_RESOURCE: "1"}}
    api.create(
        path_for("v1", "pods", NAMESPACE),
        {
            "metadata": {"name": "legacy"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "terminationGracePeriodSeconds": 0,
                "containers": [_container("main", real, legacy_limits)],
            },
        },
    )
    timeline.say(
        "created pod solo (own claim from template one-device, 2 containers), pods "
        "shared-a, shared-b (one ResourceClaim 'shared') and pod legacy "
        f"(limits {LEGACY_RESOURCE}: 1, no claim)"
    )

    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    claims: dict[str, Obj] = {}
    while len(seen) < 3 * len(pods) and time.monotonic() < deadline:
        for name in pods:
            pod = api.get(path_for("v1", "pods", NAMESPACE, name))
            claim = _claim_of(api, pod)
            if claim is None:
                continue
            claims[name] = claim
            results = (
                (claim.get("status", {}).get("allocation") or {})
                .get("devices", {})
                .get("results", [])
            )
            if results and f"{name}/allocated" not in seen:
                seen.add(f"{name}/allocated")
                devices = ", ".join(r["device"] for r in results)
                timeline.say(f"{name}: claim {claim['metadata']['name']} allocated {devices}")
            uid = claim["metadata"]["uid"]
            if kubelet_cdi_ids(cluster.layout.kubelet_root, uid, DRIVER) and (
                f"{name}/prepared" not in seen
            ):
                seen.add(f"{name}/prepared")
                timeline.say(f"{name}: prepared by the plugin (CDI spec written)")
            if pod.get("status", {}).get("phase") == "Running" and f"{name}/running" not in seen:
                seen.add(f"{name}/running")
                timeline.say(f"{name}: Running")
        time.sleep(0.1)
    if len(seen) < 3 * len(pods):
        print(f"demo: timed out; saw {sorted(seen)}", file=sys.stderr)
        return 1

    def legacy_running() -> Obj | None:
        pod = api.get(path_for("v1", "pods", NAMESPACE, "legacy"))
        return pod if pod.get("status", {}).get("phase") == "Running" else None

    legacy = wait_until("pod legacy Running", legacy_running, timeout)
    held = device_plugin_devices(
        cluster.layout.kubelet_root, legacy["metadata"]["uid"], LEGACY_RESOURCE
    )
    timeline.say(
        f"legacy: Running with {LEGACY_RESOURCE} device {', '.join(held)} "
        "(device-plugin API, same node, same ledger)"
    )

    registry = CDIRegistry(plugin.cdi_dir, DRIVER)
    if real:
        print("\nWhat each container printed (its log, read through the pod log API):")
        for name, pod in [*pods.items(), ("legacy", legacy)]:
            for container in pod["spec"]["containers"]:
                text = wait_until(
                    f"the report of {name}/{container['name']}",
                    partial(_report, api, name, container["name"]),
                    timeout,
                    ignore=(KubeAPIError,),
                )
                print(f"  {name}/{container['name']}:")
                print("\n".join(f"      {line}" for line in text.splitlines()))
    else:
        # The fake runtime runs nothing: show what the specs would give.
        print("\nWhat each container gets (CDI edits resolved from the specs on disk):")
        for name, pod in pods.items():
            uid = claims[name]["metadata"]["uid"]
            ids = kubelet_cdi_ids(cluster.layout.kubelet_root, uid, DRIVER)
            edits = registry.resolve_many(ids)
            for container in pod["spec"]["containers"]:
                nodes = ", ".join(f"{d.path} (host {d.host_path})" for d in edits.device_nodes)
                env = " ".join(f"{k}={v}" for k, v in sorted(edits.env.items()))
                print(f"  {name}/{container['name']}: devices {nodes}\n      env {env}")
    print()

    api.delete(path_for("v1", "namespaces", name=NAMESPACE))
    wait_until("pods and claims released", lambda: not registry.claim_uids_on_disk(), timeout)
    timeline.say("pods deleted: claims unprepared, CDI specs removed, devices free again")
    wait_until(
        "demo namespace gone",
        lambda: api.get_or_none(path_for("v1", "namespaces", name=NAMESPACE)) is None,
        timeout,
    )
    return 0


def _report(api: AdminAPI, pod: str, container: str) -> str | None:
    """What the container printed before the end marker, once it has printed it all."""
    text = api.pod_log(NAMESPACE, pod, container)
    head, sep, _ = text.partition(END)
    return head.rstrip("\n") if sep else None


def _claim_of(api: AdminAPI, pod: Obj) -> Obj | None:
    ref = pod["spec"]["resourceClaims"][0]
    name = ref.get("resourceClaimName")
    for status in pod.get("status", {}).get("resourceClaimStatuses", []):
        name = status.get("resourceClaimName") or name
    if not name:
        return None
    return api.get_or_none(path_for(RESOURCE_V1, "resourceclaims", NAMESPACE, name))
