"""Simulated (kwok) nodes: their pools are published with dradriver's slice publisher and
used by kube-scheduler and by dradriver-controller; ``cluster down`` stops kwok with them.

The shared cluster's tests run kwok and the pools' publisher for three nodes of their
own driver (``devtools.cluster.kwok.simulated``), tainted so that no other test's pod
lands there; the ``cluster down`` test starts an isolated cluster (free ports) with
``kwok_nodes``, as ``dradriver cluster up --kwok-nodes`` does.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.controller_allocation import isolated_layout
from devtools.cluster import kwok
from devtools.cluster.api import AdminAPI
from devtools.cluster.kwokpools import DEFAULT_DRIVER, DEVICES_PER_NODE
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.controller import namespaced_controller
from dradriver.api.wellknown import ALLOCATION_ANNOTATION
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1 as R
from dradriver.k8s.paths import path_for

DRIVER = "kwok-test.dradriver.dev"
CLASS = "kwok-test"
COUNT = 3
DEADLINE = 90


@pytest.fixture(scope="module")
def simulated_nodes(local_cluster: LocalCluster) -> Iterator[list[str]]:
    state = local_cluster.state()
    assert state is not None
    work = Path(tempfile.mkdtemp(prefix="dradriver-kwok-"))
    with local_cluster.api() as api:
        api.create(
            path_for(R, "deviceclasses"),
            {
                "metadata": {"name": CLASS},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
        try:
            with kwok.simulated(api, state.kubeconfig, COUNT, DRIVER, work) as names:
                yield names
        finally:
            api.delete(path_for(R, "deviceclasses", name=CLASS))
            shutil.rmtree(work, ignore_errors=True)


def node_slices(api: AdminAPI, driver: str) -> dict[str, Obj]:
    return {
        s["spec"]["nodeName"]: s
        for s in api.items(path_for(R, "resourceslices"), fieldSelector=f"spec.driver={driver}")
    }


def all_published(api: AdminAPI, driver: str, count: int) -> dict[str, Obj] | None:
    found = node_slices(api, driver)
    return found if len(found) == count else None


def request(model: str) -> Obj:
    selector = f'device.attributes["{DRIVER}"].model == "{model}"'
    return {
        "requests": [
            {
                "name": "r",
                "exactly": {
                    "deviceClassName": CLASS,
                    "selectors": [{"cel": {"expression": selector}}],
                },
            }
        ]
    }


def allocation(api: AdminAPI, namespace: str, name: str) -> Obj | None:
    obj = api.get_or_none(path_for(R, "resourceclaims", namespace, name))
    return ((obj or {}).get("status") or {}).get("allocation")


def test_each_simulated_node_publishes_its_pool(api: AdminAPI, simulated_nodes: list[str]) -> None:
    found = wait_until(
        "every simulated node's slice",
        lambda: all_published(api, DRIVER, COUNT),
        DEADLINE,
    )
    assert sorted(found) == simulated_nodes
    for node, slice_ in found.items():
        assert slice_["spec"]["pool"]["name"] == node
        assert len(slice_["spec"]["devices"]) == DEVICES_PER_NODE
        [owner] = slice_["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("Node", node)


def test_scheduler_places_a_template_claim_pod_on_a_simulated_node(
    api: AdminAPI, namespace: str, simulated_nodes: list[str]
) -> None:
    api.create(
        path_for(R, "resourceclaimtemplates", namespace),
        {"metadata": {"name": "t"}, "spec": {"spec": {"devices": request("h100")}}},
    )
    api.create(
        path_for("v1", "pods", namespace),
        {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"claims": [{"name": "r"}]}}
                ],
                "resourceClaims": [{"name": "r", "resourceClaimTemplateName": "t"}],
                "tolerations": [kwok.TOLERATION],
                "terminationGracePeriodSeconds": 0,
            },
        },
    )

    def running() -> Obj | None:
        pod = api.get(path_for("v1", "pods", namespace, "p"))
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    pod = wait_until("pod Running on a simulated node (kwok)", running, DEADLINE)
    node = pod["spec"]["nodeName"]
    assert node in simulated_nodes
    [claim] = api.items(path_for(R, "resourceclaims", namespace))
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, node)
    assert result["device"].startswith("h100-")


def test_controller_allocates_from_a_simulated_nodes_pool(
    api: AdminAPI, local_cluster: LocalCluster, namespace: str, simulated_nodes: list[str]
) -> None:
    with namespaced_controller(api, local_cluster, namespace, "kwok"):
        api.create(
            path_for(R, "resourceclaims", namespace),
            {
                "metadata": {"name": "c", "annotations": {ALLOCATION_ANNOTATION: "Immediate"}},
                "spec": {"devices": request("l4")},
            },
        )
        found = wait_until(
            "allocated by the controller", lambda: allocation(api, namespace, "c"), DEADLINE
        )
        [result] = found["devices"]["results"]
        assert result["driver"] == DRIVER and result["pool"] in simulated_nodes
        assert result["device"].startswith("l4-")
        [term] = found["nodeSelector"]["nodeSelectorTerms"]
        assert term["matchFields"][0]["values"] == [result["pool"]]
        api.delete(path_for(R, "resourceclaims", namespace, "c"))
        wait_until(
            "claim released",
            lambda: not api.items(path_for(R, "resourceclaims", namespace)),
            DEADLINE,
        )


def test_cluster_down_stops_kwok_and_removes_the_simulated_nodes() -> None:
    work = Path(tempfile.mkdtemp(prefix=f"dradriver-kwok-down-{uuid.uuid4().hex[:4]}-"))
    cluster = LocalCluster(isolated_layout(work), kwok_nodes=2)
    try:
        state = cluster.up()
        assert state.kwok_nodes == 2
        with cluster.api() as api:
            assert kwok.ready_count(api) == 2
            published = wait_until(
                "the pools component published both nodes' slices",
                lambda: all_published(api, DEFAULT_DRIVER, 2),
                DEADLINE,
            )
            assert sorted(published) == kwok.node_names(2)
        ours = [
            c for c in state.components if c.name in (kwok.KWOK_COMPONENT, kwok.POOLS_COMPONENT)
        ]
        assert len(ours) == 2 and all(c.alive() for c in ours)
        cluster.down()
        assert not any(c.alive() for c in ours)
        assert cluster.state() is None  # the cluster's etcd, and the Nodes in it, are gone
    finally:
        cluster.down()
        shutil.rmtree(work, ignore_errors=True)
