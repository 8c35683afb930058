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
from devtools.harness.nodeplugin import NodePlugin, start_node_plugin, wait_for_slices
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


def test_second_nodes_plugin_cannot_write_the_first_nodes_slices(
    node2_plugin: NodePlugin, local_cluster: LocalCluster
) -> None:
    token = yaml.safe_load(node2_plugin.kubeconfig.read_text())["users"][0]["user"]["token"]
    tls = ssl.create_default_context(cafile=str(local_cluster.layout.pki / "ca.crt"))
    body = {
        "apiVersion": R,
        "kind": "ResourceSlice",
        "metadata": {"name": "from-node-2"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "node-1",
            "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "x"}],
        },
    }
    with httpx.Client(
        base_url=local_cluster.layout.apiserver_url,
        verify=tls,
        headers={"Authorization": f"Bearer {token}"},
    ) as client:
        denied = client.post(path_for(R, "resourceslices"), json=body)
    assert denied.status_code == 403, denied.text
    assert "runs on node 'node-2'" in denied.json()["message"]
