"""What reaches the webhook: its rules and matchConditions, evaluated as the apiserver
does (tests/fakes/admission.py); the cluster tier checks them on the real apiserver."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.harness.webhook import webhook_configuration
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.k8s.objects import Obj
from dradriver.webhook import registration
from dradriver.webhook.validation import Settings
from tests.fakes.admission import Decision, decide

DRIVER = DEFAULT_DRIVER_NAME
API_VERSION = f"{DRIVER}/{params.VERSION}"
MANIFESTS = Path(__file__).resolve().parents[4] / "manifests"
(WEBHOOK,) = webhook_configuration("t", "https://x/validate", b"")["webhooks"]

RESOURCES = {
    "ResourceClaim": ("resource.k8s.io", "v1", "resourceclaims"),
    "ResourceClaimTemplate": ("resource.k8s.io", "v1", "resourceclaimtemplates"),
    params.KIND: (DRIVER, params.VERSION, params.PLURAL),
    net.KIND: (DRIVER, net.VERSION, net.PLURAL),
}


def request(kind: str, obj: Obj, operation: str = "CREATE", old: Obj | None = None) -> Obj:
    group, version, resource = RESOURCES[kind]
    return {
        "uid": "u",
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "operation": operation,
        "object": obj,
        "oldObject": old,
    }


def claim(*, classes: tuple[str, ...] = ("gpu.example.com",), drivers: tuple[str, ...] = ()) -> Obj:
    requests: list[Obj] = [
        {"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)
    ]
    config = [
        {"opaque": {"driver": d, "parameters": {"apiVersion": API_VERSION, "kind": "X"}}}
        for d in drivers
    ]
    devices: Obj = {"requests": requests}
    if config:
        devices["config"] = config
    return {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": devices}}


def template(claim_obj: Obj) -> Obj:
    return {"metadata": {"name": "t"}, "spec": {"spec": claim_obj["spec"]}}


def first_available(*classes: str) -> Obj:
    subrequests = [{"name": f"s{i}", "deviceClassName": c} for i, c in enumerate(classes)]
    return {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [
        {"name": "r", "firstAvailable": subrequests}
    ]}}}  # fmt: skip


def with_finalizer(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    out["metadata"]["finalizers"] = ["example.com/keep"]
    out["metadata"]["annotations"] = {"a": "b"}
    return out


OURS = claim(classes=(DRIVER,))
OTHERS = claim(classes=("gpu.example.com",), drivers=("gpu.example.com",))
DCP = {"metadata": {"name": "p"}, "spec": {"profile": "fast"}}
POOL = {"metadata": {"name": "p"}, "spec": {"attach": {"backend": "simulated"}}}


@pytest.mark.parametrize(
    ("review", "decision"),
    [
        # Other drivers' claims never reach the webhook.
        (request("ResourceClaim", OTHERS), Decision.SKIP),
        (request("ResourceClaim", claim(classes=())), Decision.SKIP),
        (request("ResourceClaim", first_available("gpu.example.com")), Decision.SKIP),
        (request("ResourceClaimTemplate", template(OTHERS)), Decision.SKIP),
        # Ours: a request for one of our classes, or opaque config for our driver.
        (request("ResourceClaim", OURS), Decision.CALL),
        (
            request("ResourceClaim", claim(classes=(f"{DRIVER}-mock-extended-resource",))),
            Decision.CALL,
        ),
        (request("ResourceClaim", claim(drivers=("gpu.example.com", DRIVER))), Decision.CALL),
        (request("ResourceClaim", first_available("gpu.example.com", DRIVER)), Decision.CALL),
        (request("ResourceClaimTemplate", template(OURS)), Decision.CALL),
        (request("ResourceClaimTemplate", template(claim(drivers=(DRIVER,)))), Decision.CALL),
        # Our CRDs always, whatever their content.
        (request(params.KIND, DCP), Decision.CALL),
        (request(params.KIND, {"metadata": {"name": "p"}}), Decision.CALL),
        (request(net.KIND, POOL), Decision.CALL),
        (request(params.KIND, DCP, "UPDATE", {**DCP, "spec": {"profile": "slow"}}), Decision.CALL),
        # An update that leaves the spec alone (finalizers, annotations) never needs it.
        (request("ResourceClaim", with_finalizer(OURS), "UPDATE", OURS), Decision.SKIP),
        (request("ResourceClaim", OURS, "UPDATE", with_finalizer(OURS)), Decision.SKIP),
        (
            request(
                "ResourceClaimTemplate", with_finalizer(template(OURS)), "UPDATE", template(OURS)
            ),
            Decision.SKIP,
        ),
        (request(params.KIND, with_finalizer(DCP), "UPDATE", DCP), Decision.SKIP),
        (request(net.KIND, with_finalizer(POOL), "UPDATE", POOL), Decision.SKIP),
        (request("ResourceClaim", OURS, "UPDATE", OTHERS), Decision.CALL),
        # The rules: DELETE and CONNECT are never sent.
        (request("ResourceClaim", OURS, "DELETE"), Decision.SKIP),
    ],
)
def test_only_what_concerns_the_driver_reaches_the_webhook(review: Obj, decision: Decision) -> None:
    assert decide(WEBHOOK, review) == decision


def test_conditions_never_fail_to_evaluate_on_partial_objects() -> None:
    """An evaluation error would deny the request (failurePolicy Fail): every access is
    guarded, including claims without devices and templates without an inner spec."""
    partial: list[Obj] = [
        {"metadata": {}, "spec": {}},
        {"metadata": {}, "spec": {"devices": {}}},
        {"metadata": {}, "spec": {"devices": {"requests": [{"name": "a"}], "config": [{}]}}},
        {"metadata": {}, "spec": {"devices": {"config": [{"opaque": {}}]}}},
        {"metadata": {}, "spec": {"devices": {"requests": [{"name": "a", "exactly": {}}]}}},
        {
            "metadata": {},
            "spec": {"devices": {"requests": [{"name": "a", "firstAvailable": [{}]}]}},
        },
    ]
    for obj in partial:
        for kind in ("ResourceClaim", "ResourceClaimTemplate"):
            wrapped = obj if kind == "ResourceClaim" else {"metadata": {}, "spec": obj["spec"]}
            assert decide(WEBHOOK, request(kind, wrapped)) == Decision.SKIP
            assert decide(WEBHOOK, request(kind, wrapped, "UPDATE", wrapped)) == Decision.SKIP
    assert decide(WEBHOOK, request("ResourceClaimTemplate", {"metadata": {}, "spec": {}})) == (
        Decision.SKIP
    )


def test_other_drivers_classes_and_names_are_rendered() -> None:
    (hook,) = webhook_configuration(
        "t", "https://x/validate", b"", driver="gpu.example.com", device_classes=["fast-gpu"]
    )["webhooks"]
    fast = claim(classes=("fast-gpu",))
    assert decide(hook, request("ResourceClaim", fast)) == Decision.CALL
    assert decide(hook, request("ResourceClaim", OURS)) == Decision.SKIP
    assert decide(hook, request("ResourceClaim", claim(drivers=("gpu.example.com",)))) == (
        Decision.CALL
    )
    assert Settings.for_driver("gpu.example.com").device_classes == {
        "gpu.example.com",
        "gpu.example.com-mock-extended-resource",
    }
    assert Settings.for_driver("d.example", ["x"]).device_classes == {"x"}
    assert Settings().device_classes == set(registration.device_classes(DRIVER))


@pytest.mark.parametrize("name", ["a' || true || '", "Gpu", "a b", ""])
def test_names_that_would_change_the_expression_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="name in a webhook match condition"):
        registration.match_conditions(DRIVER, [name])
    with pytest.raises(ValueError, match="name in a webhook match condition"):
        registration.match_conditions(name)


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_default_classes_are_the_ones_the_manifests_install() -> None:
    installed = {
        d["metadata"]["name"]
        for path in (MANIFESTS / "kubeletplugin").glob("*.yaml")
        for d in _docs(path)
        if d["kind"] == "DeviceClass"
    }
    assert installed == set(registration.device_classes(DRIVER))


def test_manifest_has_the_rendered_match_conditions() -> None:
    docs = _docs(MANIFESTS / "controller" / "webhook.yaml")
    (config,) = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    (hook,) = config["webhooks"]
    assert hook["matchConditions"] == registration.match_conditions(DRIVER)
    assert hook["matchConditions"] == WEBHOOK["matchConditions"]
    assert hook["failurePolicy"] == "Fail"
