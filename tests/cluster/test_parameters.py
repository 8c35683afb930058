"""The DeviceClaimParameters CRD on the real apiserver, and dradriver-controller running on it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.localcluster import (
    NAMESPACE,
    ControllerProcess,
    controller_kubeconfig,
    install_crds,
)
from dradriver import parameters as params
from dradriver.cluster.api import AdminAPI, APIError, path_for, wait_until
from dradriver.cluster.local import LocalCluster

API_VERSION = f"dradriver.dev/{params.VERSION}"
# A standby takes over within the lease duration (15 s) plus two retry periods.
TAKEOVER = 25
Obj = dict[str, Any]


def parameters_path(namespace: str, name: str | None = None) -> str:
    return path_for(API_VERSION, params.PLURAL, namespace, name)


def parameters(namespace: str, name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": params.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.fixture
def crd(api: AdminAPI) -> None:
    install_crds(api)


def rejected(api: AdminAPI, namespace: str, spec: Obj, strict: bool = False) -> str:
    query = "?fieldValidation=Strict" if strict else ""
    with pytest.raises(APIError) as info:
        api.create(parameters_path(namespace) + query, parameters(namespace, "bad", spec))
    # 422 from schema validation, 400 from strict decoding (unknown fields).
    assert info.value.status == (400 if strict else 422), info.value.body
    return str(info.value.body.get("message", ""))


def test_valid_object_is_stored_with_defaults(api: AdminAPI, crd: None, namespace: str) -> None:
    spec = {
        "env": {"MODE": "fast", "_X1": ""},
        "profile": "fast-1",
        "setupArgs": ["--verbose", ""],
        "count": 2,
        "selectors": ["device.attributes['dradriver.dev'].model == 'mock-1'"],
    }
    created = api.create(parameters_path(namespace), parameters(namespace, "good", spec))
    assert created["spec"] == {**spec, "allocationMode": "WaitForFirstConsumer"}
    # What the apiserver stored passes the models: the schema is not looser than pydantic.
    assert params.spec_of(created).count == 2
    # Printer columns.
    table = api.request(
        "GET",
        parameters_path(namespace),
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "Profile", "Mode", "Valid", "Age"]
    assert table["rows"][0]["cells"][:3] == ["good", "fast-1", "WaitForFirstConsumer"]


@pytest.mark.parametrize(
    ("spec", "field", "strict"),
    [
        ({"count": 0}, "spec.count", False),
        ({"count": 33}, "spec.count", False),
        ({"env": {"1BAD": "x"}}, "spec.env", False),
        ({"env": {"A" * 129: "x"}}, "spec.env", False),
        ({"profile": "Not_A_Label"}, "spec.profile", False),
        ({"allocationMode": "Later"}, "spec.allocationMode", False),
        ({"setupArgs": ["x"] * 33}, "spec.setupArgs", False),
        ({"selectors": [""]}, "spec.selectors[0]", False),
        ({"count": "two"}, "spec.count", False),
        ({"bogus": True}, "bogus", True),
    ],
)
def test_invalid_object_is_rejected_naming_the_field(
    api: AdminAPI, crd: None, namespace: str, spec: Obj, field: str, strict: bool
) -> None:
    message = rejected(api, namespace, spec, strict)
    assert field in message, message
    # The models agree with the schema.
    with pytest.raises(params.ParametersError):
        params.parse_spec(spec)


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dradriver-controller-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def lease(api: AdminAPI, name: str) -> Obj | None:
    return api.get_or_none(path_for("coordination.k8s.io/v1", "leases", NAMESPACE, name))


def holder(api: AdminAPI, name: str) -> str | None:
    obj = lease(api, name)
    value: str | None = (obj or {}).get("spec", {}).get("holderIdentity")
    return value


def valid(api: AdminAPI, namespace: str, name: str) -> Obj | None:
    obj = api.get_or_none(parameters_path(namespace, name))
    condition = params.valid_condition(obj) if obj else None
    generation = (obj or {}).get("metadata", {}).get("generation")
    if condition and condition.get("observedGeneration") == generation:
        return condition
    return None


def test_controller_replicas_elect_a_leader_validate_and_fail_over(
    api: AdminAPI,
    local_cluster: LocalCluster,
    namespace: str,
    unique_name: str,
    workdir: Path,
) -> None:
    """Two replicas with the manifests' RBAC: one leads, the other is a ready standby."""
    kubeconfig = controller_kubeconfig(api, local_cluster, workdir)
    lease_name = f"controller-{unique_name}"
    a = ControllerProcess("replica-a", kubeconfig, workdir, lease_name)
    b = ControllerProcess("replica-b", kubeconfig, workdir, lease_name)
    try:
        a.start()
        wait_until("replica-a leads", lambda: holder(api, lease_name) == "replica-a", 30)
        b.start()
        wait_until("both replicas ready", lambda: a.ready() and b.ready(), 30)
        readyz = b.get("/readyz")
        assert readyz is not None and "standby with synced caches" in readyz.text
        label = f'{{lease="{NAMESPACE}/{lease_name}"}}'
        assert a.metric(f"dradriver_leader{label}") == 1
        assert b.metric(f"dradriver_leader{label}") == 0
        assert a.metric('dradriver_informer_synced{resource="resourceclaims"}') == 1
        assert b.metric('dradriver_informer_synced{resource="deviceclaimparameters"}') == 1
        health = a.get("/healthz")
        assert health is not None and health.status_code == 200

        # The leader sets the Valid condition (through the status subresource).
        api.create(parameters_path(namespace), parameters(namespace, "p1", {"profile": "fast"}))
        condition = wait_until("p1 Valid", lambda: valid(api, namespace, "p1"), 30)
        assert condition["status"] == "True" and condition["reason"] == "Valid"
        writes = 'dradriver_reconcile_total{controller="deviceclaimparameters",result="success"}'
        assert (a.metric(writes) or 0) >= 1
        assert b.metric(writes) is None  # the standby reconciled nothing

        # The leader crashes: the standby takes over within the lease and keeps working.
        a.kill()
        wait_until("replica-b leads", lambda: holder(api, lease_name) == "replica-b", TAKEOVER)
        api.create(parameters_path(namespace), parameters(namespace, "p2", {"count": 1}))
        wait_until("p2 Valid", lambda: valid(api, namespace, "p2"), 30)
        assert b.metric(f"dradriver_leader{label}") == 1

        # A clean shutdown releases the Lease at once.
        assert b.terminate() == 0
        current = lease(api, lease_name)
        assert current is not None and not current["spec"].get("holderIdentity")
        assert "released the lease" in b.log_path.read_text()
    finally:
        a.stop()
        b.stop()
        api.delete(path_for("coordination.k8s.io/v1", "leases", NAMESPACE, lease_name))


def test_controller_is_not_ready_while_caches_cannot_sync(
    api: AdminAPI, local_cluster: LocalCluster, unique_name: str, workdir: Path
) -> None:
    """A driver name the RBAC does not cover: caches never sync, /readyz says why."""
    kubeconfig = controller_kubeconfig(api, local_cluster, workdir)
    proc = ControllerProcess(
        "lonely",
        kubeconfig,
        workdir,
        f"controller-{unique_name}",
        extra_args=["--driver-name=missing.example.com", "--no-leader-elect"],
    )
    try:
        proc.start()

        def says_why() -> str | None:
            resp = proc.get("/readyz")
            if resp is None or resp.status_code != 503 or "Forbidden" not in resp.text:
                return None
            return resp.text

        text = wait_until("an explaining /readyz", says_why, 30)
        assert "caches not synced: deviceclaimparameters (" in text
        assert "403 Forbidden" in text  # the RBAC covers only dradriver.dev
        assert proc.terminate() == 0
    finally:
        proc.stop()
