"""CDI spec files: what a container runtime will load from the directory we write.

Expected values come from the CDI rules in /work/shared/reference/cdi.md
(naming, minimum cdiVersion per feature, strict file format).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.host.cdi import (
    CDIConflictError,
    CDIDevice,
    CDIRegistry,
    CDISpecError,
    CDIValueError,
    InvalidCDINameError,
    UnknownCDIDeviceError,
    minimum_cdi_version,
    parse_cdi_id,
)
from dradriver.host.containeredits import ContainerEdits, DeviceNode, Mount

pytestmark = pytest.mark.unit

UID = "a1b2c3d4-0000-4000-8000-000000000001"  # starts with a letter: no 0.5.0 needed
DIGIT_UID = "1f2e3d4c-0000-4000-8000-000000000002"
VENDOR = "dradriver.dev"


def env_edits(**env: str) -> ContainerEdits:
    return ContainerEdits(env=env)


@pytest.fixture
def cdi_dir(tmp_path: Path) -> Path:
    return tmp_path / "run" / "cdi"


@pytest.fixture
def registry(cdi_dir: Path) -> CDIRegistry:
    return CDIRegistry(cdi_dir, VENDOR)


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_round_trip_and_resolve_merges_spec_and_device_edits(registry: CDIRegistry) -> None:
    devices = [
        CDIDevice(
            "gpu-0",
            ContainerEdits(
                env={"GPU": "0"},
                device_nodes=(DeviceNode(path="/dev/gpu0"),),
                mounts=(Mount(host_path="/opt/lib", container_path="/lib/gpu", options=("ro",)),),
            ),
        ),
        CDIDevice("gpu-1", env_edits(GPU="1")),
    ]
    ids = registry.write_claim(UID, devices, claim_edits=env_edits(CLAIM=UID))

    assert ids == {
        "gpu-0": f"dradriver.dev/device={UID}-gpu-0",
        "gpu-1": f"dradriver.dev/device={UID}-gpu-1",
    }
    path = registry.cdi_dir / f"dradriver.dev-device_claim-{UID}.json"
    assert path.is_file()
    on_disk = json.loads(path.read_text())
    assert on_disk == registry.read_claim(UID)
    assert on_disk == {
        "cdiVersion": "0.3.0",
        "kind": "dradriver.dev/device",
        "devices": [
            {
                "name": f"{UID}-gpu-0",
                "containerEdits": {
                    "env": ["GPU=0"],
                    "deviceNodes": [{"path": "/dev/gpu0"}],
                    "mounts": [
                        {"hostPath": "/opt/lib", "containerPath": "/lib/gpu", "options": ["ro"]}
                    ],
                },
            },
            {"name": f"{UID}-gpu-1", "containerEdits": {"env": ["GPU=1"]}},
        ],
        "containerEdits": {"env": [f"CLAIM={UID}"]},
    }

    got = registry.resolve(ids["gpu-0"])
    assert got.env == {"CLAIM": UID, "GPU": "0"}
    assert got.device_nodes == (DeviceNode(path="/dev/gpu0"),)
    assert [m.container_path for m in got.mounts] == ["/lib/gpu"]
    assert registry.resolve(ids["gpu-1"]) == env_edits(CLAIM=UID, GPU="1")


def test_resolve_many_applies_spec_edits_once_and_device_edits_in_order(
    registry: CDIRegistry,
) -> None:
    shared = ContainerEdits(device_nodes=(DeviceNode(path="/dev/ctl"),))
    ids = registry.write_claim(
        UID,
        [
            CDIDevice("a", ContainerEdits(device_nodes=(DeviceNode(path="/dev/a"),))),
            CDIDevice("b", ContainerEdits(device_nodes=(DeviceNode(path="/dev/b"),))),
        ],
        claim_edits=shared,
    )
    got = registry.resolve_many([ids["a"], ids["b"]])
    assert [n.path for n in got.device_nodes] == ["/dev/ctl", "/dev/a", "/dev/b"]


def test_device_edits_override_spec_env_like_the_runtime(registry: CDIRegistry) -> None:
    ids = registry.write_claim(
        UID, [CDIDevice("d", env_edits(MODE="device"))], claim_edits=env_edits(MODE="claim")
    )
    assert registry.resolve(ids["d"]).env == {"MODE": "device"}


@pytest.mark.parametrize(
    ("uid", "cdi_class", "edits", "expected"),
    [
        pytest.param(UID, "device", env_edits(A="1"), "0.3.0", id="baseline"),
        pytest.param(
            UID,
            "device",
            ContainerEdits(device_nodes=(DeviceNode(path="/dev/x", host_path="/dev/y"),)),
            "0.5.0",
            id="hostPath",
        ),
        pytest.param(DIGIT_UID, "device", env_edits(A="1"), "0.5.0", id="name-starts-digit"),
        pytest.param(UID, "gpu.v2", env_edits(A="1"), "0.6.0", id="dot-in-class"),
        pytest.param(
            UID,
            "device",
            ContainerEdits(mounts=(Mount(host_path="/a", container_path="/b"),)),
            "0.3.0",
            id="mount-without-type",
        ),
    ],
)
def test_minimal_cdi_version(
    cdi_dir: Path, uid: str, cdi_class: str, edits: ContainerEdits, expected: str
) -> None:
    registry = CDIRegistry(cdi_dir, VENDOR, cdi_class)
    ids = registry.write_claim(uid, [CDIDevice("dev", edits)])
    spec = registry.read_claim(uid)
    assert spec is not None
    assert spec["cdiVersion"] == expected
    assert registry.resolve(ids["dev"]) == edits


def test_spec_level_host_path_also_bumps_version(registry: CDIRegistry) -> None:
    claim_edits = ContainerEdits(device_nodes=(DeviceNode(path="/dev/x", host_path="/dev/y"),))
    registry.write_claim(UID, [CDIDevice("d", env_edits(A="1"))], claim_edits=claim_edits)
    spec = registry.read_claim(UID)
    assert spec is not None and spec["cdiVersion"] == "0.5.0"


def test_minimum_version_function_direct() -> None:
    assert minimum_cdi_version("device", ["abc"], [ContainerEdits()]) == "0.3.0"
    assert minimum_cdi_version("device", ["9abc"], [ContainerEdits()]) == "0.5.0"
    assert minimum_cdi_version("a.b", ["9abc"], [ContainerEdits()]) == "0.6.0"


def test_spec_below_required_version_is_rejected_on_read(registry: CDIRegistry) -> None:
    ids = registry.write_claim(DIGIT_UID, [CDIDevice("d", env_edits(A="1"))])
    path = registry.spec_path(DIGIT_UID)
    spec = json.loads(path.read_text())
    spec["cdiVersion"] = "0.3.0"  # a runtime refuses this: the name starts with a digit
    path.write_text(json.dumps(spec))
    with pytest.raises(CDISpecError, match=r"0\.5\.0") as info:
        registry.resolve(ids["d"])
    assert info.value.path == path


def test_atomic_write_leaves_no_temp_files(registry: CDIRegistry) -> None:
    uids = [f"c{i:03d}" for i in range(20)]

    def write(uid: str) -> None:
        for n in range(5):
            registry.write_claim(uid, [CDIDevice("d", env_edits(N=str(n)))])

    threads = [threading.Thread(target=write, args=(u,)) for u in uids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = sorted(os.listdir(registry.cdi_dir))
    assert names == sorted(f"dradriver.dev-device_claim-{u}.json" for u in uids)
    for uid in uids:
        assert registry.resolve(f"dradriver.dev/device={uid}-d").env == {"N": "4"}


def test_identical_rewrite_keeps_file_and_changed_content_replaces_it(
    registry: CDIRegistry,
) -> None:
    devices = [CDIDevice("d", env_edits(A="1"))]
    first = registry.write_claim(UID, devices)
    path = registry.spec_path(UID)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # make any rewrite visible
    before = path.stat()

    again = registry.write_claim(UID, devices)

    after = path.stat()
    assert again == first
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    registry.write_claim(UID, [CDIDevice("d", env_edits(A="2"))])
    changed = path.stat()
    assert changed.st_mtime_ns != before.st_mtime_ns
    assert registry.resolve(first["d"]).env == {"A": "2"}


@pytest.mark.usefixtures("umask_077")
def test_file_and_dir_modes(registry: CDIRegistry) -> None:
    registry.write_claim(UID, [CDIDevice("d", env_edits(A="1"))])
    assert stat.S_IMODE(registry.cdi_dir.stat().st_mode) == 0o755
    mode = stat.S_IMODE(registry.spec_path(UID).stat().st_mode)
    assert mode == 0o644
    assert not mode & stat.S_IWOTH


def test_identical_rewrite_repairs_mode(registry: CDIRegistry) -> None:
    devices = [CDIDevice("d", env_edits(A="1"))]
    registry.write_claim(UID, devices)
    path = registry.spec_path(UID)
    os.chmod(path, 0o666)
    registry.write_claim(UID, devices)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_existing_dir_mode_is_left_alone(tmp_path: Path) -> None:
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir(mode=0o750)
    os.chmod(cdi_dir, 0o750)
    CDIRegistry(cdi_dir, VENDOR).write_claim(UID, [CDIDevice("d", env_edits(A="1"))])
    assert stat.S_IMODE(cdi_dir.stat().st_mode) == 0o750


def test_other_vendors_and_temp_files_are_ignored(registry: CDIRegistry) -> None:
    registry.write_claim(UID, [CDIDevice("d", env_edits(A="1"))])
    other_kind = {
        "cdiVersion": "0.3.0",
        "kind": "other.vendor/device",
        "devices": [{"name": f"{UID}-d", "containerEdits": {"env": ["X=1"]}}],
    }
    d = registry.cdi_dir
    (d / "other.vendor-device_claim-abc.json").write_text(json.dumps(other_kind))
    (d / "dradriver.dev-gpu_claim-abc.json").write_text(json.dumps(other_kind))
    (d / "garbage.json").write_text("{not json")
    (d / "notes.yaml").write_text("- just: a list\n")
    (d / f".dradriver.dev-device_claim-{UID}.json.x1.tmp").write_text("partial")
    (d / "dradriver.dev-device_claim-zzz.json.bak").write_text("{}")

    assert registry.claim_uids_on_disk() == {UID}
    assert registry.resolve(f"dradriver.dev/device={UID}-d") == env_edits(A="1")


def test_yaml_spec_of_our_kind_is_seen(registry: CDIRegistry) -> None:
    (registry.cdi_dir).mkdir(parents=True)
    (registry.cdi_dir / "static.yaml").write_text(
        "cdiVersion: 0.3.0\nkind: dradriver.dev/device\n"
        "devices:\n- name: common\n  containerEdits:\n    env: [COMMON=1]\n"
    )
    assert registry.resolve("dradriver.dev/device=common") == env_edits(COMMON="1")


def test_remove_claim_is_idempotent(registry: CDIRegistry) -> None:
    ids = registry.write_claim(UID, [CDIDevice("d", env_edits(A="1"))])
    registry.remove_claim(UID)
    registry.remove_claim(UID)
    assert registry.claim_uids_on_disk() == set()
    assert registry.read_claim(UID) is None
    with pytest.raises(UnknownCDIDeviceError):
        registry.resolve(ids["d"])


def test_missing_dir_reads_as_empty(registry: CDIRegistry) -> None:
    assert registry.claim_uids_on_disk() == set()
    assert registry.read_claim(UID) is None
    registry.remove_claim(UID)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(
            '{"cdiVersion": "0.3.0", "kind": "dradriver.dev/dev', "not valid JSON", id="trunc"
        ),
        pytest.param(
            '{"cdiVersion": "0.3.0", "kind": "dradriver.dev/device"}', "devices", id="nodev"
        ),
        pytest.param("[]", "not an object", id="list"),
        pytest.param(
            '{"kind": "dradriver.dev/device", "devices": []}', "cdiVersion", id="noversion"
        ),
        pytest.param(
            '{"cdiVersion": "0.3.0", "kind": "dradriver.dev/device", "devices": [{"name": "x"}]}',
            "containerEdits",
            id="no-edits",
        ),
        pytest.param(
            '{"cdiVersion": "0.3.0", "kind": "dradriver.dev/device",'
            ' "devices": [{"name": "x", "containerEdits": {"env": ["NOEQUALS"]}}]}',
            "NAME=VALUE",
            id="bad-env",
        ),
        pytest.param(
            '{"cdiVersion": "0.3.0", "kind": "dradriver.dev/device", "extra": 1,'
            ' "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}',
            "unknown fields: extra",
            id="unknown-field",
        ),
        pytest.param(
            '{"cdiVersion": "0.3.0", "kind": "dradriver.dev/device",'
            ' "devices": [{"name": "x", "containerEdits": {"deviceNodes": [{}]}}]}',
            "path",
            id="node-without-path",
        ),
    ],
)
def test_malformed_spec_file_names_the_file(
    registry: CDIRegistry, content: str, reason: str
) -> None:
    registry.cdi_dir.mkdir(parents=True)
    path = registry.spec_path(UID)
    path.write_text(content)
    with pytest.raises(CDISpecError, match=reason) as info:
        registry.read_claim(UID)
    assert info.value.path == path
    assert str(path) in str(info.value)
    with pytest.raises(CDISpecError):
        registry.resolve(f"dradriver.dev/device={UID}-x")


def test_duplicate_device_across_files_is_a_conflict(registry: CDIRegistry) -> None:
    spec = {
        "cdiVersion": "0.3.0",
        "kind": "dradriver.dev/device",
        "devices": [{"name": "same", "containerEdits": {"env": ["A=1"]}}],
    }
    registry.cdi_dir.mkdir(parents=True)
    (registry.cdi_dir / "one.json").write_text(json.dumps(spec))
    (registry.cdi_dir / "two.json").write_text(json.dumps(spec))
    with pytest.raises(CDIConflictError, match=r"one\.json.*two\.json"):
        registry.resolve("dradriver.dev/device=same")


def test_same_device_name_in_two_claims_does_not_conflict(registry: CDIRegistry) -> None:
    a = registry.write_claim("aaaa", [CDIDevice("gpu-0", env_edits(WHO="a"))])
    b = registry.write_claim("bbbb", [CDIDevice("gpu-0", env_edits(WHO="b"))])
    assert registry.resolve(a["gpu-0"]).env == {"WHO": "a"}
    assert registry.resolve(b["gpu-0"]).env == {"WHO": "b"}


@pytest.mark.parametrize("name", ["", "-a", "a-", "a/b", "a=b", "a b", "é", "a_"])
def test_invalid_device_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidCDINameError, match="invalid CDI device name"):
        CDIDevice(name, env_edits(A="1"))


@pytest.mark.parametrize("name", ["a", "0", "gpu-0", "a:b", "A.b_c-9"])
def test_valid_device_names_are_accepted(registry: CDIRegistry, name: str) -> None:
    ids = registry.write_claim(UID, [CDIDevice(name, env_edits(A="1"))])
    assert registry.resolve(ids[name]) == env_edits(A="1")


@pytest.mark.parametrize(
    ("vendor", "cdi_class"),
    [("1vendor", "device"), ("vendor-", "device"), ("ven/dor", "device"), ("v", "c" * 64)],
)
def test_invalid_vendor_or_class(tmp_path: Path, vendor: str, cdi_class: str) -> None:
    with pytest.raises(InvalidCDINameError):
        CDIRegistry(tmp_path, vendor, cdi_class)


@pytest.mark.parametrize("uid", ["", "../etc", "a/b", "-x", "a_b"])
def test_invalid_claim_uid(registry: CDIRegistry, uid: str) -> None:
    with pytest.raises(InvalidCDINameError, match="claim UID"):
        registry.write_claim(uid, [CDIDevice("d", env_edits(A="1"))])


@pytest.mark.parametrize(
    "cdi_id",
    ["nokind", "dradriver.dev/device", "dradriver.dev=x", "/device=x", "dradriver.dev/device=-x"],
)
def test_malformed_ids(registry: CDIRegistry, cdi_id: str) -> None:
    with pytest.raises(InvalidCDINameError):
        registry.resolve(cdi_id)


def test_parse_cdi_id() -> None:
    assert parse_cdi_id("a.b/c=d:e") == ("a.b", "c", "d:e")


def test_unknown_and_foreign_ids(registry: CDIRegistry) -> None:
    registry.write_claim(UID, [CDIDevice("d", env_edits(A="1"))])
    with pytest.raises(UnknownCDIDeviceError, match="not defined"):
        registry.resolve(f"dradriver.dev/device={UID}-nope")
    with pytest.raises(UnknownCDIDeviceError, match="kind"):
        registry.resolve(f"other.vendor/device={UID}-d")


def test_write_rejects_what_the_runtime_would_reject(registry: CDIRegistry) -> None:
    with pytest.raises(CDIValueError, match="at least one device"):
        registry.write_claim(UID, [])
    with pytest.raises(CDIValueError, match="no container edits"):
        registry.write_claim(UID, [CDIDevice("d", ContainerEdits())])
    with pytest.raises(CDIValueError, match="duplicate"):
        registry.write_claim(UID, [CDIDevice("d", env_edits(A="1"))] * 2)
    with pytest.raises(CDIValueError, match="environment variable"):
        registry.write_claim(UID, [CDIDevice("d", ContainerEdits(env={"A=B": "1"}))])
    assert registry.claim_uids_on_disk() == set()
