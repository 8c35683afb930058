"""Pure parts of controller allocation: immediacy, config pinning, conflict detection."""

from __future__ import annotations

from typing import Any

import pytest

from controller.allocation import (
    ALLOCATION_ANNOTATION,
    FINALIZER,
    allocation_request,
    conflicts,
    exclusive_devices,
    pin_config,
    should_yield,
    with_timestamp,
)
from dradriver import parameters as params
from dradriver.allocator import AllocatedState, Allocator, Inventory
from dradriver.opaqueconfig import effective_configs

DRIVER = "dradriver.dev"
API = f"{DRIVER}/{params.VERSION}"
Obj = dict[str, Any]


def claim(
    name: str = "c",
    config: list[Obj] | None = None,
    annotations: dict[str, str] | None = None,
    **status: Any,
) -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "annotations": annotations or {},
            "resourceVersion": "1",
        },
        "spec": {
            "devices": {
                "requests": [{"name": "r", "exactly": {"deviceClassName": "cls"}}],
                "config": config or [],
            }
        },
        "status": status,
    }


def opaque(parameters: Obj, driver: str = DRIVER, requests: list[str] | None = None) -> Obj:
    entry: Obj = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        entry["requests"] = requests
    return entry


def reference(name: str) -> Obj:
    return {"apiVersion": API, "kind": params.REFERENCE_KIND, "name": name}


def inline(spec: Obj) -> Obj:
    return {"apiVersion": API, "kind": params.KIND, "spec": spec}


def stored(name: str, spec: Obj) -> Obj:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def lookup_from(*objs: Obj) -> Any:
    by_name = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}
    return lambda namespace, name: by_name.get((namespace, name))


def test_immediate_by_annotation_or_parameters() -> None:
    none = lookup_from()
    assert not allocation_request(DRIVER, claim(), none).immediate
    annotated = claim(annotations={ALLOCATION_ANNOTATION: "Immediate"})
    assert allocation_request(DRIVER, annotated, none).immediate
    other_value = claim(annotations={ALLOCATION_ANNOTATION: "Later"})
    assert not allocation_request(DRIVER, other_value, none).immediate
    by_inline = claim(config=[opaque(inline({"allocationMode": "Immediate"}))])
    assert allocation_request(DRIVER, by_inline, none).immediate
    by_ref = claim(config=[opaque(reference("p"))])
    p = stored("p", {"allocationMode": "Immediate"})
    assert allocation_request(DRIVER, by_ref, lookup_from(p)).immediate
    wffc = stored("p", {"allocationMode": "WaitForFirstConsumer"})
    assert not allocation_request(DRIVER, by_ref, lookup_from(wffc)).immediate
    # Another driver's "parameters" are not ours to read.
    foreign = claim(config=[opaque(inline({"allocationMode": "Immediate"}), "other.dev")])
    assert not allocation_request(DRIVER, foreign, none).immediate


def test_missing_reference_is_an_error_naming_the_field() -> None:
    c = claim(config=[opaque(reference("gone"))], annotations={ALLOCATION_ANNOTATION: "Immediate"})
    request = allocation_request(DRIVER, c, lookup_from())
    assert request.immediate
    assert request.error is not None
    assert "spec.devices.config[0].opaque.parameters.name" in request.error
    assert "ns/gone does not exist" in request.error


def test_pin_config_replaces_parameters_by_device_config() -> None:
    class_entry = {
        "source": "FromClass",
        "opaque": {"driver": DRIVER, "parameters": {"apiVersion": API, "kind": "DeviceConfig"}},
    }
    foreign = {"source": "FromClaim", "opaque": {"driver": "x.dev", "parameters": {"a": 1}}}
    device_config = {"apiVersion": API, "kind": "DeviceConfig", "env": {"A": "1"}}
    c = claim(
        config=[
            opaque(reference("p")),
            opaque(inline({"env": {"B": "2"}, "profile": "slow"}), requests=["r"]),
            opaque(device_config),
        ]
    )
    p = stored("p", {"env": {"MODE": "fast"}, "profile": "fast", "setupArgs": ["-v"]})
    request = allocation_request(DRIVER, c, lookup_from(p))
    config = [
        class_entry,
        {"source": "FromClaim", **c["spec"]["devices"]["config"][0]},
        {"source": "FromClaim", **c["spec"]["devices"]["config"][1]},
        {"source": "FromClaim", **c["spec"]["devices"]["config"][2]},
        foreign,
    ]
    pinned = pin_config(DRIVER, config, request)
    assert pinned[0] == class_entry
    assert pinned[1] == {
        "source": "FromClaim",
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": API,
                "kind": "DeviceConfig",
                "env": {"MODE": "fast"},
                "profile": "fast",
                "setupArgs": ["-v"],
            },
        },
    }
    assert pinned[2]["requests"] == ["r"]
    assert pinned[2]["opaque"]["parameters"] == {
        "apiVersion": API,
        "kind": "DeviceConfig",
        "env": {"B": "2"},
        "profile": "slow",
    }
    assert pinned[3]["opaque"]["parameters"] == device_config
    assert pinned[4] == foreign
    # The input is not modified, and the node reads the pinned config as DeviceConfig.
    assert config[1]["opaque"]["parameters"]["kind"] == params.REFERENCE_KIND
    effective = effective_configs(DRIVER, pinned, ["r"])["r"]
    assert effective.env == {"MODE": "fast", "B": "2", "A": "1"}
    # Changing the parameters object afterwards changes nothing in the pinned config.
    p["spec"]["env"] = {"MODE": "changed"}
    assert pinned[1]["opaque"]["parameters"]["env"] == {"MODE": "fast"}


def test_pin_config_refuses_unresolved_entries() -> None:
    c = claim(config=[opaque(reference("p"))])
    request = allocation_request(DRIVER, claim(), lookup_from())  # resolved nothing
    with pytest.raises(params.ParametersError):
        pin_config(DRIVER, [{"source": "FromClaim", **c["spec"]["devices"]["config"][0]}], request)


def allocation(*devices: str, **extra: Any) -> Obj:
    return {
        "devices": {
            "results": [
                {"request": "r", "driver": "d", "pool": "p", "device": d, **extra} for d in devices
            ]
        }
    }


def test_conflicts_find_other_holders_of_exclusive_devices() -> None:
    state = AllocatedState()
    state.add("ns/sched", allocation("dev-0"))
    state.add("ns/ours", allocation("dev-0", "dev-1"))
    found = conflicts("ns/ours", allocation("dev-0", "dev-1"), state)
    assert [(c.device, c.other) for c in found] == [(("d", "p", "dev-0"), "ns/sched")]
    assert conflicts("ns/ours", allocation("dev-1"), state) == []
    # Admin access and shares never take a device exclusively.
    assert exclusive_devices(allocation("dev-0", adminAccess=True)) == []
    assert exclusive_devices(allocation("dev-0", shareID="u")) == []


def test_should_yield_only_without_consumers_and_exactly_one_of_two_controller_claims() -> None:
    ours = claim("b", finalizers=None)
    ours["metadata"]["finalizers"] = [FINALIZER]
    scheduler_claim = claim("a")
    assert should_yield("ns/b", ours, scheduler_claim)
    assert should_yield("ns/b", ours, None)
    used = claim("b", reservedFor=[{"resource": "pods", "name": "p", "uid": "u"}])
    assert not should_yield("ns/b", used, scheduler_claim)
    other_ours = claim("a")
    other_ours["metadata"]["finalizers"] = [FINALIZER]
    ours_a = claim("a")
    ours_a["metadata"]["finalizers"] = [FINALIZER]
    assert should_yield("ns/b", ours, other_ours)  # b sorts last: b yields
    assert not should_yield("ns/a", ours_a, ours)  # a keeps


def test_allocator_output_gets_a_timestamp_and_pinned_config() -> None:
    slices = [
        {
            "metadata": {"name": "s"},
            "spec": {
                "driver": "d",
                "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [{"name": "dev-0"}],
            },
        }
    ]
    classes = [{"metadata": {"name": "cls"}, "spec": {}}]
    c = claim(config=[opaque(reference("p"))])
    request = allocation_request(DRIVER, c, lookup_from(stored("p", {"profile": "x"})))
    outcome = Allocator(Inventory(slices, classes)).allocate([c], AllocatedState())
    assert outcome.ok and outcome.allocations
    result = with_timestamp(outcome.allocations[0], "2026-01-01T00:00:00Z")
    assert "allocationTimestamp" not in outcome.allocations[0]
    result["devices"]["config"] = pin_config(DRIVER, result["devices"]["config"], request)
    assert result["allocationTimestamp"] == "2026-01-01T00:00:00Z"
    assert result["devices"]["config"] == [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": API, "kind": "DeviceConfig", "profile": "x"},
            },
        }
    ]
    assert "nodeSelector" not in result  # allNodes: usable everywhere
