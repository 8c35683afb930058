"""DeviceClaimParameters: models, generated CRD, opaque-config references."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from devtools import crds
from dradriver.api import parameters as p
from dradriver.api.crdgen import structural
from dradriver.api.opaqueconfig import DeviceConfig, EffectiveConfig, parse_parameters

DRIVER = "dradriver.dev"
API = f"{DRIVER}/v1alpha1"


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        if "type" in node or "properties" in node:
            out.append((path, node))
        for key, value in node.items():
            if key in ("properties",):
                for name, sub in value.items():
                    out.extend(walk(sub, f"{path}.{name}"))
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                out.extend(walk(value, f"{path}{key}"))
    return out


# --- CRD --------------------------------------------------------------------------


def test_committed_crds_match_the_models() -> None:
    assert crds.main(["--check"]) == 0, "run python -m devtools.crds --write"
    committed = crds.crd_path(p.CRD_KIND).read_text()
    assert committed == p.crd_yaml()


def test_check_fails_on_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crds.main(["--write", "--dir", str(tmp_path)]) == 0
    stale = tmp_path / p.CRD_FILE_NAME
    stale.write_text(p.crd_yaml().replace("maxItems: 32", "maxItems: 31"))
    assert crds.main(["--check", "--dir", str(tmp_path)]) == 1
    assert "out of date" in capsys.readouterr().out
    assert crds.main(["--write", "--dir", str(tmp_path)]) == 0
    assert crds.main(["--check", "--dir", str(tmp_path)]) == 0


def test_count_and_selectors_say_they_apply_to_controller_allocation_only() -> None:
    spec = yaml.safe_load(p.crd_yaml())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = spec["properties"]["spec"]["properties"]
    for name in ("count", "selectors"):
        assert "controller (Immediate) allocation only" in fields[name]["description"], name


def test_crd_shape() -> None:
    crd = yaml.safe_load(p.crd_yaml())
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "deviceclaimparameters.dradriver.dev"
    assert spec["group"] == DRIVER and spec["scope"] == "Namespaced"
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Profile": ".spec.profile",
        "Mode": ".spec.allocationMode",
        "Valid": '.status.conditions[?(@.type=="Valid")].status',
        "Age": ".metadata.creationTimestamp",
    }
    schema = version["schema"]["openAPIV3Schema"]
    props = schema["properties"]["spec"]["properties"]
    assert set(props) == {"env", "profile", "setupArgs", "count", "selectors", "allocationMode"}
    assert props["allocationMode"]["default"] == "WaitForFirstConsumer"
    assert props["allocationMode"]["enum"] == ["Immediate", "WaitForFirstConsumer"]
    assert props["count"]["minimum"] == 1
    assert "self.all(k" in props["env"]["x-kubernetes-validations"][0]["rule"]
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert p.crd("gpu.example.com")["spec"]["group"] == "gpu.example.com"


def test_schema_is_structural() -> None:
    schema = p.openapi_schema()
    text = yaml.safe_dump(schema)
    for banned in (
        "$ref",
        "$defs",
        "anyOf",
        "title",
        "const",
        "patternProperties",
        "propertyNames",
    ):
        assert banned not in text, banned
    assert "x-kubernetes-preserve-unknown-fields" not in text
    for path, node in walk(schema):
        assert "type" in node, path
        assert node.get("additionalProperties", {}) is not False, path


def test_structural_converts_and_refuses() -> None:
    class Bounds(BaseModel):
        positive: int = Field(gt=0)

    prop = structural(Bounds.model_json_schema())["properties"]["positive"]
    assert prop["minimum"] == 0 and prop["exclusiveMinimum"] is True

    class Union(BaseModel):
        either: int | str

    with pytest.raises(ValueError, match="either: anyOf"):
        structural(Union.model_json_schema())

    with pytest.raises(ValueError, match="uniqueItems"):
        structural({"type": "array", "items": {"type": "string"}, "uniqueItems": True})


# --- spec validation --------------------------------------------------------------


def test_spec_defaults_and_aliases() -> None:
    spec = p.parse_spec({"profile": "fast", "setupArgs": ["--x"], "allocationMode": "Immediate"})
    assert spec.immediate and spec.setup_args == ["--x"] and spec.count is None
    assert p.parse_spec({}).allocation_mode == "WaitForFirstConsumer"
    assert not p.parse_spec({}).immediate


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"count": 0}, "spec.count: Input should be greater than or equal to 1"),
        ({"count": 33}, "spec.count: Input should be less than or equal to 32"),
        ({"env": {"1BAD": "x"}}, "spec.env['1BAD'] (key): String should match pattern"),
        ({"profile": "Fast!"}, "spec.profile: String should match pattern"),
        ({"allocationMode": "Now"}, "spec.allocationMode: Input should be 'Immediate' or"),
        ({"selectors": [""]}, "spec.selectors[0]: String should have at least 1 character"),
        ({"setupArgs": ["a"] * 33}, "spec.setupArgs: List should have at most 32 items"),
        ({"bogus": 1}, "spec.bogus: unknown field"),
    ],
)
def test_spec_errors_name_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(p.ParametersError) as info:
        p.parse_spec(spec)
    assert message in str(info.value)


def test_object_errors_name_the_object() -> None:
    obj = {"metadata": {"namespace": "ns", "name": "x"}, "spec": {"count": -1}}
    with pytest.raises(p.ParametersError, match=r"DeviceClaimParameters ns/x: spec.count"):
        p.spec_of(obj)
    with pytest.raises(p.ParametersError, match="spec: must be an object"):
        p.spec_of({"metadata": {"name": "y"}})


env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
profiles = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(
    env=st.dictionaries(env_names, st.text(max_size=20), max_size=8),
    profile=st.none() | profiles,
    args=st.lists(st.text(max_size=10), max_size=p.MAX_SETUP_ARGS),
)
def test_every_valid_spec_is_valid_device_config(
    env: dict[str, str], profile: str | None, args: list[str]
) -> None:
    """The CRD's node-side fields are a subset of what the kubelet plugin accepts."""
    spec = p.parse_spec({"env": env, "profile": profile, "setupArgs": args})
    cfg = parse_parameters(DRIVER, spec.device_config(DRIVER), "pinned")
    effective = EffectiveConfig().overlay(cfg)
    assert effective.env == env
    assert effective.profile == profile
    assert effective.setup_args == args


# --- opaque config ----------------------------------------------------------------

WHERE = "spec.devices.config[0].opaque.parameters"


def test_parse_inline_reference_and_device_config() -> None:
    inline = p.parse_opaque(
        DRIVER, {"apiVersion": API, "kind": "DeviceClaimParameters", "spec": {"count": 2}}, WHERE
    )
    assert isinstance(inline, p.InlineParameters) and inline.spec.count == 2
    ref = p.parse_opaque(
        DRIVER, {"apiVersion": API, "kind": "DeviceClaimParametersReference", "name": "a.b"}, WHERE
    )
    assert ref == p.ParametersReference("a.b")
    cfg = p.parse_opaque(DRIVER, {"apiVersion": API, "kind": "DeviceConfig", "profile": "x"}, WHERE)
    assert isinstance(cfg, DeviceConfig) and cfg.profile == "x"


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ("text", f"{WHERE}: must be an object, got str"),
        ({"apiVersion": API, "kind": "Nope"}, f"{WHERE}.kind: unknown kind 'Nope'"),
        (
            {"apiVersion": "dradriver.dev/v2", "kind": "DeviceClaimParameters", "spec": {}},
            f"{WHERE}.apiVersion: 'dradriver.dev/v2' is not supported; use '{API}'",
        ),
        (
            {"apiVersion": API, "kind": "DeviceClaimParameters", "spec": {"count": 0}},
            f"{WHERE}.spec.count: Input should be greater than or equal to 1",
        ),
        (
            {"apiVersion": API, "kind": "DeviceClaimParameters"},
            f"{WHERE}.spec: Field required",
        ),
        (
            {"apiVersion": API, "kind": "DeviceClaimParametersReference", "name": "Bad_Name"},
            f"{WHERE}.name: String should match pattern",
        ),
        (
            {"apiVersion": API, "kind": "DeviceClaimParametersReference"},
            f"{WHERE}.name: Field required",
        ),
        (
            {
                "apiVersion": API,
                "kind": "DeviceClaimParametersReference",
                "name": "x",
                "namespace": "other",
            },
            f"{WHERE}.namespace: unknown field",
        ),
        (
            {"apiVersion": API, "kind": "DeviceConfig", "profile": 5},
            f"{WHERE}: field profile: Input should be a valid string",
        ),
    ],
)
def test_opaque_errors_name_the_field(parameters: Any, message: str) -> None:
    with pytest.raises(p.ParametersError) as info:
        p.parse_opaque(DRIVER, parameters, WHERE)
    assert message in str(info.value)


def claim(*configs: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "c"},
        "spec": {"devices": {"config": list(configs)}},
    }


def opaque(driver: str, parameters: dict[str, Any], requests: list[str] | None = None) -> Any:
    entry: dict[str, Any] = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        entry["requests"] = requests
    return entry


def test_claim_parameters_picks_this_drivers_parameter_entries() -> None:
    c = claim(
        opaque("other.example.com", {"anything": True}),
        opaque(DRIVER, {"apiVersion": API, "kind": "DeviceConfig"}),
        opaque(
            DRIVER,
            {"apiVersion": API, "kind": "DeviceClaimParametersReference", "name": "p"},
            ["gpu"],
        ),
        opaque(DRIVER, {"apiVersion": API, "kind": "DeviceClaimParameters", "spec": {}}),
    )
    found = p.claim_parameters(DRIVER, c)
    assert [(e.index, e.requests) for e in found] == [(2, ("gpu",)), (3, ())]
    assert found[0].where == "spec.devices.config[2].opaque.parameters"
    assert p.claim_parameters(DRIVER, {"spec": {}}) == []
    bad = claim(
        opaque(DRIVER, {"apiVersion": API, "kind": "DeviceClaimParameters", "spec": {"count": 0}})
    )
    with pytest.raises(
        p.ParametersError, match=r"spec.devices.config\[0\].opaque.parameters.spec.count"
    ):
        p.claim_parameters(DRIVER, bad)


def test_resolve_inline_and_references() -> None:
    objects: dict[tuple[str, str], dict[str, Any]] = {
        ("ns", "good"): {"metadata": {"namespace": "ns", "name": "good"}, "spec": {"count": 3}},
        ("ns", "bad"): {"metadata": {"namespace": "ns", "name": "bad"}, "spec": {"count": 0}},
        ("ns", "going"): {
            "metadata": {
                "namespace": "ns",
                "name": "going",
                "deletionTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {},
        },
    }

    def lookup(namespace: str, name: str) -> dict[str, Any] | None:
        return objects.get((namespace, name))

    def ref(name: str) -> p.ClaimParameters:
        return p.ClaimParameters(1, (), p.ParametersReference(name))

    inline = p.ClaimParameters(0, (), p.InlineParameters(p.parse_spec({"count": 5})))
    assert p.resolve(inline, "ns", lookup).count == 5
    assert p.resolve(ref("good"), "ns", lookup).count == 3
    field = r"spec.devices.config\[1\].opaque.parameters.name"
    with pytest.raises(
        p.ParametersError, match=rf"{field}: DeviceClaimParameters ns/missing does not exist"
    ):
        p.resolve(ref("missing"), "ns", lookup)
    with pytest.raises(
        p.ParametersError, match=rf"{field}: DeviceClaimParameters ns/bad: spec.count"
    ):
        p.resolve(ref("bad"), "ns", lookup)
    with pytest.raises(p.ParametersError, match="being deleted"):
        p.resolve(ref("going"), "ns", lookup)
    with pytest.raises(p.ParametersError, match="does not exist"):
        p.resolve(ref("good"), "other-namespace", lookup)


def test_set_condition_keeps_transition_time_while_status_is_unchanged() -> None:
    conditions, changed = p.set_condition([], "Valid", "True", "Valid", "ok", 1)
    assert changed and conditions[0]["observedGeneration"] == 1
    first = conditions[0]["lastTransitionTime"]
    conditions[0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    same, changed = p.set_condition(conditions, "Valid", "True", "Valid", "ok", 1)
    assert not changed and same[0]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    newer, changed = p.set_condition(same, "Valid", "True", "Valid", "ok", 2)
    assert changed and newer[0]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    flipped, changed = p.set_condition(newer, "Valid", "False", "Invalid", "bad", 3)
    assert changed and flipped[0]["lastTransitionTime"] != "2020-01-01T00:00:00Z"
    assert first.endswith("Z")
    other, _ = p.set_condition(flipped, "Other", "Unknown", "Pending", "", None)
    assert [c["type"] for c in other] == ["Valid", "Other"]
    assert p.valid_condition({"status": {"conditions": other}})["status"] == "False"  # type: ignore[index]
    assert p.valid_condition({}) is None
