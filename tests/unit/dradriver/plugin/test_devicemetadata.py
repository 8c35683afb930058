"""Device metadata for containers (KEP-5304): the file and the CDI spec that mounts it.

Real node driver, ledger, CDI registry and files in tmp dirs; the claims come from the
fake apiserver. The layout and format checked here are those of the 1.37 kubelet-plugin
helper (k8s.io/dynamic-resource-allocation v0.37.2, kubeletplugin/metadata.go and
api/metadata): what a workload reads must not depend on which helper wrote it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from dradriver.host.cdi import CDIRegistry
from dradriver.host.state.ledger import Ledger
from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from dradriver.plugin.devicemetadata import DeviceMetadataWriter, MetadataFiles
from dradriver.plugin.interface import ClaimRef, PreparedDevice
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


# ----- names from the claim or the pod become path components only if they are valid names

# Each would escape its directory, forge a file name or a line, or break the length rule.
BAD_NAMES = {
    "dot-dot": "..",
    "slash": "a/b",
    "up-and-out": "../../../../etc",
    "newline": "gpu\nx",
    "nul": "gpu\x00x",
    "too-long": "a" * 64,
}


def tree(root: Path) -> list[str]:
    """Every file and directory under ``root``, relative to it."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def metadata_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Capture the writer's records even if log.configure() turned propagation off."""
    logger = logging.getLogger("dradriver.kubeletplugin.devicemetadata")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def logged_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    records = {id(r): r for r in caplog.records}  # once, propagated or not
    return [
        str(getattr(r, "fields", {}).get("error", ""))
        for r in records.values()
        if r.msg == "device metadata not written"
    ]


@pytest.mark.parametrize("bad", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_a_bad_pod_claim_name_costs_that_claims_metadata_only(
    tmp_path: Path, metadata_logs: pytest.LogCaptureFixture, bad: str
) -> None:
    plugin = Plugin(tmp_path)
    ok = store_claim(plugin.api, allocated_claim("ok", [result("dev-0")]))
    forged = store_claim(
        plugin.api,
        allocated_claim(
            "pod-gpu-x7k2q",
            [result("dev-1")],
            annotations={"resource.kubernetes.io/pod-claim-name": bad},
        ),
    )
    out = asyncio.run(plugin.driver.prepare_claims([claim_ref(ok), claim_ref(forged)]))
    ok_uid, forged_uid = ok["metadata"]["uid"], forged["metadata"]["uid"]
    assert out[ok_uid].error == "" and out[forged_uid].error == ""
    assert out[ok_uid].devices[0].cdi_ids[-1] == f"{DRIVER}/metadata={ok_uid}-gpu"
    assert out[forged_uid].devices[0].cdi_ids == (f"{DRIVER}/device={forged_uid}-dev-1",)
    # No file and no mount for the forged claim; the other claim's are where they belong.
    assert not (plugin.cdi_dir / f"{DRIVER}-metadata_claim-{forged_uid}.json").exists()
    assert tree(plugin.data_dir / "dra-device-metadata") == [
        "default_ok",
        "default_ok/gpu",
        "default_ok/gpu/metadata.json",
    ]
    assert {p.name for p in plugin.cdi_dir.iterdir()} == {
        f"{DRIVER}-device_claim-{ok_uid}.json",
        f"{DRIVER}-device_claim-{forged_uid}.json",
        f"{DRIVER}-metadata_claim-{ok_uid}.json",
    }
    assert {p.name for p in tmp_path.iterdir()} == {"plugins", "cdi"}
    (error,) = logged_errors(metadata_logs)
    assert "annotation resource.kubernetes.io/pod-claim-name" in error and repr(bad) in error


def writer_and_devices(tmp_path: Path) -> tuple[DeviceMetadataWriter, list[PreparedDevice]]:
    (tmp_path / "plugin").mkdir()  # the plugin's data dir is there before any claim
    writer = DeviceMetadataWriter(DRIVER, tmp_path / "plugin", tmp_path / "cdi", lambda _: {})
    return writer, [PreparedDevice(("gpu",), NODE, "dev-0", (f"{DRIVER}/device=u1-dev-0",))]


@pytest.mark.parametrize("field", ["namespace", "name", "request"])
@pytest.mark.parametrize("bad", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_a_bad_claim_namespace_name_or_request_is_refused_before_any_path_is_made(
    tmp_path: Path, metadata_logs: pytest.LogCaptureFixture, field: str, bad: str
) -> None:
    """The kubelet's reference is checked upstream too; the writer does not rely on it."""
    writer, devices = writer_and_devices(tmp_path)
    names = {"namespace": "default", "name": "c", "request": "gpu", field: bad}
    if field == "name" and bad == "a" * 64:
        names["name"] = "a" * 254  # a claim name is a DNS subdomain: up to 253
    claim = ClaimRef(namespace=names["namespace"], uid="u1", name=names["name"])
    devices = [PreparedDevice((names["request"],), NODE, "dev-0", devices[0].cdi_ids)]
    assert writer.plan(claim, {"metadata": {}}, devices) is None
    (error,) = logged_errors(metadata_logs)
    what = {"namespace": "claim namespace", "name": "claim name", "request": "request name"}
    assert error.startswith(f"{what[field]} {names[field]!r}")
    assert tree(tmp_path) == ["plugin"]
    if field != "request":
        with pytest.raises(ValueError, match=what[field]):
            writer.claim_dir(claim)


def test_unprepare_of_a_claim_with_a_bad_name_removes_nothing_outside_the_root(
    tmp_path: Path,
) -> None:
    writer, devices = writer_and_devices(tmp_path)
    files = writer.plan(ClaimRef("default", "u1", "c"), {"metadata": {}}, devices)
    assert files is not None and writer.write(files)
    victim = tmp_path / "plugin" / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    before = tree(tmp_path)
    # "<root>/default_c/../../victim" is the victim: "default_c" exists.
    writer.unprepared(ClaimRef("default", "u2", "c/../../victim"))
    assert tree(tmp_path) == before


def test_restore_skips_a_file_whose_names_are_not_valid_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    writer, devices = writer_and_devices(tmp_path)
    files = writer.plan(ClaimRef("default", "u1", "c"), {"metadata": {}}, devices)
    assert files is not None and writer.write(files)
    forged_dir = writer.root / "default_f" / "gpu"
    forged_dir.mkdir(parents=True)
    forged = stream(files.files[0][0])[0]  # the claim's file, as written
    forged["metadata"].update(uid="u2", name="f")
    forged["podClaimName"] = "../../../etc"
    (forged_dir / "metadata.json").write_text(json.dumps(forged))
    assert writer.restore({"u1", "u2"}) == 1
    assert tree(writer.root) == ["default_c", "default_c/gpu", "default_c/gpu/metadata.json"]
    assert {p.name for p in writer.cdi.cdi_dir.iterdir()} == {f"{DRIVER}-metadata_claim-u1.json"}
