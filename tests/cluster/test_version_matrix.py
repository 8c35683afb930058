"""What the running release does with the API a DRA driver uses, found by asking it.

Each test probes one feature of the version matrix (``devtools.matrix``) and
either passes (works, noting what it saw), or skips with the reason the
cluster gave: the field the apiserver dropped and the gate it reports off in
its own ``kubernetes_feature_enabled`` metric. Nothing here is decided by the
release number. All of them are in the compatibility subset.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.cluster.api import AdminAPI
from devtools.cluster.config import write_kubeconfig
from devtools.cluster.gates import Gate, apiserver_gates, why_off
from devtools.cluster.local import LocalCluster
from dradriver.k8s.client import SyncKubeClient, load_connection
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.resourceslice.publisher import dropped_fields, gate_of
from tests.cluster.conftest import Recorder

R = RESOURCE_V1
DRIVER = "matrix.dradriver.dev"
NODE = "node-1"

# One slice per feature, each with the fields that feature adds (resource-v1.md §5).
_DEVICE: Obj = {"name": "d0", "attributes": {"index": {"int": 0}}}
GATED_SLICES: dict[str, tuple[tuple[str, ...], Obj]] = {
    "device-taints": (
        ("DRADeviceTaints",),
        {"devices": [{**_DEVICE, "taints": [{"key": f"{DRIVER}/t", "effect": "NoSchedule"}]}]},
    ),
    "partitionable": (
        ("DRAPartitionableDevices",),
        {
            "devices": [
                {
                    **_DEVICE,
                    "consumesCounters": [
                        {"counterSet": "card", "counters": {"mem": {"value": "1Gi"}}}
                    ],
                }
            ],
        },
    ),
    "consumable": (
        ("DRAConsumableCapacity",),
        {
            "devices": [
                {
                    **_DEVICE,
                    "allowMultipleAllocations": True,
                    "capacity": {
                        "mem": {"value": "4Gi", "requestPolicy": {"default": "1Gi"}},
                    },
                }
            ]
        },
    ),
    "binding-conditions": (
        ("DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus"),
        {
            "devices": [
                {
                    **_DEVICE,
                    "bindsToNode": True,
                    "bindingConditions": ["Attached"],
                    "bindingFailureConditions": ["AttachFailed"],
                }
            ]
        },
    ),
}


def _slice(feature: str, extra: Obj) -> Obj:
    return {
        "apiVersion": R,
        "kind": "ResourceSlice",
        "metadata": {"name": f"matrix-{feature}"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": f"matrix-{feature}", "generation": 1, "resourceSliceCount": 1},
            "nodeName": NODE,
            **extra,
        },
    }


@pytest.fixture(scope="module")
def gates(local_cluster: LocalCluster) -> dict[str, Gate]:
    with local_cluster.api() as api:
        return apiserver_gates(api)


@pytest.mark.parametrize(
    "feature",
    [pytest.param(f, marks=pytest.mark.compat(f)) for f in GATED_SLICES],
)
def test_the_apiserver_keeps_the_slice_fields_of(
    feature: str, api: AdminAPI, gates: dict[str, Gate], matrix_notes: Recorder
) -> None:
    """A dry-run create shows what the apiserver would store, dropped fields and all."""
    names, extra = GATED_SLICES[feature]
    sent = _slice(feature, extra)
    stored = api.request("POST", path_for(R, "resourceslices"), body=sent, params={"dryRun": "All"})
    dropped = dropped_fields(sent["spec"], stored["spec"])
    if dropped:
        hinted = sorted({g for p in dropped if (g := gate_of(p))})
        reason = why_off(gates, *names) or f"no gate off, yet {', '.join(hinted)} fields dropped"
        pytest.skip(f"the apiserver drops {', '.join(dropped)}: {reason}")
    assert not why_off(gates, *names), "fields kept although the gate is reported off"


@pytest.fixture
def allocated_claim(api: AdminAPI, namespace: str) -> Iterator[Obj]:
    """A claim allocated (by hand, as a scheduler would) to a device of ours on node-1."""
    claim = api.create(
        path_for(R, "resourceclaims", namespace),
        {
            "metadata": {"name": "probe"},
            "spec": {
                "devices": {
                    "requests": [{"name": "r", "exactly": {"deviceClassName": "matrix-probe"}}]
                }
            },
        },
    )
    allocation = {
        "devices": {
            "results": [{"request": "r", "driver": DRIVER, "pool": "p", "device": "d0"}],
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
            ]
        },
    }
    claim["status"] = {"allocation": allocation}
    yield api.replace(path_for(R, "resourceclaims", namespace, "probe") + "/status", claim)


DEVICE_STATUS: Obj = {
    "driver": DRIVER,
    "pool": "p",
    "device": "d0",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Probed",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ],
    "data": {"probe": True},
}


@pytest.mark.compat("device-status")
def test_the_apiserver_keeps_claim_device_status(
    api: AdminAPI, namespace: str, allocated_claim: Obj, gates: dict[str, Gate]
) -> None:
    path = path_for(R, "resourceclaims", namespace, "probe") + "/status"
    stored = api.merge_patch(path, {"status": {"devices": [DEVICE_STATUS]}})
    if not stored.get("status", {}).get("devices"):
        pytest.skip(
            "the apiserver drops status.devices: "
            + (why_off(gates, "DRAResourceClaimDeviceStatus") or "no gate reported off")
        )
    assert stored["status"]["devices"][0]["data"] == {"probe": True}


def _status_writer(api: AdminAPI, cluster: LocalCluster, namespace: str, work: Path) -> Path:
    """A ServiceAccount allowed plain ``resourceclaims/status`` writes and nothing granular."""
    account = "status-writer"
    api.create(path_for("v1", "serviceaccounts", namespace), {"metadata": {"name": account}})
    rules: list[Obj] = [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "resourceclaims/status"],
            "verbs": ["get", "update", "patch"],
        }
    ]
    api.create(
        path_for("rbac.authorization.k8s.io/v1", "roles", namespace),
        {"metadata": {"name": account}, "rules": rules},
    )
    api.create(
        path_for("rbac.authorization.k8s.io/v1", "rolebindings", namespace),
        {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )
    token = api.create(
        path_for("v1", "serviceaccounts", namespace, account) + "/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )["status"]["token"]
    kubeconfig = work / "status-writer.kubeconfig"
    write_kubeconfig(
        kubeconfig,
        cluster.layout.apiserver_url,
        cluster.layout.pki / "ca.crt",
        account,
        token=token,
    )
    return kubeconfig


@pytest.mark.compat("status-authz")
def test_what_a_device_status_write_needs_besides_resourceclaims_status(
    api: AdminAPI,
    local_cluster: LocalCluster,
    namespace: str,
    allocated_claim: Obj,
    gates: dict[str, Gate],
    matrix_notes: Recorder,
    tmp_path: Path,
) -> None:
    """1.36 added per-driver checks (``resourceclaims/driver``); before, status RBAC was all."""
    kubeconfig = _status_writer(api, local_cluster, namespace, tmp_path)
    path = path_for(R, "resourceclaims", namespace, "probe") + "/status"
    with SyncKubeClient(load_connection(str(kubeconfig))) as client:
        try:
            client.merge_patch(path, {"status": {"devices": [DEVICE_STATUS]}})
            denied: KubeAPIError | None = None
        except KubeAPIError as e:
            denied = e
    granular = gates.get("DRAResourceClaimGranularStatusAuthorization")
    if denied is None:
        assert granular is None or not granular.enabled
        matrix_notes.note("status-authz", "plain: `resourceclaims/status` is enough")
        return
    # 1.36 answers 422 Invalid (a field error on status.devices), not 403.
    assert denied.status in (403, 422), denied
    message = str(denied.body.get("message", ""))
    assert "resourceclaims/driver" in message, message
    assert granular is not None and granular.enabled
    matrix_notes.note(
        "status-authz",
        f"granular: also `resourceclaims/driver` `arbitrary-node:patch` on {DRIVER} "
        "(`associated-node:` for a plugin on the claim's node)",
    )
