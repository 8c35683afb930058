"""Two kubelets on one machine: one plugin per node, each confined to its own node."""

from __future__ import annotations

import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import (
    NodePlugin,
    install_plugin_policies,
    start_node_plugin,
    wait_for_slices,
)
from dradriver.k8s.paths import RESOURCE_V1 as R
from dradriver.k8s.paths import path_for

DRIVER = "dradriver.dev"
NODE = "node-2"
CLASS = "multinode.dradriver.dev"


@pytest.fixture(scope="module")
def node2_plugin(local_cluster: LocalCluster) -> Iterator[NodePlugin]:
    if local_cluster.layout.nodes < 2:
        pytest.fail("the multi-node tests need DRADRIVER_NODES >= 2 (the default)")
    work = Path("/tmp/dradriver-test-node2")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
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
                                    "namePrefix": "n2dev",
                                    "count": 2,
                                    "attributes": {"kind": "multinode"},
                                }
                            ],
                        }
                    }
                ],
            }
        )
    )
    with local_cluster.api() as api:
        api.delete(path_for(R, "deviceclasses", name=CLASS))
        api.create(
            path_for(R, "deviceclasses"),
            {
                "metadata": {"name": CLASS},
                "spec": {
                    "selectors": [
                        {
                            "cel": {
                                "expression": f'device.driver == "{DRIVER}" && '
                                f'device.attributes["{DRIVER}"].kind == "multinode"'
                            }
                        }
                    ]
                },
            },
        )
        plugin = start_node_plugin(local_cluster, api, config, work, node=NODE)
    try:
        yield plugin
    finally:
        plugin.stop()


def test_every_node_is_ready(api: AdminAPI) -> None:
    ready = {
        n["metadata"]["name"]
        for n in api.items(path_for("v1", "nodes"))
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    }
    assert {"node-1", NODE} <= ready


def test_plugin_on_the_second_node_serves_its_pods(
    node2_plugin: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    assert node2_plugin.kubelet_root == local_cluster.layout.node(2).root
    wait_for_slices(api, NODE, DRIVER, 2)
    api.create(
        path_for(R, "resourceclaimtemplates", namespace),
        {
            "metadata": {"name": "one"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "dev", "exactly": {"deviceClassName": CLASS}}]
                    }
                }
            },
        },
    )
    api.create(
        path_for("v1", "pods", namespace),
        {
            "metadata": {"name": "p"},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "one"}],
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "dev"}]},
                    }
                ],
            },
        },
    )

    def running() -> dict[str, object] | None:
        pod = api.get(path_for("v1", "pods", namespace, "p"))
        return pod if pod.get("status", {}).get("phase") == "Running" else None

    pod = wait_until("the pod Running on node-2", running, 90)
    assert pod["spec"]["nodeName"] == NODE  # type: ignore[index]
    assert "prepared" in node2_plugin.log_path.read_text()


# The slice policy cases write slices of a driver that no plugin serves, so neither the
# running node-2 plugin's publisher nor a kubelet's clean-up of a plugin's slices touches them.
POLICY_DRIVER = "policy-test.dradriver.dev"
OTHER_DRIVER = "other.example.com"


def slice_spec(pool: str, driver: str = POLICY_DRIVER, **reach: object) -> dict[str, object]:
    """A one-device slice; ``reach``: nodeName, allNodes, nodeSelector or perDeviceNodeSelection."""
    device: dict[str, object] = {"name": "x"}
    if reach.get("perDeviceNodeSelection"):
        device["nodeName"] = NODE  # per device, the plugin's own node: still not its pool
    return {
        "driver": driver,
        "pool": {"name": pool, "generation": 1000, "resourceSliceCount": 1},
        "devices": [device],
        **reach,
    }


def slice_body(name: str, spec: dict[str, object]) -> dict[str, object]:
    return {"apiVersion": R, "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def node2_client(node2_plugin: NodePlugin, local_cluster: LocalCluster) -> Iterator[httpx.Client]:
    """The node-2 plugin's identity, once the slice policy also allows POLICY_DRIVER."""
    with local_cluster.api() as api:
        install_plugin_policies(api, POLICY_DRIVER)
    token = yaml.safe_load(node2_plugin.kubeconfig.read_text())["users"][0]["user"]["token"]
    tls = ssl.create_default_context(cafile=str(local_cluster.layout.pki / "ca.crt"))
    with httpx.Client(
        base_url=local_cluster.layout.apiserver_url,
        verify=tls,
        headers={"Authorization": f"Bearer {token}"},
    ) as client:

        def in_force() -> bool:
            # The apiserver loads policy changes asynchronously: the new version is in
            # force once it admits POLICY_DRIVER and pins the pool. Dry runs write nothing.
            def dry_run(spec: dict[str, object]) -> int:
                body = slice_body("policy-probe", spec)
                created = client.post(
                    path_for(R, "resourceslices"), params={"dryRun": "All"}, json=body
                )
                return created.status_code

            return dry_run(slice_spec(NODE, nodeName=NODE)) == 201 and (
                dry_run(slice_spec("node-1", nodeName=NODE)) == 403
            )

        wait_until(f"the slice policy in force for {POLICY_DRIVER}", in_force, 30)
        yield client


OWN = slice_spec(NODE, nodeName=NODE)
# Fragments of the policy's denial messages; () means allowed.
ALLOWED: tuple[str, ...] = ()
NOT_THIS_POOL = ("may only write its pool 'node-2' (named after the node), not pool 'node-1'",)
# The installed list names every driver the session's plugins serve.
NOT_THIS_DRIVER = (
    "may only write ResourceSlices of its driver (",
    POLICY_DRIVER,
    f"), not of '{OTHER_DRIVER}'",
)


def not_this_node(node: str) -> tuple[str, ...]:
    return (
        f"runs on node 'node-2' and may only write ResourceSlices of that node, not of '{node}'",
    )


NO_NODE_NAME = (*not_this_node(""), "(a slice without nodeName")
SLICE_CASES = [
    # (operation, the slice written (CREATE) or stored (UPDATE, DELETE), denial)
    pytest.param("CREATE", OWN, ALLOWED, id="create-own"),
    pytest.param(
        "CREATE", slice_spec("node-1", nodeName=NODE), NOT_THIS_POOL, id="create-other-pool"
    ),
    pytest.param(
        "CREATE",
        slice_spec(NODE, OTHER_DRIVER, nodeName=NODE),
        NOT_THIS_DRIVER,
        id="create-other-driver",
    ),
    pytest.param("CREATE", slice_spec(NODE, allNodes=True), NO_NODE_NAME, id="create-allNodes"),
    pytest.param(
        "CREATE",
        slice_spec(
            NODE,
            nodeSelector={
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        ),
        NO_NODE_NAME,
        id="create-nodeSelector",
    ),
    pytest.param(
        "CREATE",
        slice_spec(NODE, perDeviceNodeSelection=True),
        NO_NODE_NAME,
        id="create-perDeviceNodeSelection",
    ),
    pytest.param(
        "CREATE",
        slice_spec("node-1", nodeName="node-1"),
        not_this_node("node-1"),
        id="create-other-node",
    ),
    pytest.param("UPDATE", OWN, ALLOWED, id="update-own"),
    pytest.param(
        "UPDATE", slice_spec("node-1", nodeName=NODE), NOT_THIS_POOL, id="update-other-pool"
    ),
    pytest.param(
        "UPDATE",
        slice_spec(NODE, OTHER_DRIVER, nodeName=NODE),
        NOT_THIS_DRIVER,
        id="update-other-driver",
    ),
    pytest.param(
        "UPDATE",
        slice_spec("node-1", nodeName="node-1"),
        not_this_node("node-1"),
        id="update-other-node",
    ),
    pytest.param("DELETE", OWN, ALLOWED, id="delete-own"),
    # A slice someone else put under this node in another pool: the publisher may clean it up.
    pytest.param("DELETE", slice_spec("node-1", nodeName=NODE), ALLOWED, id="delete-stray-pool"),
    pytest.param(
        "DELETE",
        slice_spec(NODE, OTHER_DRIVER, nodeName=NODE),
        NOT_THIS_DRIVER,
        id="delete-other-driver",
    ),
    pytest.param(
        "DELETE",
        slice_spec("node-1", nodeName="node-1"),
        not_this_node("node-1"),
        id="delete-other-node",
    ),
]


@pytest.mark.parametrize(("operation", "spec", "denial"), SLICE_CASES)
def test_second_nodes_plugin_writes_only_its_own_nodes_pool_of_its_driver(
    operation: str,
    spec: dict[str, object],
    denial: tuple[str, ...],
    node2_client: httpx.Client,
    api: AdminAPI,
    unique_name: str,
) -> None:
    body = slice_body(unique_name, spec)
    path = path_for(R, "resourceslices", name=unique_name)
    try:
        if operation == "CREATE":
            response = node2_client.post(path_for(R, "resourceslices"), json=body)
        else:
            api.create(path_for(R, "resourceslices"), body)  # the policy does not bind the admin
            if operation == "UPDATE":
                stored = node2_client.get(path).json()  # the plugin may read every slice
                stored["spec"]["pool"]["generation"] += 1
                response = node2_client.put(path, json=stored)
            else:
                response = node2_client.delete(path)
    finally:
        api.delete(path)  # also what a denial did not stop before the fix
    if not denial:
        assert response.status_code in (200, 201), response.text
    else:
        assert response.status_code == 403, response.text
        message = response.json()["message"]
        assert all(fragment in message for fragment in denial), message
