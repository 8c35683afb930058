"""``dradriver demo``: the local cluster end to end, printed as a timeline."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.cluster import example
from dradriver.cluster.api import AdminAPI, path_for
from dradriver.cluster.config import Layout
from dradriver.cluster.local import running_cluster
from dradriver.kube.paths import RESOURCE_V1

NAMESPACE = "dradriver-demo"
CLASS = f"example.{DEFAULT_DRIVER_NAME}"


@dataclass
class Timeline:
    start: float = field(default_factory=time.monotonic)

    def say(self, text: str) -> None:
        print(f"{time.monotonic() - self.start:7.2f}s  {text}", flush=True)


def _pod_events(api: AdminAPI, pod: str) -> list[dict[str, str]]:
    return api.items(
        path_for("v1", "events", NAMESPACE),
        fieldSelector=f"involvedObject.kind=Pod,involvedObject.name={pod}",
    )


def run_demo(layout: Layout, gates: dict[str, bool], timeout: float = 90) -> int:
    timeline = Timeline()
    print("dradriver demo: a real Kubernetes 1.36 cluster on this machine", flush=True)
    with running_cluster(layout, gates) as (cluster, state, started):
        how = "started" if started else "reused running"
        timeline.say(f"cluster {how}: node {state.node_name} Ready, kubeconfig {state.kubeconfig}")
        with cluster.api() as api:
            return _scenario(api, timeline, state.node_name, timeout)


def _scenario(api: AdminAPI, timeline: Timeline, node: str, timeout: float) -> int:
    api.delete(path_for("v1", "namespaces", name=NAMESPACE))
    while api.get_or_none(path_for("v1", "namespaces", name=NAMESPACE)):
        time.sleep(0.2)
    api.create_namespace(NAMESPACE)
    api.delete(path_for(RESOURCE_V1, "deviceclasses", name=CLASS))
    api.create(path_for(RESOURCE_V1, "deviceclasses"), example.device_class(CLASS))
    slice_obj = example.node_slice(node, devices=4)
    api.delete(path_for(RESOURCE_V1, "resourceslices", name=slice_obj["metadata"]["name"]))
    api.create(path_for(RESOURCE_V1, "resourceslices"), slice_obj)
    timeline.say(f"DeviceClass {CLASS} and a ResourceSlice with 4 devices on {node} created")
    api.create(
        path_for(RESOURCE_V1, "resourceclaimtemplates", NAMESPACE),
        example.claim_template("one-device", NAMESPACE, CLASS),
    )
    api.create(
        path_for("v1", "pods", NAMESPACE),
        example.pod_with_template("demo", NAMESPACE, "one-device"),
    )
    timeline.say(f"Pod {NAMESPACE}/demo created, asking for one device via template one-device")

    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = api.get(path_for("v1", "pods", NAMESPACE, "demo"))
        claim_name = example.pod_claim_name(pod)
        if claim_name and "claim" not in seen:
            seen.add("claim")
            timeline.say(f"ResourceClaim {NAMESPACE}/{claim_name} created from the template")
        claim = (
            api.get_or_none(path_for(RESOURCE_V1, "resourceclaims", NAMESPACE, claim_name))
            if claim_name
            else None
        )
        devices = example.allocated_devices(claim) if claim else []
        if devices and "allocated" not in seen:
            seen.add("allocated")
            text = ", ".join(f"{dev} (pool {pool}, driver {drv})" for drv, pool, dev in devices)
            timeline.say(f"claim allocated by the scheduler: {text}")
        bound = pod.get("spec", {}).get("nodeName")
        if bound and "bound" not in seen:
            seen.add("bound")
            timeline.say(f"pod scheduled to {bound}")
        for event in _pod_events(api, "demo"):
            if event.get("reason") == "FailedPrepareDynamicResources":
                timeline.say(f"kubelet on {bound} waits for the driver: {event.get('message')}")
                timeline.say("next: the dradriver kubelet plugin registers and prepares it")
                _cleanup(api, slice_obj["metadata"]["name"])
                return 0
        time.sleep(0.2)
    print(f"demo: timed out after {timeout:.0f}s; saw {sorted(seen)}", file=sys.stderr)
    _cleanup(api, slice_obj["metadata"]["name"])
    return 1


def _cleanup(api: AdminAPI, slice_name: str) -> None:
    api.delete(path_for("v1", "namespaces", name=NAMESPACE))
    api.delete(path_for(RESOURCE_V1, "resourceslices", name=slice_name))
    api.delete(path_for(RESOURCE_V1, "deviceclasses", name=CLASS))
