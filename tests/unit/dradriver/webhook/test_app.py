"""The admission webhook's app: AdmissionReviews in, verdicts with readable messages out."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import math
import re
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from controller.app import ControllerApp, Options
from controller.main import build_parser as controller_parser
from controller.main import options_from
from devtools.cluster.pki import CertificateAuthority, CertPair
from devtools.harness.webhook import (
    CLUSTER_WEBHOOK_NAME,
    WEBHOOK_NAME,
    issue_serving_cert,
    rules,
    webhook_configuration,
)
from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.k8s.client import Connection, KubeClient
from dradriver.k8s.objects import Obj
from dradriver.runtime import Informer
from dradriver.webhook.app import OPERATIONS, bounded, build_app
from dradriver.webhook.server import WebhookServer, build_parser, main
from dradriver.webhook.validation import Settings, validate

DRIVER = "dradriver.dev"
API_VERSION = f"{DRIVER}/{params.VERSION}"
GOOD_SELECTOR = 'device.attributes["dradriver.dev"].model == "mock"'
BAD_SELECTOR = 'device.attributes["dradriver.dev"].model =='


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(build_app(Settings())) as c:
        yield c


def review(
    kind: str,
    obj: Obj,
    operation: str = "CREATE",
    old: Obj | None = None,
    uid: str = "uid-1",
) -> Obj:
    group = DRIVER if kind in (params.KIND, net.KIND) else "resource.k8s.io"
    version = {params.KIND: params.VERSION, net.KIND: net.VERSION}.get(kind, "v1")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "namespace": "ns",
            "name": obj.get("metadata", {}).get("name", ""),
            "operation": operation,
            "userInfo": {"username": "tester"},
            "object": obj,
            "oldObject": old,
        },
    }


def dcp(spec: Any) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": params.KIND,
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": spec,
    }


def pool(spec: Any, name: str = "fabric-a") -> Obj:
    return {
        "apiVersion": f"{DRIVER}/{net.VERSION}",
        "kind": net.KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


def pool_spec(**overrides: Any) -> Obj:
    spec: Obj = {
        "attach": {"backend": "simulated"},
        "devices": [{"name": "nic-0", "attributes": {"model": {"string": "x1"}}}],
    }
    spec.update(overrides)
    return spec


def claim(config: list[Obj] | None = None, requests: list[Obj] | None = None) -> Obj:
    devices: Obj = {
        "requests": requests
        if requests is not None
        else [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
    }
    if config is not None:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": devices},
    }


def opaque(parameters: Any, driver: str = DRIVER) -> Obj:
    return {"opaque": {"driver": driver, "parameters": parameters}}


def template(claim_obj: Obj) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"spec": claim_obj["spec"]},
    }


def post(client: TestClient, body: Obj) -> Obj:
    resp = client.post("/validate", json=body)
    assert resp.status_code == 200, resp.text
    out: Obj = resp.json()
    assert out["apiVersion"] == "admission.k8s.io/v1"
    assert out["kind"] == "AdmissionReview"
    response: Obj = out["response"]
    assert response["uid"] == body["request"]["uid"]
    return response


def allowed(client: TestClient, body: Obj) -> None:
    response = post(client, body)
    assert response == {"uid": body["request"]["uid"], "allowed": True}


def denied(client: TestClient, body: Obj) -> str:
    response = post(client, body)
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert response["status"]["reason"] == "Invalid"
    message: str = response["status"]["message"]
    return message


# --- DeviceClaimParameters ------------------------------------------------------------


def test_valid_parameters_are_admitted(client: TestClient) -> None:
    spec = {
        "env": {"MODE": "1"},
        "profile": "fast",
        "setupArgs": ["-v"],
        "count": 2,
        "selectors": [
            GOOD_SELECTOR,
            "device.capacity['dradriver.dev'].memory.isGreaterThan(quantity('1Gi'))",
        ],
        "allocationMode": "Immediate",
    }
    allowed(client, review(params.KIND, dcp(spec)))
    allowed(client, review(params.KIND, dcp({})))


def test_selector_that_does_not_compile_is_denied(client: TestClient) -> None:
    message = denied(client, review(params.KIND, dcp({"selectors": [GOOD_SELECTOR, BAD_SELECTOR]})))
    assert message.startswith("spec.selectors[1]: ")
    assert "Syntax error" in message


def test_selector_with_unknown_field_or_wrong_type_is_denied(client: TestClient) -> None:
    message = denied(client, review(params.KIND, dcp({"selectors": ["device.nosuch == 1"]})))
    assert "spec.selectors[0]: undefined field 'nosuch' of device" in message
    assert "driver, attributes, capacity" in message  # what a device has
    message = denied(client, review(params.KIND, dcp({"selectors": ["1 + 1"]})))
    assert message == "spec.selectors[0]: must evaluate to bool or the unknown type, not int"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"allocationMode": "Later"},
            "spec.allocationMode: Input should be 'Immediate' or 'WaitForFirstConsumer'",
        ),
        ({"count": 0}, "spec.count: Input should be greater than or equal to 1"),
        ({"count": 33}, "spec.count: Input should be less than or equal to 32"),
        ({"profile": "Fast One"}, "spec.profile: String should match pattern"),
        ({"env": {"1X": "a"}}, "spec.env['1X'] (key): String should match pattern"),
        (
            {"colour": "red"},
            "spec.colour: unknown field (allowed: env, profile, setupArgs, count, selectors, "
            "allocationMode)",
        ),
        ("fast", "spec: must be an object, got str"),
    ],
)
def test_invalid_parameters_name_field_and_allowed_values(
    client: TestClient, spec: Any, expected: str
) -> None:
    assert expected in denied(client, review(params.KIND, dcp(spec)))


def test_every_problem_is_reported(client: TestClient) -> None:
    message = denied(client, review(params.KIND, dcp({"count": 0, "allocationMode": "x"})))
    assert "spec.count:" in message
    assert "spec.allocationMode:" in message


def test_update_with_unchanged_spec_is_admitted(client: TestClient) -> None:
    """An object created before the webhook existed can still lose its finalizers."""
    bad = dcp({"selectors": [BAD_SELECTOR]})
    newer = copy.deepcopy(bad)
    newer["metadata"]["finalizers"] = []
    allowed(client, review(params.KIND, newer, "UPDATE", old=bad))
    changed = dcp({"selectors": [BAD_SELECTOR, "also bad ("]})
    assert "spec.selectors[0]" in denied(client, review(params.KIND, changed, "UPDATE", old=bad))


def test_delete_and_connect_are_admitted(client: TestClient) -> None:
    allowed(client, review(params.KIND, dcp({"count": 0}), "DELETE"))


# --- NetworkDevicePools -----------------------------------------------------------------


def test_valid_network_pool_is_admitted(client: TestClient) -> None:
    allowed(client, review(net.KIND, pool(pool_spec())))
    exec_spec = pool_spec(attach={"backend": "exec", "exec": {"command": ["/bin/attach"]}})
    allowed(client, review(net.KIND, pool(exec_spec)))


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            pool(pool_spec(attach={"backend": "tftp"})),
            "spec.attach.backend: Input should be 'simulated' or 'exec'",
        ),
        (
            pool(pool_spec(attach={"backend": "exec"})),
            "spec.attach: backend exec needs the exec section (command)",
        ),
        (
            pool(pool_spec(attach={"backend": "exec", "exec": {"command": ["attach"]}})),
            "spec.attach.exec: command[0] must be an absolute path, not 'attach'",
        ),
        (pool(pool_spec(devices=[{"name": "a"}, {"name": "a"}])), "device name 'a' is given twice"),
        (
            pool(pool_spec(devices=[])),
            "spec.devices: List should have at least 1 item after validation, not 0",
        ),
        (
            pool(pool_spec(devices=[{"name": "a", "colour": "red"}])),
            "spec.devices[0].colour: unknown field (allowed: name, attributes, capacity, env, "
            "nodeSelector)",
        ),
        (
            pool(pool_spec(attach={"backend": "simulated", "simulated": {"latency": 1}})),
            "spec.attach.simulated.latency: unknown field (allowed: latencySeconds, failDevices)",
        ),
        (
            pool(pool_spec(nodes="all")),
            "spec.nodes: unknown field (allowed: nodeSelector, attach, devices)",
        ),
        (
            pool(pool_spec(), name="fabric.a"),
            "metadata.name: NetworkDevicePool name 'fabric.a' is not a DNS label",
        ),
        (pool(None), "spec.attach: Field required; spec.devices: Field required"),
        (
            pool(
                pool_spec(
                    devices=[
                        {
                            "name": "a",
                            "attributes": {"dradriver.dev/model": {"string": "x"}},
                            "capacity": {"dradriver.dev/memory": {"value": "1Gi"}},
                        }
                    ]
                )
            ),
            "spec.devices[0].attributes.dradriver.dev/model: attribute 'dradriver.dev/model' "
            "spells out the driver's own domain; write 'model' (the domain is implied by the "
            'driver, and selectors still read it as device.attributes["dradriver.dev"].model); '
            "spec.devices[0].capacity.dradriver.dev/memory: capacity",
        ),
    ],
)
def test_invalid_network_pool_names_field_and_allowed_values(
    client: TestClient, obj: Obj, expected: str
) -> None:
    assert expected in denied(client, review(net.KIND, obj))
    assert "Value error" not in denied(client, review(net.KIND, obj))


def test_network_pool_update(client: TestClient) -> None:
    """Finalizer changes on a pool created before the webhook are admitted; spec changes
    are validated."""
    bad = pool(pool_spec(attach={"backend": "exec"}))
    newer = copy.deepcopy(bad)
    newer["metadata"]["finalizers"] = [net.FINALIZER]
    allowed(client, review(net.KIND, newer, "UPDATE", old=bad))
    good = pool(pool_spec())
    allowed(client, review(net.KIND, good, "UPDATE", old=good))
    assert "spec.attach.backend" in denied(
        client, review(net.KIND, pool(pool_spec(attach={"backend": "x"})), "UPDATE", old=good)
    )
    allowed(client, review(net.KIND, bad, "DELETE"))


def test_network_pool_of_another_group_is_not_ours(client: TestClient) -> None:
    body = review(net.KIND, pool(pool_spec(attach={"backend": "tftp"})))
    body["request"]["kind"]["group"] = "other.example.com"
    allowed(client, body)


# --- ResourceClaims and templates -----------------------------------------------------


DEVICE_CONFIG = {"apiVersion": API_VERSION, "kind": "DeviceConfig", "env": {"A": "1"}}
INLINE = {
    "apiVersion": API_VERSION,
    "kind": params.KIND,
    "spec": {"profile": "fast", "selectors": [GOOD_SELECTOR]},
}
REFERENCE = {"apiVersion": API_VERSION, "kind": params.REFERENCE_KIND, "name": "gpu-fast"}


def test_claim_without_config_is_admitted(client: TestClient) -> None:
    allowed(client, review("ResourceClaim", claim()))


def test_claim_with_valid_config_is_admitted(client: TestClient) -> None:
    config = [opaque(DEVICE_CONFIG), opaque(INLINE), opaque(REFERENCE)]
    allowed(client, review("ResourceClaim", claim(config)))
    allowed(client, review("ResourceClaimTemplate", template(claim(config))))


def test_other_drivers_config_is_not_ours(client: TestClient) -> None:
    other = opaque({"anything": True}, driver="gpu.example.com")
    allowed(client, review("ResourceClaim", claim([other])))


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (
            {"apiVersion": API_VERSION, "kind": "GpuConfig"},
            "spec.devices.config[0].opaque.parameters.kind: unknown kind 'GpuConfig'; "
            "dradriver.dev accepts DeviceConfig, DeviceClaimParameters, "
            "DeviceClaimParametersReference",
        ),
        (
            {**DEVICE_CONFIG, "apiVersion": "dradriver.dev/v2"},
            "spec.devices.config[0].opaque.parameters.apiVersion: 'dradriver.dev/v2' is not "
            "supported; use 'dradriver.dev/v1alpha1'",
        ),
        (
            {**DEVICE_CONFIG, "colour": "red"},
            "spec.devices.config[0].opaque.parameters: field colour: unknown field "
            "(allowed: apiVersion, kind, env, profile, setupArgs)",
        ),
        (
            {**DEVICE_CONFIG, "env": {"9X": "1"}},
            "spec.devices.config[0].opaque.parameters: field env: '9X' is not a "
            "valid environment variable name",
        ),
        (
            {**INLINE, "spec": {"allocationMode": "Soon"}},
            "spec.devices.config[0].opaque.parameters.spec.allocationMode: Input should be "
            "'Immediate' or 'WaitForFirstConsumer'",
        ),
        (
            {**INLINE, "spec": {"speed": 1}},
            "spec.devices.config[0].opaque.parameters.spec.speed: unknown field (allowed: env, "
            "profile, setupArgs, count, selectors, allocationMode)",
        ),
        (
            {**INLINE, "spec": {"selectors": [BAD_SELECTOR]}},
            "spec.devices.config[0].opaque.parameters.spec.selectors[0]: ",
        ),
        (
            {**REFERENCE, "name": "Not A Name"},
            "spec.devices.config[0].opaque.parameters.name: String should match pattern",
        ),
        (
            {**REFERENCE, "namespace": "other"},
            "spec.devices.config[0].opaque.parameters.namespace: unknown field "
            "(allowed: apiVersion, kind, name)",
        ),
        ("fast", "spec.devices.config[0].opaque.parameters: must be an object, got str"),
    ],
)
def test_bad_opaque_config_is_denied(client: TestClient, parameters: Any, expected: str) -> None:
    message = denied(client, review("ResourceClaim", claim([opaque(parameters)])))
    assert expected in message
    in_template = denied(
        client, review("ResourceClaimTemplate", template(claim([opaque(parameters)])))
    )
    assert expected.replace("spec.devices", "spec.spec.devices", 1) in in_template


def test_only_the_bad_entry_is_named(client: TestClient) -> None:
    bad = {"apiVersion": API_VERSION, "kind": "Nope"}
    message = denied(client, review("ResourceClaim", claim([opaque(DEVICE_CONFIG), opaque(bad)])))
    assert message.startswith("spec.devices.config[1].opaque.parameters.kind:")
    assert "config[0]" not in message


def test_request_selectors_for_our_classes_are_compiled(client: TestClient) -> None:
    requests: list[Obj] = [
        {
            "name": "a",
            "exactly": {
                "deviceClassName": DRIVER,
                "selectors": [{"cel": {"expression": GOOD_SELECTOR}}],
            },
        },
        {
            "name": "b",
            "exactly": {
                "deviceClassName": DRIVER,
                "selectors": [{"cel": {"expression": "device.nosuch"}}],
            },
        },
        {
            "name": "c",
            "firstAvailable": [
                {
                    "name": "x",
                    "deviceClassName": "other.example.com",
                    "selectors": [{"cel": {"expression": "not ours ("}}],
                },
                {
                    "name": "y",
                    "deviceClassName": DRIVER,
                    "selectors": [{"cel": {"expression": BAD_SELECTOR}}],
                },
            ],
        },
    ]
    message = denied(client, review("ResourceClaim", claim(requests=requests)))
    assert (
        "spec.devices.requests[1].exactly.selectors[0].cel.expression: undefined field" in message
    )
    assert "spec.devices.requests[2].firstAvailable[1].selectors[0].cel.expression:" in message
    assert "requests[0]" not in message
    assert "firstAvailable[0]" not in message  # another driver's class: not ours to judge


def test_v1beta1_request_shape_is_understood() -> None:
    request = {
        "name": "a",
        "deviceClassName": DRIVER,
        "selectors": [{"cel": {"expression": BAD_SELECTOR}}],
    }
    verdict = validate(Settings(), review("ResourceClaim", claim(requests=[request]))["request"])
    assert not verdict.allowed
    assert verdict.errors[0].startswith("spec.devices.requests[0].selectors[0].cel.expression:")


def test_configured_classes_and_driver_name() -> None:
    settings = Settings(driver="gpu.example.com", device_classes=frozenset({"gpus"}))
    requests = [
        {
            "name": "a",
            "exactly": {
                "deviceClassName": "gpus",
                "selectors": [{"cel": {"expression": BAD_SELECTOR}}],
            },
        }
    ]
    verdict = validate(settings, review("ResourceClaim", claim(requests=requests))["request"])
    assert not verdict.allowed
    # Our default driver's config is not this deployment's business.
    bad = opaque({"kind": "Nope"})
    assert validate(settings, review("ResourceClaim", claim([bad]))["request"]).allowed
    # Parameters objects are recognised by the configured group.
    assert validate(settings, review(params.KIND, dcp({"count": 0}))["request"]).allowed


def test_claim_update_with_unchanged_spec_is_admitted(client: TestClient) -> None:
    bad = claim([opaque({"kind": "Nope"})])
    newer = copy.deepcopy(bad)
    newer["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    allowed(client, review("ResourceClaim", newer, "UPDATE", old=bad))


def test_unknown_kinds_are_admitted(client: TestClient) -> None:
    body = review("ResourceClaim", claim([opaque({"kind": "Nope"})]))
    body["request"]["kind"] = {"group": "", "version": "v1", "kind": "ConfigMap"}
    allowed(client, body)


# --- protocol -------------------------------------------------------------------------


def _raw(body: Obj) -> bytes:
    """JSON text as Python writes it: lone surrogates become \\ud800 escapes, as they would
    arrive from any client (json.dumps keeps them ASCII)."""
    return json.dumps(body).encode()


def _with(**fields: Any) -> bytes:
    body = review(params.KIND, dcp({}))
    body["request"].update(fields)
    return _raw(body)


ENVELOPE = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'


@pytest.mark.parametrize(
    ("body", "uid", "message"),
    [
        # HTTP 400 with {"message"} before, not an AdmissionReview
        (b"{not json", "", "the body is not JSON: Expecting property name"),
        (b"", "", "the body is not JSON"),
        (b"\xff\xfe", "", "the body is not UTF-8: byte 0xff at offset 0"),
        (b"[1]", "", "must be a JSON object, got a JSON array"),
        (_raw({"kind": "Pod"}), "", "kind: must be 'AdmissionReview', got 'Pod'"),
        (
            _raw({**review(params.KIND, dcp({})), "apiVersion": "admission.k8s.io/v1beta1"}),
            "uid-1",
            "apiVersion: 'admission.k8s.io/v1beta1' is not supported; use 'admission.k8s.io/v1'",
        ),
        (_raw({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "", "request: "),
        (_with(uid=7), "", "request.uid: must be a JSON string, got a JSON number"),
        (_with(uid=None), "", "request.uid: must be a JSON string, got missing"),
        # HTTP 500 "Internal Server Error" before
        (ENVELOPE + b'{"uid":"u","object":' + b"[" * 5000 + b"]" * 5000 + b"}}", "", "deeper"),
        (
            ENVELOPE + b'{"uid":"u","object":' + b"[" * 200 + b"]" * 200 + b"}}",
            "u",
            "the body nests deeper than 128 levels",
        ),
        (
            _with(kind="ResourceClaim"),
            "uid-1",
            "request.kind: must be a JSON object, got a JSON string",
        ),
        (_with(kind=[1]), "uid-1", "request.kind: must be a JSON object, got a JSON array"),
        (_with(userInfo=[1]), "uid-1", "request.userInfo: must be a JSON object, got a JSON array"),
        (_with(userInfo="root"), "uid-1", "request.userInfo: must be a JSON object"),
        (_with(uid="\ud800"), "", "request.uid: is not valid Unicode (a lone surrogate)"),
        # admitted before: NaN is not JSON, an operation must be a string
        (_raw(review(params.KIND, dcp({"count": math.nan}))), "", "not JSON: NaN is not JSON"),
        (_with(operation=None), "uid-1", "request.operation: must be a JSON string, got missing"),
        (_with(object=[]), "uid-1", "request.object: must be a JSON object, got a JSON array"),
    ],
)
def test_malformed_bodies_get_an_admission_review_denial(
    client: TestClient, body: bytes, uid: str, message: str
) -> None:
    resp = client.post("/validate", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response = answer["response"]
    assert response["uid"] == uid
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["reason"] == "BadRequest"
    assert response["status"]["message"].startswith("malformed AdmissionReview: ")
    assert message in response["status"]["message"]


def test_an_empty_uid_is_a_valid_uid(client: TestClient) -> None:
    assert post(client, review(params.KIND, dcp({}), uid=""))["allowed"] is True


@pytest.mark.parametrize(
    ("where", "make"),
    [
        (
            "spec.devices.requests[0].exactly.selectors[0].cel.expression",
            lambda s: claim(
                requests=[
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "selectors": [{"cel": {"expression": s}}],
                        },
                    }
                ]
            ),
        ),
        (
            "spec.devices.requests[0].firstAvailable[0].selectors[0].cel.expression",
            lambda s: claim(
                requests=[
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {
                                "name": "a",
                                "deviceClassName": DRIVER,
                                "selectors": [{"cel": {"expression": s}}],
                            }
                        ],
                    }
                ]
            ),
        ),
    ],
)
def test_lone_surrogate_in_a_selector_names_the_field(
    client: TestClient, where: str, make: Any
) -> None:
    """It was an "internal error" with no field before (the CEL compiler cannot encode it)."""
    body = review("ResourceClaim", make("device.driver == '\ud800'"))
    resp = client.post(
        "/validate", content=_raw(body), headers={"content-type": "application/json"}
    )
    response = resp.json()["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        f"{where}: character '\\ud800' at offset 18 is a lone surrogate, not valid Unicode"
    )
    # Inline parameters and DeviceClaimParameters name the field too (pydantic's check).
    inline = opaque(
        {"apiVersion": API_VERSION, "kind": params.KIND, "spec": {"selectors": ["\ud800"]}}
    )
    for body in (
        review("ResourceClaim", claim([inline])),
        review(params.KIND, dcp({"selectors": ["\ud800"]})),
    ):
        resp = client.post(
            "/validate", content=_raw(body), headers={"content-type": "application/json"}
        )
        message = resp.json()["response"]["status"]["message"]
        assert "selectors[0]: Input should be a valid string" in message, message


def test_device_config_profile_must_be_a_dns_label(client: TestClient) -> None:
    bad = claim([opaque({"apiVersion": API_VERSION, "kind": "DeviceConfig", "profile": "../x"})])
    assert denied(client, review("ResourceClaim", bad)) == (
        "spec.devices.config[0].opaque.parameters: field profile: profile '../x' is not a DNS "
        "label: use lowercase letters, digits and '-', starting and ending with a letter or digit"
    )


def test_metrics_labels_are_bounded(client: TestClient) -> None:
    """2 000 unauthenticated reviews with a new operation, kind or group each: before, each
    added a time series to /metrics for ever (2 000 requests: 16.8 MB)."""
    for i in range(500):
        body = review(params.KIND, dcp({}), uid=f"u{i}")
        body["request"]["operation"] = f"OP-{i}-" + "x" * 1000
        post(client, body)
        body = review(params.KIND, dcp({}), uid=f"k{i}")
        body["request"]["kind"] = {"group": f"g{i}.example", "version": "v1", "kind": f"K{i}"}
        post(client, body)
        body["request"]["kind"] = {"group": DRIVER, "version": "v1", "kind": "x" * i}
        body["request"]["operation"] = "DELETE"
        post(client, body)
        client.post("/validate", content=f'{{"kind": "{i}"}}'.encode())
    text = client.get("/metrics").text
    series = [
        line for line in text.splitlines() if line.startswith("dradriver_webhook_requests_total{")
    ]
    labels = [dict(re.findall(r'(\w+)="([^"]*)"', line)) for line in series]
    assert {(x["kind"], x["operation"], x["outcome"]) for x in labels} == {
        (params.KIND, "other", "allowed"),
        ("other", "CREATE", "allowed"),
        ("other", "DELETE", "allowed"),
        ("other", "other", "malformed"),
    }
    assert len(text) < 20_000
    assert 'outcome="allowed"} 500.0' in text and 'outcome="malformed"} 500.0' in text
    assert bounded("CREATE", OPERATIONS) == "CREATE"
    assert bounded(7, OPERATIONS) == bounded("create", OPERATIONS) == "other"


def test_garbage_inside_a_review_is_denied_not_a_crash(client: TestClient) -> None:
    body = review("ResourceClaim", claim())
    body["request"]["object"]["spec"] = {"devices": {"config": ["x", 3], "requests": [None]}}
    allowed(client, body)
    body["request"]["object"]["spec"] = {"devices": {"config": [{"opaque": {"driver": DRIVER}}]}}
    assert "must be an object, got NoneType" in denied(client, body)


def test_wrong_json_types_where_objects_and_strings_belong_are_denied_or_ignored(
    client: TestClient,
) -> None:
    """Found by tests/fuzz/test_webhook_fuzz.py: both were "internal error" denials."""
    body = review(net.KIND, pool(pool_spec()))
    body["request"]["object"]["metadata"] = [1]
    assert denied(client, body) == "metadata: must be an object"
    body["request"]["object"]["metadata"] = {"name": 7}
    assert denied(client, body) == "metadata.name: must be a string"
    # An unhashable class name is not one of ours (the apiserver's schema denies it anyway).
    odd = claim(requests=[{"name": "a", "exactly": {"deviceClassName": [DRIVER]}}])
    allowed(client, review("ResourceClaim", odd))


def test_health_ready_and_metrics(client: TestClient) -> None:
    assert client.get("/healthz").text == "ok\n"
    assert client.get("/readyz").status_code == 200
    allowed(client, review(params.KIND, dcp({})))
    denied(client, review(params.KIND, dcp({"count": 0})))
    text = client.get("/metrics").text
    assert (
        'dradriver_webhook_requests_total{kind="DeviceClaimParameters",operation="CREATE",'
        'outcome="allowed"} 1.0' in text
    )
    assert 'outcome="denied"} 1.0' in text
    assert "dradriver_webhook_request_duration_seconds_count 2.0" in text
    denied(client, review(net.KIND, pool({})))
    assert (
        'dradriver_webhook_requests_total{kind="NetworkDevicePool",operation="CREATE",'
        'outcome="denied"} 1.0' in client.get("/metrics").text
    )


def test_readyz_follows_the_given_probe() -> None:
    with TestClient(build_app(ready=lambda: (False, "caches not synced"))) as c:
        resp = c.get("/readyz")
    assert resp.status_code == 503
    assert resp.text == "not ready: caches not synced\n"


# --- server over TLS, registration ----------------------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    CertificateAuthority(CertPair(tmp_path / "ca.crt", tmp_path / "ca.key"), "test-ca")
    return tmp_path


def test_server_over_tls(pki: Path) -> None:
    async def run() -> None:
        pair = issue_serving_cert(pki, pki / "serving")
        server = WebhookServer(build_app(), "127.0.0.1:0", pair.cert, pair.key)
        await server.start()
        try:
            tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            async with httpx.AsyncClient(verify=tls) as http:
                base = f"https://127.0.0.1:{server.port}"
                assert (await http.get(f"{base}/healthz")).text == "ok\n"
                resp = await http.post(f"{base}/validate", json=review(params.KIND, dcp({})))
                assert resp.json()["response"]["allowed"] is True
            # Plain HTTP is not served.
            async with httpx.AsyncClient() as http:
                with pytest.raises(httpx.HTTPError):
                    await http.get(f"http://127.0.0.1:{server.port}/healthz")
        finally:
            await server.stop()

    asyncio.run(run())


def test_serving_cert_is_for_loopback(pki: Path) -> None:
    from cryptography import x509

    pair = issue_serving_cert(pki, pki / "serving")
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_webhook_configuration() -> None:
    doc = webhook_configuration(
        "t", "https://127.0.0.1:1/validate", b"PEM", namespace_labels={"a": "b"}
    )
    hook = doc["webhooks"][0]
    for each in doc["webhooks"]:
        assert each["clientConfig"] == {
            "url": "https://127.0.0.1:1/validate",
            "caBundle": base64.b64encode(b"PEM").decode(),
        }
        assert each["failurePolicy"] == "Fail"
    assert hook["namespaceSelector"] == {"matchLabels": {"a": "b"}}
    resources = {r for rule in hook["rules"] for r in rule["resources"]}
    assert resources == {"resourceclaims", "resourceclaimtemplates", params.PLURAL}
    every = {r for rule in rules() for r in rule["resources"]}
    assert every == {"resourceclaims", "resourceclaimtemplates", params.PLURAL, net.PLURAL}
    assert all(rule["operations"] == ["CREATE", "UPDATE"] for rule in rules())


def test_labelled_configuration_scopes_cluster_scoped_pools_by_their_labels() -> None:
    """A namespaceSelector never skips cluster-scoped objects: pools get a second webhook
    selecting them by their own labels, so tests sharing a cluster stay apart."""
    doc = webhook_configuration("t", "https://x/validate", b"", namespace_labels={"a": "b"})
    namespaced, cluster = doc["webhooks"]
    assert namespaced["name"] == WEBHOOK_NAME
    assert all(r["scope"] == "Namespaced" for r in namespaced["rules"])
    assert cluster["name"] == CLUSTER_WEBHOOK_NAME
    assert cluster["rules"] == [
        {
            "apiGroups": [DRIVER],
            "apiVersions": [net.VERSION],
            "operations": ["CREATE", "UPDATE"],
            "resources": [net.PLURAL],
            "scope": "Cluster",
        }
    ]
    assert cluster["objectSelector"] == {"matchLabels": {"a": "b"}}
    assert "namespaceSelector" not in cluster
    # Unscoped: one webhook with every rule, as in the manifest.
    (hook,) = webhook_configuration("t", "https://x/validate", b"", failure_policy="Ignore")[
        "webhooks"
    ]
    assert hook["rules"] == rules()
    assert hook["failurePolicy"] == "Ignore"
    assert {r["resources"][0] for r in rules(scope="Cluster")} == {net.PLURAL}


def test_manifest_matches_the_registration_rules() -> None:
    import yaml

    path = Path(__file__).resolve().parents[4] / "manifests" / "controller" / "webhook.yaml"
    docs = {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}
    (hook,) = docs["ValidatingWebhookConfiguration"]["webhooks"]
    expected = webhook_configuration("x", "https://unused", b"")["webhooks"][0]
    assert hook["rules"] == expected["rules"]
    assert hook["matchConditions"] == expected["matchConditions"]
    assert hook["name"] == expected["name"]
    service = hook["clientConfig"]["service"]
    assert (service["namespace"], service["name"]) == (
        docs["Service"]["metadata"]["namespace"],
        docs["Service"]["metadata"]["name"],
    )
    assert service["path"] == "/validate"
    # The controller Deployment serves it: the Service selects its pods' webhook port.
    deployment_path = path.with_name("deployment.yaml")
    deployment = next(
        d
        for d in yaml.safe_load_all(deployment_path.read_text())
        if d and d["kind"] == "Deployment"
    )
    template = deployment["spec"]["template"]
    assert docs["Service"]["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (container,) = template["spec"]["containers"]
    target = docs["Service"]["spec"]["ports"][0]["targetPort"]
    (port,) = [p for p in container["ports"] if p["name"] == target]
    args = controller_parser().parse_args(container["command"][1:])
    assert args.webhook_address == f":{port['containerPort']}"
    assert "Deployment" not in docs  # no separate webhook Deployment any more


def test_command_line(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["--cert", "c", "--key", "k", "--device-class", "a", "--device-class", "b"]
    )
    assert args.address == ":8443"
    assert args.device_class == ["a", "b"]
    with pytest.raises(SystemExit):
        main(["--address", "127.0.0.1:0"])  # no certificate
    with pytest.raises(SystemExit):
        main(["--cert", str(tmp_path / "no.crt"), "--key", str(tmp_path / "no.key")])


# --- served by dradriver-controller ---------------------------------------------------


def test_controller_webhook_flags(pki: Path) -> None:
    pair = issue_serving_cert(pki, pki / "serving")
    parser = controller_parser()
    base = ["--webhook-address", "127.0.0.1:0"]
    options = options_from(
        parser.parse_args([*base, "--webhook-cert", str(pair.cert), "--webhook-key", str(pair.key)])
    )
    assert (options.webhook_address, options.webhook_cert, options.webhook_key) == (
        "127.0.0.1:0",
        pair.cert,
        pair.key,
    )
    assert options_from(parser.parse_args([])).webhook_address is None
    for argv, message in [
        (base, "--webhook-address needs --webhook-cert"),
        ([*base, "--webhook-cert", str(pair.cert)], "--webhook-address needs --webhook-key"),
        (
            [*base, "--webhook-cert", str(pki / "no.crt"), "--webhook-key", str(pair.key)],
            "--webhook-cert: ",
        ),
        (["--webhook-address", "nope", "--webhook-cert", "c", "--webhook-key", "k"], "HOST:PORT"),
        (["--webhook-cert", str(pair.cert)], "need --webhook-address"),
    ]:
        with pytest.raises(ValueError, match=message.replace("-", "\\-")):
            options_from(parser.parse_args(argv))


def _controller(**options: Any) -> ControllerApp:
    conn = Connection("https://127.0.0.1:1", ssl.create_default_context())
    return ControllerApp(Options(driver_name=DRIVER, **options), KubeClient(conn, "test"))


def test_controller_webhook_app_has_the_controllers_readiness_and_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = _controller(leader_elect=False)
    with TestClient(app.webhook_app()) as c:
        resp = c.get("/readyz")
        assert resp.status_code == 503
        assert resp.text.startswith("not ready: caches not synced: resourceclaims")
        assert resp.text == f"not ready: {app.ready()[1]}\n"
        # Validation needs neither the leader nor synced caches.
        assert "spec.count" in denied(c, review(params.KIND, dcp({"count": 0})))
        text = c.get("/metrics").text
        assert 'dradriver_webhook_requests_total{kind="DeviceClaimParameters"' in text
        assert "dradriver_workqueue_depth" in text  # the controller's own registry
        monkeypatch.setattr(Informer, "has_synced", property(lambda self: True))
        resp = c.get("/readyz")
        assert (resp.status_code, resp.text) == (200, "ok: caches synced (no leader election)\n")


def test_capacity_requests_name_capacity_with_or_without_the_driver_domain(
    client: TestClient,
) -> None:
    def claim_asking(*names: str, cls: str = DRIVER) -> Obj:
        exactly = {"deviceClassName": cls, "capacity": {"requests": {n: "4Gi" for n in names}}}
        sub = {"name": "s", **exactly}
        return claim(
            requests=[{"name": "m", "exactly": exactly}, {"name": "f", "firstAvailable": [sub]}]
        )

    # Either spelling is one name, as the 1.38 scheduler resolves it.
    allowed(client, review("ResourceClaim", claim_asking(f"{DRIVER}/memory")))
    allowed(client, review("ResourceClaim", claim_asking("memory", "other.example.com/memory")))
    # Both at once: the scheduler refuses the claim, so the webhook says why.
    message = denied(client, review("ResourceClaim", claim_asking("memory", f"{DRIVER}/memory")))
    assert message.count("asks for capacity") == 2
    assert (
        "spec.devices.requests[0].exactly.capacity.requests.dradriver.dev/memory: request 'm' "
        "asks for capacity 'memory' both as 'memory' and as 'dradriver.dev/memory', which name "
        "the same capacity of dradriver.dev devices: keep one"
    ) in message
    assert (
        "spec.devices.requests[1].firstAvailable[0].capacity.requests.dradriver.dev/memory: "
        "request 'f/s' asks for capacity 'memory' both as"
    ) in message
    template_message = denied(
        client,
        review("ResourceClaimTemplate", template(claim_asking(f"{DRIVER}/memory", "memory"))),
    )
    assert "spec.spec.devices.requests[0].exactly.capacity.requests.dradriver.dev/memory" in (
        template_message
    )
    # Another driver's class is not ours to judge.
    other = claim_asking("memory", f"{DRIVER}/memory", cls="other.example.com")
    allowed(client, review("ResourceClaim", other))
