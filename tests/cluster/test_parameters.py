"""The DeviceClaimParameters CRD on the real apiserver, and dradriver-controller running on it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.controller import (
    NAMESPACE,
    ControllerProcess,
    controller_kubeconfig,
    install_crds,
    namespaced_controller,
)
from dradriver.api import parameters as params
from dradriver.api.wellknown import IN_USE_FINALIZER
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from tests.cluster.test_controller_allocation import DEADLINE, NODE, Rig, devices_of

API_VERSION = f"dradriver.dev/{params.VERSION}"
# A standby takes over within the lease duration (15 s) plus two retry periods.
TAKEOVER = 25


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
    with pytest.raises(KubeAPIError) as info:
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
        "GET", parameters_path(namespace), accept="application/json;as=Table;v=v1;g=meta.k8s.io"
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
        # Every cache of the missing API group is named with its error (in any order).
        assert "caches not synced: " in text and "deviceclaimparameters (" in text
        assert "403 Forbidden" in text  # the RBAC covers only dradriver.dev
        assert proc.terminate() == 0
    finally:
        proc.stop()


# --- the controller allocating with parameters ----------------------------------------


@pytest.fixture
def allocating(
    api: AdminAPI, local_cluster: LocalCluster, namespace: str, workdir: Path
) -> Iterator[ControllerProcess]:
    """One controller (no leader election) allocating in the test's namespace."""
    with namespaced_controller(api, local_cluster, namespace, "params", DEADLINE) as proc:
        yield proc


def reference(name: str) -> list[Obj]:
    """Claim config referencing the parameters object ``name``."""
    ref = {"apiVersion": API_VERSION, "kind": params.REFERENCE_KIND, "name": name}
    return [{"opaque": {"driver": "dradriver.dev", "parameters": ref}}]


def without_in_use_finalizer(api: AdminAPI, namespace: str) -> None:
    """Last resort after a failure: nothing may keep the namespace from being deleted."""
    for obj in api.items(parameters_path(namespace)):
        kept = [f for f in obj["metadata"].get("finalizers") or [] if f != IN_USE_FINALIZER]
        if kept != (obj["metadata"].get("finalizers") or []):
            api.merge_patch(
                parameters_path(namespace, obj["metadata"]["name"]),
                {"metadata": {"finalizers": kept or None}},
            )


def parameters_events(api: AdminAPI, namespace: str, name: str, reason: str) -> list[Obj]:
    return [
        e
        for e in api.items(
            path_for("v1", "events", namespace),
            fieldSelector=f"involvedObject.name={name},involvedObject.kind={params.KIND}",
        )
        if e.get("reason") == reason
    ]


def test_parameters_in_use_are_deleted_only_after_their_claims(
    api: AdminAPI, crd: None, namespace: str, allocating: ControllerProcess
) -> None:
    spec = {"profile": "fast", "allocationMode": "Immediate"}
    api.create(parameters_path(namespace), parameters(namespace, "p", spec))
    api.create(parameters_path(namespace), parameters(namespace, "free", spec))
    with Rig(api, namespace, devices=1) as rig:
        try:
            rig.claim("c", immediate=False, config=reference("p"))
            wait_until("c allocated", lambda: rig.allocated("c"), DEADLINE)

            def in_use() -> Obj | None:
                obj = api.get_or_none(parameters_path(namespace, "p"))
                finalizers = (obj or {}).get("metadata", {}).get("finalizers") or []
                return obj if IN_USE_FINALIZER in finalizers else None

            wait_until("p in use", in_use, DEADLINE)
            # Parameters no allocated claim references get no finalizer: deleted at once.
            wait_until("free checked", lambda: valid(api, namespace, "free"), DEADLINE)
            free = api.get(parameters_path(namespace, "free"))
            assert IN_USE_FINALIZER not in (free["metadata"].get("finalizers") or [])
            api.delete(parameters_path(namespace, "free"))
            assert api.get_or_none(parameters_path(namespace, "free")) is None

            # Deleting p waits for its claim, and an event says which claim.
            api.delete(parameters_path(namespace, "p"))
            [event, *_] = wait_until(
                "InUse event",
                lambda: parameters_events(api, namespace, "p", "InUse"),
                DEADLINE,
            )
            assert event["message"] == "deletion waits: in use by claim c", event
            assert event["type"] == "Warning"
            assert event["involvedObject"]["apiVersion"] == API_VERSION
            # Seen after the controller looked at the deletion: still there, still held.
            held = api.get(parameters_path(namespace, "p"))
            assert held["metadata"].get("deletionTimestamp")
            assert IN_USE_FINALIZER in held["metadata"]["finalizers"]
            # The allocation was pinned, so the claim keeps its configuration.
            claim = rig.allocated("c")
            assert claim is not None
            config = claim["status"]["allocation"]["devices"]["config"]
            assert config[0]["opaque"]["parameters"]["profile"] == "fast"

            # The claim goes (deallocated by the controller): then the parameters go.
            api.delete(path_for(RESOURCE_V1, "resourceclaims", namespace, "c"))
            wait_until(
                "p deleted",
                lambda: api.get_or_none(parameters_path(namespace, "p")) is None,
                DEADLINE,
            )
            assert rig.get_claim("c") is None
        finally:
            rig.delete_all()
            without_in_use_finalizer(api, namespace)


def test_parameters_count_and_selectors_choose_the_devices(
    api: AdminAPI, crd: None, namespace: str, allocating: ControllerProcess
) -> None:
    with Rig(api, namespace, devices=4) as rig:
        # Give the rig's devices an index attribute the selector can pick by.
        path = path_for(RESOURCE_V1, "resourceslices", name=rig.slice)
        published = api.get(path)
        for i, device in enumerate(published["spec"]["devices"]):
            device["attributes"] = {"index": {"int": i}}
        api.replace(path, published)
        spec = {
            "count": 2,
            "selectors": [f"device.attributes['{rig.driver}'].index in [1, 3]"],
            "allocationMode": "Immediate",
        }
        api.create(parameters_path(namespace), parameters(namespace, "two", spec))
        try:
            # The request asks for one device of the class; the parameters say: two, 1 and 3.
            created = rig.claim("c", immediate=False, config=reference("two"))
            claim = wait_until("c allocated", lambda: rig.allocated("c"), DEADLINE)
            assert sorted(devices_of(claim)) == [f"{NODE}/dev-1", f"{NODE}/dev-3"]
            results = claim["status"]["allocation"]["devices"]["results"]
            assert {r["request"] for r in results} == {"r"}
            # The claim object itself is unchanged: the parameters apply at allocation only.
            assert claim["spec"] == created["spec"]
            # Claim gone: the controller lets go of the parameters (before it is stopped).
            rig.delete_all()
            wait_until(
                "two no longer in use",
                lambda: (
                    IN_USE_FINALIZER
                    not in (
                        api.get(parameters_path(namespace, "two"))["metadata"].get("finalizers")
                        or []
                    )
                ),
                DEADLINE,
            )
        finally:
            rig.delete_all()
            without_in_use_finalizer(api, namespace)
