"""Network-attached devices: a NetworkDevicePool, slices that span nodes, binding conditions.

Real scheduler (binding conditions on by default in 1.36), real kubelets on two nodes,
dradriver-controller attaching with the simulated backend, and the node plugin on the
chosen node preparing the attached device.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.gates import apiserver_gates, why_off
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.controller import ControllerProcess, namespaced_controller
from devtools.harness.nodeplugin import NodePlugin, start_node_plugin
from dradriver.api import networkpool as net
from dradriver.api.wellknown import ALLOCATION_ANNOTATION
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1 as R
from dradriver.k8s.paths import path_for

DRIVER = "dradriver.dev"
POOLS = f"{DRIVER}/{net.VERSION}"
DEADLINE = 90
ATTACHED = net.attached_condition(DRIVER)
FAILED = net.attach_failed_condition(DRIVER)


@pytest.fixture(scope="module")
def plugins(local_cluster: LocalCluster) -> Iterator[dict[str, NodePlugin]]:
    """dradriver's node plugin on both nodes (one local device each, unused here)."""
    if local_cluster.layout.nodes < 2:
        pytest.fail("network pool tests need DRADRIVER_NODES >= 2 (the default)")
    started: dict[str, NodePlugin] = {}
    try:
        with local_cluster.api() as api:
            for node in ("node-1", "node-2"):
                work = Path(f"/tmp/dradriver-test-np-{node}")
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(mode=0o700)
                config = work / "config.yaml"
                static = {
                    "mockDir": str(work / "mock"),
                    "devices": [{"name": "local-0", "attributes": {"kind": "np-local"}}],
                }
                config.write_text(
                    yaml.safe_dump({"driverName": DRIVER, "sources": [{"static": static}]})
                )
                started[node] = start_node_plugin(local_cluster, api, config, work, node=node)
        yield started
    finally:
        for plugin in started.values():
            plugin.stop()


@pytest.fixture
def controller(
    api: AdminAPI, local_cluster: LocalCluster, namespace: str
) -> Iterator[ControllerProcess]:
    with namespaced_controller(api, local_cluster, namespace, "np") as proc:
        yield proc


class Fabric:
    """One NetworkDevicePool reachable from node-2 only, and a DeviceClass for it."""

    def __init__(
        self,
        api: AdminAPI,
        namespace: str,
        fail: list[str] | None = None,
        devices: int = 1,
        cooldown: float = 0,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = f"np-{uuid.uuid4().hex[:8]}"
        self.fail = fail or []
        self.devices = devices
        self.cooldown = cooldown

    def spec(self) -> Obj:
        return {
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-2"]}
                        ]
                    }
                ]
            },
            "attach": {
                "backend": "simulated",
                "simulated": {"latencySeconds": 0.5, "failDevices": self.fail},
                "failureCooldownSeconds": self.cooldown,
            },
            "devices": [
                {
                    "name": f"nic-{i}",
                    "attributes": {"kind": {"string": self.name}},
                    "env": {"FABRIC_PORT": str(7 + i)},
                }
                for i in range(self.devices)
            ],
        }

    def __enter__(self) -> Fabric:
        self.api.create(
            path_for(POOLS, net.PLURAL),
            {
                "apiVersion": POOLS,
                "kind": net.KIND,
                "metadata": {"name": self.name},
                "spec": self.spec(),
            },
        )
        self.api.create(
            path_for(R, "deviceclasses"),
            {
                "metadata": {"name": self.name},
                "spec": {
                    "selectors": [
                        {
                            "cel": {
                                "expression": f'device.driver == "{DRIVER}" && '
                                f'device.attributes["{DRIVER}"].kind == "{self.name}"'
                            }
                        }
                    ]
                },
            },
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.delete(path_for(R, "deviceclasses", name=self.name))
        if self.pool() is not None:
            # A test that failed half-way: drop the pool even without a controller to
            # release its detach finalizer, so its slices cannot leak into later tests.
            path = path_for(POOLS, net.PLURAL, name=self.name)
            self.api.merge_patch(path, {"metadata": {"finalizers": None}})
            self.api.delete(path)

    def pool(self) -> Obj | None:
        return self.api.get_or_none(path_for(POOLS, net.PLURAL, name=self.name))

    def slices(self) -> list[Obj]:
        return [
            s
            for s in self.api.items(path_for(R, "resourceslices"))
            if s["spec"]["pool"]["name"] == net.pool_name(self.name)
        ]

    def attachments(self) -> list[Obj]:
        return list(((self.pool() or {}).get("status") or {}).get("attachments") or [])

    def claim_template(self) -> None:
        self.api.create(
            path_for(R, "resourceclaimtemplates", self.namespace),
            {
                "metadata": {"name": "nic"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [{"name": "nic", "exactly": {"deviceClassName": self.name}}]
                        }
                    }
                },
            },
        )

    def pod(self, name: str, claim: Obj) -> Obj:
        return self.api.create(
            path_for("v1", "pods", self.namespace),
            {
                "metadata": {"name": name},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "nic", **claim}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "nic"}]},
                        }
                    ],
                },
            },
        )

    def get_pod(self, name: str) -> Obj:
        return self.api.get(path_for("v1", "pods", self.namespace, name))

    def running_pod(self, name: str) -> Obj | None:
        pod = self.get_pod(name)
        return pod if running(pod) else None

    def published(self) -> Obj | None:
        pool = self.pool() or {}
        conditions = (pool.get("status") or {}).get("conditions") or []
        ok = any(c["type"] == "Published" and c["status"] == "True" for c in conditions)
        return pool if ok else None

    def claims(self) -> list[Obj]:
        return self.api.items(path_for(R, "resourceclaims", self.namespace))

    def events(self, kind: str, name: str) -> list[Obj]:
        return self.api.items(
            path_for("v1", "events", self.namespace),
            fieldSelector=f"involvedObject.kind={kind},involvedObject.name={name}",
        )

    def finish(self, pod: str) -> None:
        """Delete the pod; its claim's device is detached; then the pool goes."""
        self.api.request(
            "DELETE", path_for("v1", "pods", self.namespace, pod), {"gracePeriodSeconds": 0}
        )
        wait_until("detached after the pod is gone", lambda: not self.attachments(), DEADLINE)
        self.delete_pool()

    def delete_pool(self) -> None:
        self.api.delete(path_for(POOLS, net.PLURAL, name=self.name))
        wait_until(
            "pool and its slices gone", lambda: not self.pool() and not self.slices(), DEADLINE
        )


def device_entry(claim: Obj, device: str) -> Obj | None:
    return net.device_status(claim, DRIVER, "network/" + claim_pool(claim), device)


def claim_pool(claim: Obj) -> str:
    results = (
        ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
    )
    return str(results[0]["pool"]).removeprefix("network/") if results else ""


def running(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def test_pool_is_published_as_slices_spanning_nodes(
    api: AdminAPI, namespace: str, controller: ControllerProcess
) -> None:
    with Fabric(api, namespace) as fabric:
        [slice_] = wait_until("network slice published", fabric.slices, DEADLINE)
        spec = slice_["spec"]
        assert "nodeName" not in spec
        assert spec["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
            "node-2"
        ]
        assert spec["pool"]["name"] == f"network/{fabric.name}"
        [device] = spec["devices"]
        assert device["bindsToNode"] is True
        assert device["bindingConditions"] == [ATTACHED]
        assert device["bindingFailureConditions"] == [FAILED]
        pool = wait_until("Published condition", fabric.published, DEADLINE)
        assert net.FINALIZER in pool["metadata"]["finalizers"]
        fabric.delete_pool()


@pytest.mark.compat("network")
def test_pod_waits_until_attached_then_runs_on_the_chosen_node(
    api: AdminAPI,
    namespace: str,
    controller: ControllerProcess,
    plugins: dict[str, NodePlugin],
) -> None:
    # Without binding conditions the scheduler cannot hold the pod until the attach.
    off = why_off(
        apiserver_gates(api), "DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus"
    )
    if off:
        pytest.skip(f"needs binding conditions: {off}")
    with Fabric(api, namespace) as fabric:
        wait_until("network slice published", fabric.slices, DEADLINE)
        fabric.claim_template()
        fabric.pod("user", {"resourceClaimTemplateName": "nic"})
        pod = wait_until("pod running", lambda: fabric.running_pod("user"), DEADLINE)
        assert pod["spec"]["nodeName"] == "node-2"  # the only node that reaches the pool
        # The scheduler held the pod for the binding condition, and says so.
        reasons = {e["reason"] for e in fabric.events("Pod", "user")}
        assert "BindingConditionsPending" in reasons, reasons
        [claim] = fabric.claims()
        entry = net.device_status(claim, DRIVER, f"network/{fabric.name}", "nic-0")
        assert entry is not None and net.condition_true(entry, ATTACHED)
        assert not net.condition_true(entry, FAILED)
        assert entry["data"]["node"] == "node-2"
        [attachment] = fabric.attachments()
        assert (attachment["device"], attachment["node"]) == ("nic-0", "node-2")
        assert attachment["claimUID"] == claim["metadata"]["uid"]
        # The node plugin on node-2 prepared it: the CDI spec carries the pool's env.
        specs = [p.read_text() for p in plugins["node-2"].cdi_dir.glob("*.json")]
        specs += [p.read_text() for p in plugins["node-2"].cdi_dir.glob("*.yaml")]
        assert any("DRADRIVER_NETWORK_DEVICE=nic-0" in s and "FABRIC_PORT=7" in s for s in specs)

        fabric.finish("user")


def test_attach_failure_sends_the_pod_back_to_scheduling(
    api: AdminAPI,
    namespace: str,
    controller: ControllerProcess,
    plugins: dict[str, NodePlugin],
) -> None:
    with Fabric(api, namespace, fail=["nic-0"]) as fabric:
        wait_until("network slice published", fabric.slices, DEADLINE)
        fabric.claim_template()
        fabric.pod("user", {"resourceClaimTemplateName": "nic"})

        def failure_reported() -> list[Obj]:
            return [e for e in fabric.events("Pod", "user") if e["reason"] == "AttachFailed"]

        [event] = wait_until("AttachFailed event on the pod", failure_reported, DEADLINE)[:1]
        assert "simulated attach failure" in event["message"] and "nic-0" in event["message"]

        allocations: set[str | None] = set()

        def sent_back() -> bool:
            # The scheduler gave up the binding and freed the claim for another attempt:
            # seen as a moment without allocation or as a second, newer allocation.
            for c in fabric.claims():
                allocation = (c.get("status") or {}).get("allocation")
                allocations.add(allocation.get("allocationTimestamp") if allocation else None)
            return None in allocations or len(allocations) > 1

        wait_until("claim given up and retried by the scheduler", sent_back, DEADLINE)
        assert not fabric.get_pod("user")["spec"].get("nodeName")
        assert not fabric.attachments()

        # The fabric recovers: the next scheduling attempt attaches and the pod runs.
        pool = fabric.pool()
        assert pool is not None
        fabric.fail = []
        api.merge_patch(path_for(POOLS, net.PLURAL, name=fabric.name), {"spec": fabric.spec()})
        wait_until("pod running", lambda: running(fabric.get_pod("user")), DEADLINE * 2)
        fabric.finish("user")


def test_failed_device_is_tainted_so_the_pod_gets_another(
    api: AdminAPI,
    namespace: str,
    controller: ControllerProcess,
    plugins: dict[str, NodePlugin],
) -> None:
    with Fabric(api, namespace, fail=["nic-0"], devices=2, cooldown=60) as fabric:
        wait_until("network slice published", fabric.slices, DEADLINE)
        fabric.claim_template()
        fabric.pod("user", {"resourceClaimTemplateName": "nic"})  # first fit: nic-0

        def tainted() -> list[Obj]:
            [slice_] = fabric.slices()
            return [d for d in slice_["spec"]["devices"] if d.get("taints")]

        [device] = wait_until("nic-0 tainted after its attach failed", tainted, DEADLINE)
        assert device["name"] == "nic-0"
        assert device["taints"][0]["key"] == f"{DRIVER}/attach-failed"
        assert device["taints"][0]["effect"] == "NoSchedule"
        wait_until("pod running", lambda: fabric.running_pod("user"), DEADLINE)
        [claim] = fabric.claims()
        assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == [
            "nic-1"
        ]
        reasons = [e["reason"] for e in fabric.events("Pod", "user")]
        assert "AttachFailed" in reasons
        fabric.finish("user")


def test_controller_allocated_network_claim_is_attached_before_any_pod(
    api: AdminAPI,
    namespace: str,
    controller: ControllerProcess,
    plugins: dict[str, NodePlugin],
) -> None:
    with Fabric(api, namespace) as fabric:
        wait_until("network slice published", fabric.slices, DEADLINE)
        api.create(
            path_for(R, "resourceclaims", namespace),
            {
                "metadata": {"name": "early", "annotations": {ALLOCATION_ANNOTATION: "Immediate"}},
                "spec": {
                    "devices": {
                        "requests": [{"name": "nic", "exactly": {"deviceClassName": fabric.name}}]
                    }
                },
            },
        )

        def attached() -> Obj | None:
            claim = api.get(path_for(R, "resourceclaims", namespace, "early"))
            entry = net.device_status(claim, DRIVER, f"network/{fabric.name}", "nic-0")
            return claim if net.condition_true(entry, ATTACHED) else None

        claim = wait_until("immediate claim attached", attached, DEADLINE)
        node = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][
            0
        ]
        assert node["values"] == ["node-2"]
        fabric.pod("user", {"resourceClaimName": "early"})
        pod = wait_until("pod running", lambda: fabric.running_pod("user"), DEADLINE)
        assert pod["spec"]["nodeName"] == "node-2"
        api.request("DELETE", path_for("v1", "pods", namespace, "user"), {"gracePeriodSeconds": 0})
        wait_until("pod gone", lambda: not api.items(path_for("v1", "pods", namespace)), DEADLINE)
        api.delete(path_for(R, "resourceclaims", namespace, "early"))
        wait_until("detached after the claim is gone", lambda: not fabric.attachments(), DEADLINE)
        fabric.delete_pool()
