"""The admission webhook's real FastAPI app on hostile bodies: every body posted gets HTTP
200 and a well-formed AdmissionReview, carrying the request's uid when that is a valid
string; well-formed reviews never reach the "internal error" fallback."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.harness.webhook import webhook_configuration
from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.k8s.objects import Obj
from dradriver.webhook.app import build_app
from dradriver.webhook.review import valid_text
from dradriver.webhook.validation import Settings, validate
from tests.fakes.admission import Decision, decide

DRIVER = "dradriver.dev"
API_VERSION = f"{DRIVER}/{params.VERSION}"
CLIENT = TestClient(build_app(Settings()))

FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Every code point, lone surrogates included, and JSON's own troublemakers weighted up.
any_char = st.characters(codec=None, exclude_categories=[])
hostile_text = st.text(
    st.sampled_from('[]{}"\\:,\n\x00\ud800\udfff\u2028é') | any_char, max_size=16
)
names = st.sampled_from(
    [
        DRIVER,
        "other.example.com",
        "gpu",
        "a",
        "",
        "DeviceConfig",
        params.KIND,
        params.REFERENCE_KIND,
    ]
)
text = names | hostile_text
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)
selectors = (
    st.sampled_from(
        [
            'device.attributes["dradriver.dev"].model == "mock"',
            'device.attributes["dradriver.dev"].model ==',
            "device.nosuch == 1",
            "'\ud800' == device.driver",
            "1",
            "",
        ]
    )
    | hostile_text
)


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``value`` most of the time, any JSON value (the wrong type) sometimes."""
    return st.one_of(value, value, value, json_values)


def rarely_wrong(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``value`` nine times in ten: for the envelope, so that most reviews reach validation."""
    return st.integers(0, 9).flatmap(lambda i: json_values if i == 0 else value)


spec_fields = st.fixed_dictionaries(
    {},
    optional={
        "env": maybe(st.dictionaries(text, text, max_size=3)),
        "profile": maybe(text),
        "setupArgs": maybe(st.lists(text, max_size=3)),
        "count": maybe(st.integers(min_value=-2, max_value=40)),
        "selectors": maybe(st.lists(selectors, max_size=3)),
        "allocationMode": maybe(st.sampled_from(["Immediate", "WaitForFirstConsumer", "Soon"])),
        "colour": json_values,
    },
)
opaque_parameters = st.fixed_dictionaries(
    {
        "apiVersion": maybe(st.sampled_from([API_VERSION, f"{DRIVER}/v9", "v1"])),
        "kind": maybe(
            st.sampled_from([*("DeviceConfig", params.KIND, params.REFERENCE_KIND), "Gpu"])
        ),
    },
    optional={
        "spec": maybe(spec_fields),
        "name": maybe(text),
        "env": maybe(st.dictionaries(text, text, max_size=3)),
        "profile": maybe(text),
        "setupArgs": maybe(st.lists(text, max_size=3)),
    },
)
config_entries = st.fixed_dictionaries(
    {
        "opaque": maybe(
            st.fixed_dictionaries({"driver": maybe(names), "parameters": maybe(opaque_parameters)})
        )
    },
    optional={"requests": maybe(st.lists(text, max_size=2))},
)
cel_selectors = st.lists(
    maybe(
        st.fixed_dictionaries(
            {"cel": maybe(st.fixed_dictionaries({"expression": maybe(selectors)}))}
        )
    ),
    max_size=3,
)
exact = st.fixed_dictionaries(
    {"deviceClassName": maybe(names)}, optional={"selectors": maybe(cel_selectors)}
)
requests = st.fixed_dictionaries(
    {"name": maybe(text)},
    optional={
        "exactly": maybe(exact),
        "firstAvailable": maybe(st.lists(maybe(exact), max_size=3)),
        "deviceClassName": maybe(names),  # the v1beta1 shape
        "selectors": maybe(cel_selectors),
    },
)
claim_specs = st.fixed_dictionaries(
    {
        "devices": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "requests": maybe(st.lists(maybe(requests), max_size=3)),
                    "config": maybe(st.lists(maybe(config_entries), max_size=3)),
                },
            )
        )
    }
)
pool_specs = st.fixed_dictionaries(
    {},
    optional={
        "attach": maybe(
            st.fixed_dictionaries(
                {"backend": maybe(st.sampled_from(["simulated", "exec", "tftp"]))},
                optional={"exec": json_values, "simulated": json_values},
            )
        ),
        "devices": maybe(
            st.lists(
                maybe(
                    st.fixed_dictionaries(
                        {"name": maybe(text)},
                        optional={"attributes": json_values, "capacity": json_values},
                    )
                ),
                max_size=3,
            )
        ),
        "nodeSelector": json_values,
    },
)
RESOURCES = {
    "ResourceClaim": "resourceclaims",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    params.KIND: params.PLURAL,
    net.KIND: net.PLURAL,
}
KIND_REFS = {
    "ResourceClaim": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
    "ResourceClaimTemplate": {
        "group": "resource.k8s.io",
        "version": "v1",
        "kind": "ResourceClaimTemplate",
    },
    params.KIND: {"group": DRIVER, "version": params.VERSION, "kind": params.KIND},
    net.KIND: {"group": DRIVER, "version": net.VERSION, "kind": net.KIND},
}


@st.composite
def objects(draw: st.DrawFn, kind: str) -> Any:
    if kind == "ResourceClaim":
        spec = draw(maybe(claim_specs))
    elif kind == "ResourceClaimTemplate":
        spec = draw(maybe(st.fixed_dictionaries({"spec": maybe(claim_specs)})))
    elif kind == params.KIND:
        spec = draw(maybe(spec_fields))
    else:
        spec = draw(maybe(pool_specs))
    obj = {"metadata": draw(maybe(st.fixed_dictionaries({"name": maybe(text)}))), "spec": spec}
    return draw(rarely_wrong(st.just(obj)))


@st.composite
def reviews(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(sorted(KIND_REFS)))
    request: dict[str, Any] = {
        "uid": draw(rarely_wrong(st.uuids().map(str) | hostile_text)),
        "kind": draw(rarely_wrong(st.just(KIND_REFS[kind]))),
        "operation": draw(rarely_wrong(st.sampled_from(["CREATE", "UPDATE", "DELETE"]) | text)),
        "object": draw(objects(kind)),
    }
    if draw(st.booleans()):
        request["oldObject"] = draw(st.one_of(st.just(request["object"]), objects(kind)))
    envelope = {
        "namespace": text,
        "name": text,
        "userInfo": st.fixed_dictionaries({"username": text}),
        "resource": st.just({"group": "g", "version": "v", "resource": "r"}),
        "subResource": text,
        "dryRun": st.booleans(),
    }
    for field, value in envelope.items():
        if draw(st.booleans()):
            request[field] = draw(rarely_wrong(value))
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    for field, good in (("apiVersion", "admission.k8s.io/v1"), ("kind", "AdmissionReview")):
        if draw(st.integers(0, 19)) == 0:
            body[field] = draw(st.one_of(json_values, st.just(good.upper())))
    return draw(rarely_wrong(st.just(body)))


def answer(content: bytes) -> dict[str, Any]:
    """Post ``content``; the answer must be a well-formed AdmissionReview."""
    resp = CLIENT.post("/validate", content=content, headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["apiVersion"] == "admission.k8s.io/v1"
    assert out["kind"] == "AdmissionReview"
    response = out["response"]
    assert isinstance(response["uid"], str)
    assert isinstance(response["allowed"], bool)
    if response["allowed"]:
        assert set(response) == {"uid", "allowed"}
    else:
        status = response["status"]
        assert status["code"] in (400, 422)
        assert status["reason"] == ("BadRequest" if status["code"] == 400 else "Invalid")
        assert isinstance(status["message"], str) and status["message"]
    resp.content.decode("ascii")  # escaped: nothing in a message can break the encoding
    return dict(response)


def expected_uid(body: Any) -> str:
    request = body.get("request") if isinstance(body, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if valid_text(uid) else ""


@FUZZ
@given(reviews())
def test_every_review_gets_an_admission_review_with_its_uid(body: Any) -> None:
    response = answer(json.dumps(body).encode())
    assert response["uid"] == expected_uid(body)
    if not response["allowed"]:
        message = response["status"]["message"]
        assert "internal error" not in message, message


@FUZZ
@given(st.binary(max_size=300))
def test_any_bytes(content: bytes) -> None:
    answer(content)


@FUZZ
@given(st.lists(st.sampled_from(['{"', '":', "[", "]", "{", "}", ",", '"uid"', '"request"',
                                 '"\\ud800"', "1e999", "NaN", "-", "0", "true", "null",
                                 '"apiVersion":"admission.k8s.io/v1"', '"kind":"AdmissionReview"']),
                max_size=60).map("".join))  # fmt: skip
def test_json_like_text(content: str) -> None:
    answer(content.encode())


@settings(FUZZ, max_examples=60)
@given(
    st.integers(min_value=1, max_value=3000),
    st.sampled_from(["object", "kind", "uid", "oldObject", "userInfo"]),
    st.sampled_from([("[", "]"), ('{"a":', "}")]),
)
def test_deep_nesting(depth: int, field: str, brackets: tuple[str, str]) -> None:
    opener, closer = brackets
    nested = opener * depth + "1" + closer * depth
    uid = '"uid":"u",' if field != "uid" else ""
    content = (
        '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{'
        f'{uid}"kind":{{"group":"{DRIVER}","version":"v1alpha1","kind":"{params.KIND}"}},'
        f'"operation":"CREATE","{field}":{nested}}}}}'
    )
    response = answer(content.encode())
    assert response["uid"] == ("u" if field != "uid" and depth < 900 else response["uid"])


# Claims as the apiserver's schema lets them through (it validates before validating
# webhooks are called): the structure is fixed, opaque parameters and selectors are free.
schema_valid_exact = st.fixed_dictionaries(
    {"deviceClassName": names.filter(bool)},
    optional={
        "selectors": st.lists(
            st.fixed_dictionaries({"cel": st.fixed_dictionaries({"expression": selectors})}),
            max_size=2,
        ),
        "count": st.integers(min_value=1, max_value=4),
    },
)
schema_valid_specs = st.fixed_dictionaries(
    {
        "devices": st.fixed_dictionaries(
            {},
            optional={
                "requests": st.lists(
                    st.one_of(
                        st.fixed_dictionaries(
                            {"name": st.just("r"), "exactly": schema_valid_exact}
                        ),
                        st.fixed_dictionaries(
                            {
                                "name": st.just("r"),
                                "firstAvailable": st.lists(
                                    schema_valid_exact.map(lambda e: {"name": "s", **e}),
                                    min_size=1,
                                    max_size=3,
                                ),
                            }
                        ),
                    ),
                    max_size=3,
                ),
                "config": st.lists(
                    st.fixed_dictionaries(
                        {
                            "opaque": st.fixed_dictionaries(
                                {
                                    "driver": names.filter(bool),
                                    "parameters": maybe(opaque_parameters),
                                }
                            )
                        },
                        optional={"requests": st.lists(st.just("r"), max_size=1)},
                    ),
                    max_size=3,
                ),
            },
        )
    }
)


@st.composite
def admission_requests(draw: st.DrawFn) -> Any:
    """AdmissionRequests as the apiserver sends them after its own checks: a kind this
    webhook is registered for, CREATE or UPDATE, a schema-valid claim (template) or a
    fuzzed spec of our CRDs (their schema is ours: the webhook checks it again)."""
    kind = draw(st.sampled_from(sorted(KIND_REFS)))
    ref = KIND_REFS[kind]

    def new_object() -> Obj:
        metadata = {"name": "x", "finalizers": draw(st.lists(st.just("f"), max_size=1))}
        if kind == "ResourceClaim":
            return {"metadata": metadata, "spec": draw(schema_valid_specs)}
        if kind == "ResourceClaimTemplate":
            return {"metadata": metadata, "spec": {"spec": draw(schema_valid_specs)}}
        spec = draw(spec_fields if kind == params.KIND else pool_specs)
        return {"metadata": metadata, "spec": spec}

    obj = new_object()
    operation = draw(st.sampled_from(["CREATE", "UPDATE"]))
    old = None
    if operation == "UPDATE":  # the same spec (a metadata change) or another one
        old = {**obj, "metadata": {"name": "x"}} if draw(st.booleans()) else new_object()
    return {
        "uid": "u",
        "kind": ref,
        "resource": {"group": ref["group"], "version": ref["version"], "resource": RESOURCES[kind]},
        "operation": operation,
        "object": obj,
        "oldObject": old,
    }


(WEBHOOK,) = webhook_configuration("fuzz", "https://x/validate", b"")["webhooks"]


@FUZZ
@given(admission_requests())
def test_what_the_match_conditions_skip_the_webhook_would_admit(request: Any) -> None:
    """The matchConditions only keep away requests that do not concern the driver: had the
    webhook been called for a skipped request, it would have admitted it. And they never
    fail to evaluate on what the apiserver admits, which failurePolicy Fail would make a
    denial of any claim, other drivers' included."""
    decision = decide(WEBHOOK, request)
    assert decision != Decision.ERROR
    if decision == Decision.SKIP:
        verdict = validate(Settings(), request)
        assert verdict.allowed, verdict.message
