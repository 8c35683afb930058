"""The local cluster runs the real Kubernetes release it was asked for, and its DRA path is live."""

from __future__ import annotations

import json
import subprocess

import pytest

from devtools.cluster.api import AdminAPI
from devtools.cluster.apply import FIELD_MANAGER, apply
from devtools.cluster.binaries import ensure_binaries
from devtools.cluster.config import NODE_NAME
from devtools.cluster.local import AlreadyRunning, LocalCluster
from devtools.cluster.wait import wait_until
from devtools.demo import example
from dradriver.k8s.paths import RESOURCE_V1, path_for

R = RESOURCE_V1
# Allows one kubelet retry after Node-authorizer lag (see local-cluster.md).
DEADLINE = 60


def test_components_are_real_and_running(local_cluster: LocalCluster) -> None:
    state = local_cluster.running()
    assert state is not None
    names = [c.name for c in state.components]
    extra = [n for n in state.nodes if n != "node-1"]
    node_1_runtime = "containerd" if state.runtime == "real" else "fakecri"
    assert names == [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        node_1_runtime,
        "kubelet",
        *(f"{kind}-{node}" for node in extra for kind in ("fakecri", "kubelet")),
    ]
    assert all(c.alive() for c in state.components)


def test_server_is_the_release_asked_for(api: AdminAPI, local_cluster: LocalCluster) -> None:
    version = api.get("/version")
    assert version["major"] == "1"
    assert version["gitVersion"] == local_cluster.kube_version
    kubelet = api.get(path_for("v1", "nodes", name=NODE_NAME))["status"]["nodeInfo"]
    assert kubelet["kubeletVersion"] == local_cluster.kube_version


def test_kubectl_of_the_same_release_reaches_the_cluster(local_cluster: LocalCluster) -> None:
    kubectl = ensure_binaries(local_cluster.kube_version)["kubectl"]
    out = subprocess.run(
        [
            str(kubectl),
            f"--kubeconfig={local_cluster.layout.admin_kubeconfig}",
            "version",
            "-o=json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    versions = json.loads(out)
    assert versions["clientVersion"]["gitVersion"] == local_cluster.kube_version
    assert versions["serverVersion"]["gitVersion"] == local_cluster.kube_version


def test_node_is_ready(api: AdminAPI) -> None:
    node = api.get(path_for("v1", "nodes", name=NODE_NAME))
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"


def test_resource_v1_is_served(api: AdminAPI) -> None:
    resources = {r["name"] for r in api.get("/apis/resource.k8s.io/v1")["resources"]}
    assert {
        "deviceclasses",
        "resourceclaims",
        "resourceclaims/status",
        "resourceclaimtemplates",
        "resourceslices",
    } <= resources


def test_apply_is_server_side_and_keeps_what_others_own(api: AdminAPI, namespace: str) -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "applied", "namespace": namespace},
        "data": {"a": "1", "b": "2"},
    }
    apply(api, doc)
    api.merge_patch(
        path_for("v1", "configmaps", namespace, "applied"),
        {"metadata": {"labels": {"owner": "someone-else"}}},
    )
    doc["data"] = {"a": "3"}
    applied = apply(api, doc)
    # "b" was ours and is no longer applied: gone; the label is another writer's: kept.
    assert applied["data"] == {"a": "3"}
    assert applied["metadata"]["labels"] == {"owner": "someone-else"}
    assert FIELD_MANAGER in {m["manager"] for m in applied["metadata"]["managedFields"]}
    with pytest.raises(ValueError, match="serves no kind Nope in v1"):
        apply(api, {"apiVersion": "v1", "kind": "Nope", "metadata": {"name": "x"}})


def test_second_up_is_refused(local_cluster: LocalCluster) -> None:
    with pytest.raises(AlreadyRunning, match="already running"):
        LocalCluster(local_cluster.layout).up()


def test_scheduler_allocates_and_kubelet_waits_for_driver(
    api: AdminAPI, namespace: str, unique_name: str
) -> None:
    driver = f"{unique_name}.dradriver.dev"
    cls = example.device_class(f"{unique_name}-class", driver)
    slc = example.node_slice(NODE_NAME, devices=2, driver=driver)
    api.create(path_for(R, "deviceclasses"), cls)
    api.create(path_for(R, "resourceslices"), slc)
    try:
        api.create(
            path_for(R, "resourceclaimtemplates", namespace),
            example.claim_template("one", namespace, cls["metadata"]["name"]),
        )
        api.create(
            path_for("v1", "pods", namespace), example.pod_with_template("p", namespace, "one")
        )

        def allocated_claim() -> dict[str, object] | None:
            pod = api.get(path_for("v1", "pods", namespace, "p"))
            name = example.pod_claim_name(pod)
            claim = name and api.get_or_none(path_for(R, "resourceclaims", namespace, name))
            return claim if claim and example.allocated_devices(claim) else None

        claim = wait_until("claim allocation", allocated_claim, DEADLINE)
        devices = example.allocated_devices(claim)
        assert len(devices) == 1
        drv, pool, dev = devices[0]
        assert (drv, pool) == (driver, NODE_NAME)
        assert dev in {"dev-0", "dev-1"}
        selector = claim["status"]["allocation"]["nodeSelector"]  # type: ignore[index]
        assert NODE_NAME in str(selector)

        pod = api.get(path_for("v1", "pods", namespace, "p"))
        assert pod["spec"]["nodeName"] == NODE_NAME

        def not_registered_event() -> dict[str, str] | None:
            events = api.items(
                path_for("v1", "events", namespace),
                fieldSelector="involvedObject.kind=Pod,involvedObject.name=p",
            )
            for e in events:
                if e["reason"] == "FailedPrepareDynamicResources":
                    return e
            return None

        event = wait_until(
            "kubelet's FailedPrepareDynamicResources", not_registered_event, DEADLINE
        )
        assert f"DRA driver {driver} is not registered" in event["message"]
        pod = api.get(path_for("v1", "pods", namespace, "p"))
        assert pod["status"]["phase"] == "Pending"
    finally:
        api.delete(path_for(R, "resourceslices", name=slc["metadata"]["name"]))
        api.delete(path_for(R, "deviceclasses", name=cls["metadata"]["name"]))
