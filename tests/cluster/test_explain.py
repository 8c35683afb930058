"""``dradriver explain`` on a claim the real scheduler cannot allocate."""

from __future__ import annotations

import asyncio

from devtools.cluster.api import AdminAPI
from devtools.cluster.config import NODE_NAME
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.demo import example
from dradriver.cli.explain import run_explain
from dradriver.k8s.paths import RESOURCE_V1 as R
from dradriver.k8s.paths import path_for


def test_explain_names_the_selector_and_the_holder(
    local_cluster: LocalCluster, api: AdminAPI, namespace: str, unique_name: str
) -> None:
    driver = f"{unique_name}.dradriver.dev"
    cls = example.device_class(f"{unique_name}-class", driver)
    slc = example.node_slice(NODE_NAME, devices=2, driver=driver)
    api.create(path_for(R, "deviceclasses"), cls)
    api.create(path_for(R, "resourceslices"), slc)
    try:
        # dev-0 goes to a pod; then a claim that only accepts dev-0 or index > 5.
        api.create(
            path_for(R, "resourceclaimtemplates", namespace),
            example.claim_template("one", namespace, cls["metadata"]["name"]),
        )
        api.create(
            path_for("v1", "pods", namespace), example.pod_with_template("holder", namespace, "one")
        )
        wait_until(
            "dev-0 allocated to the holder",
            lambda: any(
                d[2] == "dev-0"
                for c in api.items(path_for(R, "resourceclaims", namespace))
                for d in example.allocated_devices(c)
            ),
            60,
        )
        selector = (
            f'device.attributes["{driver}"].index == 0 || device.attributes["{driver}"].index > 5'
        )
        api.create(
            path_for(R, "resourceclaims", namespace),
            {
                "metadata": {"name": "picky"},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "dev",
                                "exactly": {
                                    "deviceClassName": cls["metadata"]["name"],
                                    "selectors": [{"cel": {"expression": selector}}],
                                },
                            }
                        ]
                    }
                },
            },
        )
        out = asyncio.run(
            run_explain(f"{namespace}/picky", str(local_cluster.layout.admin_kubeconfig), True)
        )
        device_rows = [line for line in out.splitlines()[2:] if line.split()[1] != "-"]
        assert device_rows and all(f" {driver} " in row for row in device_rows), out
        lines = {line.split()[3]: line for line in out.splitlines() if f" {driver} " in line}
        assert "holder" in lines["dev-0"], out  # taken: names the claim that holds it
        assert "selector" in lines["dev-1"] and "index > 5" in lines["dev-1"], out
    finally:
        api.delete(path_for(R, "resourceslices", name=slc["metadata"]["name"]))
        api.delete(path_for(R, "deviceclasses", name=cls["metadata"]["name"]))
