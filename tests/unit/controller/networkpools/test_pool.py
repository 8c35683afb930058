"""NetworkDevicePool model, CRD, slices, pinned attachments, and the attach backends."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from controller.networkpools.attach import (
    AttachError,
    AttachRequest,
    ExecAttach,
    SimulatedAttach,
    backend_for,
    parse_attach_output,
)
from controller.networkpools.pool import network_pool, pools_of_claim
from controller.resourceclaims import allocated_node
from devtools import crds
from dradriver.api import networkpool as net
from dradriver.k8s.objects import Obj
from dradriver.resourceslice.builder import build_slices, slices_equal

DRIVER = "dradriver.dev"


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "attach": {"backend": "simulated"},
        "devices": [{"name": "nic-0", "attributes": {"model": {"string": "x1"}}}],
    }
    base.update(overrides)
    return base


def build(
    pool: net.NetworkDevicePoolSpec, generation: int, uid: str, cooling: set[str] | None = None
) -> list[Obj]:
    return build_slices(
        network_pool(DRIVER, "fab", pool, uid, generation, cooling or set()), generation
    )


def test_committed_crd_matches_the_models() -> None:
    assert crds.crd_path(net.CRD_KIND).read_text() == net.crd_yaml()


def test_crd_is_cluster_scoped_with_status() -> None:
    crd = net.crd()
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"devices": []}, "spec.devices"),
        ({"devices": [{"name": "Bad_Name"}]}, "spec.devices[0].name"),
        ({"devices": [{"name": "a"}, {"name": "a"}]}, "given twice"),
        ({"attach": {"backend": "tftp"}}, "spec.attach.backend"),
        ({"attach": {"backend": "exec"}}, "needs the exec section"),
        ({"attach": {"backend": "exec", "exec": {"command": ["rel/path"]}}}, "absolute path"),
        (
            {"devices": [{"name": "a", "attributes": {"m": {"int": 1, "string": "x"}}}]},
            "exactly one",
        ),
        ({"devices": [{"name": "a", "capacity": {"bw": {"value": "ten"}}}]}, "not a quantity"),
        ({"nodeSelector": {"nodeSelectorTerms": []}}, "spec.nodeSelector.nodeSelectorTerms"),
        (
            {
                "nodeSelector": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In"}]}]
                }
            },
            "needs at least one value",
        ),
        ({"surprise": 1}, "spec.surprise: unknown field"),
    ],
)
def test_invalid_specs_name_the_field(bad: dict[str, Any], where: str) -> None:
    with pytest.raises(net.NetworkPoolError, match=None) as info:
        net.parse_spec(spec(**bad))
    assert where in str(info.value)


def test_slices_for_all_nodes_bind_to_the_chosen_node() -> None:
    [slice_] = build(net.parse_spec(spec()), 3, "uid-1")
    body = slice_["spec"]
    assert body["allNodes"] is True and "nodeName" not in body
    assert body["pool"] == {"name": "network/fab", "generation": 3, "resourceSliceCount": 1}
    [device] = body["devices"]
    assert device["attributes"] == {"model": {"string": "x1"}}  # no own-domain prefix
    assert device["bindsToNode"] is True
    assert device["bindingConditions"] == ["dradriver.dev/attached"]
    assert device["bindingFailureConditions"] == ["dradriver.dev/attach-failed"]
    assert slice_["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_per_device_reach_switches_to_per_device_node_selection() -> None:
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]
    }
    pool = net.parse_spec(
        spec(
            devices=[{"name": "a", "nodeSelector": selector}, {"name": "b"}],
        )
    )
    [slice_] = build(pool, 1, "u")
    assert slice_["spec"]["perDeviceNodeSelection"] is True
    a, b = slice_["spec"]["devices"]
    assert a["nodeSelector"] == selector
    assert b["allNodes"] is True


def test_large_pools_are_split_into_slices() -> None:
    pool = net.parse_spec(spec(devices=[{"name": f"d{i}"} for i in range(300)]))
    slices = build(pool, 1, "u")
    # 64 per slice (the limit once a device is tainted), so taints never move devices.
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 64, 64, 64, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {5}
    assert len({s["metadata"]["name"] for s in slices}) == 5


def test_a_device_in_attach_failure_cooldown_is_tainted() -> None:
    pool = net.parse_spec(spec(devices=[{"name": "a"}, {"name": "b"}]))
    [slice_] = build(pool, 1, "u", cooling={"b"})
    a, b = slice_["spec"]["devices"]
    assert "taints" not in a
    assert b["taints"] == [
        {"key": "dradriver.dev/attach-failed", "value": "cooldown", "effect": "NoSchedule"}
    ]
    assert pool.attach.failure_cooldown_seconds == 60


def test_slice_comparison_sees_reach_changes() -> None:
    pool = net.parse_spec(spec())
    [a] = build(pool, 1, "u")
    assert slices_equal(a["spec"], a["spec"])
    changed = {**a["spec"], "allNodes": None, "nodeSelector": {"nodeSelectorTerms": []}}
    assert not slices_equal(a["spec"], changed)


def claim(conditions: list[dict[str, str]], node: str = "n1") -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": DRIVER, "pool": "network/fab", "device": "nic-0"}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "devices": [
                {
                    "driver": DRIVER,
                    "pool": "network/fab",
                    "device": "nic-0",
                    "conditions": conditions,
                    "data": {"node": node, "handle": "h", "env": {"A": "1"}},
                }
            ],
        },
    }


def test_plugin_reads_the_pinned_attachment_only_when_attached_here() -> None:
    attached = [{"type": "dradriver.dev/attached", "status": "True"}]
    pinned = net.attachment_of(claim(attached), DRIVER, "network/fab", "nic-0", "n1")
    assert pinned == net.PinnedAttachment("n1", "h", {"A": "1"})
    with pytest.raises(net.NetworkPoolError, match="not attached yet"):
        net.attachment_of(claim([]), DRIVER, "network/fab", "nic-0", "n1")
    with pytest.raises(net.NetworkPoolError, match="attached to node 'n1', not to 'n2'"):
        net.attachment_of(claim(attached), DRIVER, "network/fab", "nic-0", "n2")


def test_claim_mapping_and_bound_node() -> None:
    c = claim([])
    assert set(pools_of_claim(DRIVER)(c)) == {"fab"}
    assert allocated_node(c["status"]["allocation"]) == "n1"
    assert net.object_name("node-1") is None


def request() -> AttachRequest:
    return AttachRequest("fab", "nic-0", "n1", "ns/c", "u")


def test_simulated_backend_attaches_and_injects_failures() -> None:
    ok = SimulatedAttach(net.SimulatedBackend(latency_seconds=0))
    result = asyncio.run(ok.attach(request()))
    assert ok.attached == {("fab", "nic-0"): "n1"} and result.handle
    asyncio.run(ok.detach(request(), result.handle))
    assert ok.attached == {}
    failing = SimulatedAttach(net.SimulatedBackend(latency_seconds=0, fail_devices=["nic-0"]))
    with pytest.raises(AttachError, match="failDevices"):
        asyncio.run(failing.attach(request()))


def test_exec_backend_runs_the_command(tmp_path: Path) -> None:
    record = tmp_path / "calls"
    script = tmp_path / "fabric.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$1 $DRADRIVER_DEVICE $DRADRIVER_NODE $DRADRIVER_ATTACH_HANDLE" >> {record}\n'
        'if [ "$1" = attach ]; then echo \'{"handle": "port-7", "env": {"PORT": "7"}}\'; fi\n'
    )
    script.chmod(0o755)
    pool = net.parse_spec(spec(attach={"backend": "exec", "exec": {"command": [str(script)]}}))
    backend = backend_for(pool.attach)
    assert isinstance(backend, ExecAttach)
    result = asyncio.run(backend.attach(request()))
    assert (result.handle, result.env) == ("port-7", {"PORT": "7"})
    asyncio.run(backend.detach(request(), result.handle))
    assert record.read_text().splitlines() == ["attach nic-0 n1 ", "detach nic-0 n1 port-7"]


def test_exec_backend_failure_carries_the_output(tmp_path: Path) -> None:
    script = tmp_path / "broken.sh"
    script.write_text("#!/bin/sh\necho 'switch port 7 is down' >&2\nexit 3\n")
    script.chmod(0o755)
    backend = ExecAttach(net.ExecBackend(command=[str(script)]))
    with pytest.raises(AttachError, match="switch port 7 is down"):
        asyncio.run(backend.attach(request()))


def test_attach_output_parsing() -> None:
    assert parse_attach_output("plain-handle").handle == "plain-handle"
    with pytest.raises(AttachError, match="invalid JSON"):
        parse_attach_output("{nope")
    with pytest.raises(AttachError, match="env"):
        parse_attach_output('{"env": {"A": 1}}')
