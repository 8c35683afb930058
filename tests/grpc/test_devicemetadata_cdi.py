"""The device-metadata CDI specs, loaded by containerd 2.4.2's own CDI library (cdicheck).

The node driver prepares claims with the metadata writer on (real ledger, CDI dir and
files in a tmp dir, claims from the fake apiserver); the checker loads the spec dir and
injects every CDI ID the kubelet would get, so a metadata spec the runtime refuses, or a
mount it would not make, fails here rather than as a pod that never starts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

from devtools.cluster.cdicheck import check_specs, run_checker
from dradriver.host.cdi import CDIRegistry
from dradriver.host.state.ledger import Ledger
from dradriver.k8s.client import KubeClient
from dradriver.plugin.devicemetadata import DeviceMetadataWriter
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.nodedriver import NodeDriver
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.claims import DRIVER, NODE, allocated_claim, claim_ref, result, store_claim
from tests.grpc.test_cdi_runtime_check import pytestmark as needs_checker
from tests.unit.kubeletplugin.test_nodedriver import DEVICES

pytestmark = needs_checker


def test_metadata_specs_load_and_mount_the_file_read_only(tmp_path: Path) -> None:
    api = FakeAPIServer()
    cdi_dir = tmp_path / "cdi"
    data_dir = tmp_path / "plugins" / DRIVER
    driver = NodeDriver(
        client=cast(KubeClient, api),
        driver_name=DRIVER,
        inventory=NodeInventory(NODE, lambda: list(DEVICES)),
        ledger=Ledger.load(data_dir / "ledger.json"),
        cdi=CDIRegistry(cdi_dir, DRIVER, durable=False),
        metadata=DeviceMetadataWriter(DRIVER, data_dir, cdi_dir, lambda _: {}),
    )
    direct = store_claim(api, allocated_claim("direct", [result("dev-0"), result("dev-1", "b")]))
    templated = store_claim(
        api,
        allocated_claim(
            "p-gpu-abcde",
            [result("dev-2")],
            annotations={"resource.kubernetes.io/pod-claim-name": "gpu"},
        ),
    )
    out = asyncio.run(driver.prepare_claims([claim_ref(direct), claim_ref(templated)]))
    assert {uid: r.error for uid, r in out.items() if r.error} == {}
    ids = [i for r in out.values() for d in r.devices for i in d.cdi_ids]
    metadata_ids = [i for i in ids if i.startswith(f"{DRIVER}/metadata=")]
    assert len(metadata_ids) == 3  # one per request

    assert check_specs(cdi_dir) == []
    report = run_checker([cdi_dir], ids)
    assert report.errors == []
    mounts = {
        m["destination"]: (m["source"], m["options"])
        for i in metadata_ids
        for m in report.devices[i].mounts
    }
    base = "/var/run/kubernetes.io/dra-device-attributes"
    assert sorted(mounts) == [
        f"{base}/resourceclaims/direct/b/{DRIVER}-metadata.json",
        f"{base}/resourceclaims/direct/gpu/{DRIVER}-metadata.json",
        f"{base}/resourceclaimtemplates/gpu/gpu/{DRIVER}-metadata.json",
    ]
    for source, options in mounts.values():
        assert Path(source).is_file() and options == ["ro", "bind"]
