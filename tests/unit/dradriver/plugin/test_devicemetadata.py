"""Device metadata for containers (KEP-5304): the file and the CDI spec that mounts it.

Real node driver, ledger, CDI registry and files in tmp dirs; the claims come from the
fake apiserver. The layout and format checked here are those of the 1.37 kubelet-plugin
helper (k8s.io/dynamic-resource-allocation v0.37.2, kubeletplugin/metadata.go and
api/metadata): what a workload reads must not depend on which helper wrote it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any, cast

from dradriver.host.cdi import CDIRegistry
from dradriver.host.state.ledger import Ledger
from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from dradriver.plugin.devicemetadata import DeviceMetadataWriter, MetadataFiles
from dradriver.plugin.interface import ClaimRef
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.nodedriver import NodeDriver
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.claims import DRIVER, NODE, allocated_claim, claim_ref, result, store_claim
from tests.unit.kubeletplugin.test_nodedriver import DEVICES

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"


class Plugin:
    def __init__(self, tmp: Path) -> None:
        self.api = FakeAPIServer()
        self.data_dir = tmp / "plugins" / DRIVER
        self.cdi_dir = tmp / "cdi"
        attributes = {d.name: d.to_api(DRIVER).get("attributes") or {} for d in DEVICES}
        attributes["dev-0"] = {
            "model": {"string": "m1"},
            "resource.kubernetes.io/numaNode": {"int": 0},
        }
        self.metadata = DeviceMetadataWriter(
            DRIVER, self.data_dir, self.cdi_dir, lambda name: attributes.get(name, {})
        )
        self.driver = NodeDriver(
            client=cast(KubeClient, self.api),
            driver_name=DRIVER,
            inventory=NodeInventory(NODE, lambda: list(DEVICES)),
            ledger=Ledger.load(tmp / "plugins" / DRIVER / "ledger.json"),
            cdi=CDIRegistry(self.cdi_dir, DRIVER, durable=False),
            metadata=self.metadata,
        )

    def prepare(self, claim: Obj) -> list[Any]:
        out = asyncio.run(self.driver.prepare_claims([claim_ref(claim)]))
        prepared = out[claim["metadata"]["uid"]]
        assert prepared.error == ""
        return prepared.devices


def stream(path: Path) -> list[Obj]:
    """The JSON objects of a metadata file, in order (what json.Decoder.More reads)."""
    text, out, decoder, at = path.read_text(), [], json.JSONDecoder(), 0
    while text[at:].strip():
        while text[at].isspace():
            at += 1
        obj, at = decoder.raw_decode(text, at)
        out.append(obj)
    return out


def metadata_mounts(plugin: Plugin, uid: str) -> dict[str, Obj]:
    """CDI ID -> the one mount of that metadata device."""
    spec = json.loads((plugin.cdi_dir / f"{DRIVER}-metadata_claim-{uid}.json").read_text())
    assert spec["kind"] == f"{DRIVER}/metadata"
    return {
        f"{DRIVER}/metadata={d['name']}": d["containerEdits"]["mounts"][0] for d in spec["devices"]
    }


def test_claim_gets_a_metadata_file_per_request_mounted_through_cdi(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path)
    claim = store_claim(
        plugin.api,
        allocated_claim(
            "direct", [result("dev-0", "gpu"), result("dev-1", "gpu"), result("dev-2", "aux/b")]
        ),
    )
    uid = claim["metadata"]["uid"]
    devices = plugin.prepare(claim)
    by_name = {d.device: d for d in devices}
    mounts = metadata_mounts(plugin, uid)
    # The metadata CDI ID goes to the first device of each request only.
    gpu_id, aux_id = f"{DRIVER}/metadata={uid}-gpu", f"{DRIVER}/metadata={uid}-aux"
    assert by_name["dev-0"].cdi_ids[-1] == gpu_id and len(by_name["dev-0"].cdi_ids) == 2
    assert len(by_name["dev-1"].cdi_ids) == 1
    assert by_name["dev-2"].cdi_ids[-1] == aux_id
    assert mounts[gpu_id] == {
        "hostPath": str(
            plugin.data_dir / "dra-device-metadata" / "default_direct" / "gpu" / "metadata.json"
        ),
        "containerPath": f"{CONTAINER_DIR}/resourceclaims/direct/gpu/{DRIVER}-metadata.json",
        "options": ["ro", "bind"],
    }
    objects = stream(Path(mounts[gpu_id]["hostPath"]))
    assert [o["apiVersion"] for o in objects] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    newest = objects[0]
    assert newest["kind"] == "DeviceMetadata"
    assert newest["metadata"] == {
        "name": "direct",
        "namespace": "default",
        "uid": uid,
        "generation": 1,
    }
    assert "podClaimName" not in newest
    assert newest["requests"] == [
        {
            "name": "gpu",
            "devices": [
                {
                    "driver": DRIVER,
                    "pool": NODE,
                    "name": "dev-0",
                    "attributes": {
                        "model": {"string": "m1"},
                        "resource.kubernetes.io/numaNode": {"int": 0},
                    },
                },
                {"driver": DRIVER, "pool": NODE, "name": "dev-1"},
            ],
        }
    ]
    assert {k: v for k, v in objects[1].items() if k != "apiVersion"} == {
        k: v for k, v in newest.items() if k != "apiVersion"
    }
    # The subrequest's base name names the file; the whole name is in the content.
    (aux,) = stream(Path(mounts[aux_id]["hostPath"]))[:1]
    assert aux["requests"][0]["name"] == "aux/b"
    assert mounts[aux_id]["containerPath"].endswith(
        "/resourceclaims/direct/aux/dradriver.dev-metadata.json"
    )
    assert Path(mounts[gpu_id]["hostPath"]).stat().st_mode & 0o777 == 0o644

    asyncio.run(plugin.driver.unprepare_claims([claim_ref(claim)]))
    assert not (plugin.cdi_dir / f"{DRIVER}-metadata_claim-{uid}.json").exists()
    assert not (plugin.data_dir / "dra-device-metadata" / "default_direct").exists()


def test_template_claims_are_found_under_the_pods_name_for_them(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path)
    claim = store_claim(
        plugin.api,
        allocated_claim(
            "pod-gpu-x7k2q",
            [result("dev-0")],
            annotations={"resource.kubernetes.io/pod-claim-name": "gpu"},
        ),
    )
    uid = claim["metadata"]["uid"]
    plugin.prepare(claim)
    (mount,) = metadata_mounts(plugin, uid).values()
    assert mount["containerPath"] == (
        f"{CONTAINER_DIR}/resourceclaimtemplates/gpu/gpu/{DRIVER}-metadata.json"
    )
    assert stream(Path(mount["hostPath"]))[0]["podClaimName"] == "gpu"


def test_a_failing_metadata_write_does_not_fail_the_claim(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path)
    plugin.data_dir.mkdir(parents=True)
    (plugin.data_dir / "dra-device-metadata").write_text("not a directory")
    claim = store_claim(plugin.api, allocated_claim("c", [result("dev-0")]))
    (device,) = plugin.prepare(claim)
    assert device.cdi_ids == (f"{DRIVER}/device={claim['metadata']['uid']}-dev-0",)


def test_a_metadata_write_failing_in_the_ledger_change_fails_no_claim_of_the_batch(
    tmp_path: Path,
) -> None:
    """The files are written in the group committer's change that records a new claim: one
    claim's failed metadata write leaves it, and the other claims of the same ledger write,
    prepared (and recorded), only that claim without its metadata CDI ID."""
    plugin = Plugin(tmp_path)
    ok = store_claim(plugin.api, allocated_claim("ok", [result("dev-0")]))
    blocked = store_claim(plugin.api, allocated_claim("blocked", [result("dev-1")]))
    root = plugin.data_dir / "dra-device-metadata"
    root.mkdir(parents=True)
    (root / "default_blocked").write_text("not a directory")  # only this claim's dir fails
    out = asyncio.run(plugin.driver.prepare_claims([claim_ref(ok), claim_ref(blocked)]))
    assert plugin.driver._commits.writes == 1  # both claims in one change batch
    ok_uid, blocked_uid = ok["metadata"]["uid"], blocked["metadata"]["uid"]
    assert out[ok_uid].error == "" and out[blocked_uid].error == ""
    assert out[ok_uid].devices[0].cdi_ids == (
        f"{DRIVER}/device={ok_uid}-dev-0",
        f"{DRIVER}/metadata={ok_uid}-gpu",
    )
    assert out[blocked_uid].devices[0].cdi_ids == (f"{DRIVER}/device={blocked_uid}-dev-1",)
    assert metadata_mounts(plugin, ok_uid)
    assert not (plugin.cdi_dir / f"{DRIVER}-metadata_claim-{blocked_uid}.json").exists()
    for uid in (ok_uid, blocked_uid):
        entry = plugin.driver.ledger.get_claim(uid)
        assert entry is not None and entry.state == "prepared"
        assert (plugin.cdi_dir / f"{DRIVER}-device_claim-{uid}.json").exists()


class ThreadNotingWriter(DeviceMetadataWriter):
    """The real writer, noting which thread writes and removes the files."""

    threads: list[tuple[str, int]]

    def write(self, files: MetadataFiles) -> bool:
        self.threads.append(("write", threading.get_ident()))
        return super().write(files)

    def unprepared(self, claim: ClaimRef) -> None:
        self.threads.append(("remove", threading.get_ident()))
        super().unprepared(claim)


def test_the_files_are_written_and_removed_off_the_event_loop(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path)
    writer = ThreadNotingWriter(DRIVER, plugin.data_dir, plugin.cdi_dir, lambda _: {})
    writer.threads = []
    plugin.driver.metadata = writer
    claim = store_claim(plugin.api, allocated_claim("c", [result("dev-0")]))
    first = plugin.prepare(claim)  # a new claim: in the ledger change's worker thread
    again = plugin.prepare(claim)  # a repeated call: in a thread of its own
    assert first == again and first[0].cdi_ids[-1].startswith(f"{DRIVER}/metadata=")
    # An unprepare: in the ledger change that removes the entry.
    assert asyncio.run(plugin.driver.unprepare_claims([claim_ref(claim)])) == {
        claim["metadata"]["uid"]: ""
    }
    assert not writer.claim_dir(claim_ref(claim)).exists()
    assert [what for what, _ in writer.threads] == ["write", "write", "remove"]
    loop_thread = threading.get_ident()  # asyncio.run's loop runs here
    assert all(thread != loop_thread for _, thread in writer.threads)


def test_start_up_restores_specs_of_prepared_claims_and_removes_the_rest(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path)
    kept = store_claim(plugin.api, allocated_claim("kept", [result("dev-0"), result("dev-1", "b")]))
    gone = store_claim(plugin.api, allocated_claim("gone", [result("dev-2")]))
    plugin.prepare(kept)
    plugin.prepare(gone)
    kept_spec = plugin.cdi_dir / f"{DRIVER}-metadata_claim-{kept['metadata']['uid']}.json"
    before = kept_spec.read_bytes()
    for spec in plugin.cdi_dir.iterdir():  # a reboot: /var/run/cdi is tmpfs
        spec.unlink()
    restarted = DeviceMetadataWriter(DRIVER, plugin.data_dir, plugin.cdi_dir, lambda _: {})
    assert restarted.restore({kept["metadata"]["uid"]}) == 1
    assert kept_spec.read_bytes() == before  # the same spec as prepare wrote
    assert sorted(p.name for p in (plugin.data_dir / "dra-device-metadata").iterdir()) == [
        "default_kept"
    ]
    assert restarted.restore(set()) == 0
    assert not kept_spec.exists()
    assert list((plugin.data_dir / "dra-device-metadata").iterdir()) == []
