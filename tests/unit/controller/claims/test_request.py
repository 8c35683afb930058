"""Pure parts of controller allocation: immediacy, effective requests, config pinning,
conflict detection, parameters in use; and the ParametersReconciler's in-use finalizer
against the fake apiserver."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from controller.claims.pinned_config import pin_config
from controller.claims.request import allocation_request, effective_claim
from controller.claims.shared_devices import conflicts, exclusive_devices, should_yield
from controller.leadership import NotLeader
from controller.parameters import ParametersReconciler, parameters_used_by
from controller.parameters_in_use import claims_keeping, in_use_message, referenced_parameters
from controller.resourceclaims import with_timestamp
from dradriver.allocator import AllocatedState, Allocator, SliceInventory
from dradriver.api import parameters as params
from dradriver.api.opaqueconfig import effective_configs
from dradriver.api.wellknown import ALLOCATION_ANNOTATION, FINALIZER, IN_USE_FINALIZER
from dradriver.k8s.errors import KubeAPIError, is_conflict
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import path_for
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer

DRIVER = "dradriver.dev"
API = f"{DRIVER}/{params.VERSION}"


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
    outcome = Allocator(SliceInventory(slices, classes)).allocate([c], AllocatedState())
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


# --- count and selectors of the parameters ----------------------------------------------


def pool(devices: int, driver: str = "d") -> list[Obj]:
    return [
        {
            "metadata": {"name": "s"},
            "spec": {
                "driver": driver,
                "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [
                    {"name": f"dev-{i}", "attributes": {"index": {"int": i}}}
                    for i in range(devices)
                ],
            },
        }
    ]


def test_effective_claim_applies_count_and_selectors_without_touching_the_claim() -> None:
    c = claim(config=[opaque(reference("p"))])
    c["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.driver == 'd'"}}
    ]
    before = repr(c)
    spec = {"count": 2, "selectors": ["device.attributes['d'].index >= 2", "true"]}
    request = allocation_request(DRIVER, c, lookup_from(stored("p", spec)))
    effective = effective_claim(c, request)
    assert repr(c) == before  # the claim itself is unchanged
    assert effective["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "cls",
        "allocationMode": "ExactCount",
        "count": 2,
        "selectors": [
            {"cel": {"expression": "device.driver == 'd'"}},
            {"cel": {"expression": "device.attributes['d'].index >= 2"}},
            {"cel": {"expression": "true"}},
        ],
    }
    # The allocator honours them: exactly the two devices the selectors leave.
    outcome = Allocator(
        SliceInventory(pool(4), [{"metadata": {"name": "cls"}, "spec": {}}])
    ).allocate([effective], AllocatedState())
    assert outcome.ok and outcome.allocations
    results = outcome.allocations[0]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["dev-2", "dev-3"]
    # Config entries are copied as they are, so pinning still finds them.
    pinned = pin_config(DRIVER, outcome.allocations[0]["devices"]["config"], request)
    assert pinned[0]["opaque"]["parameters"]["kind"] == "DeviceConfig"


def test_effective_claim_count_overrides_all_mode_and_without_parameters_is_a_copy() -> None:
    c = claim(config=[opaque(inline({"count": 3}))])
    c["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"
    request = allocation_request(DRIVER, c, lookup_from())
    exact = effective_claim(c, request)["spec"]["devices"]["requests"][0]["exactly"]
    assert exact["allocationMode"] == "ExactCount" and exact["count"] == 3
    assert "selectors" not in exact
    plain = claim(config=[opaque(inline({"profile": "x"}))])
    same = effective_claim(plain, allocation_request(DRIVER, plain, lookup_from()))
    assert same == plain and same is not plain


def test_effective_claim_respects_the_requests_an_entry_names() -> None:
    c = claim(
        config=[
            opaque(inline({"count": 2}), requests=["a"]),
            opaque(inline({"selectors": ["s-b1"]}), requests=["b/one"]),
            opaque(inline({"selectors": ["s-all"]})),
            opaque(inline({"count": 4}), requests=["a"]),  # later entry wins
        ]
    )
    c["spec"]["devices"]["requests"] = [
        {"name": "a", "exactly": {"deviceClassName": "cls"}},
        {
            "name": "b",
            "firstAvailable": [
                {"name": "one", "deviceClassName": "cls"},
                {"name": "two", "deviceClassName": "cls", "count": 1},
            ],
        },
    ]
    request = allocation_request(DRIVER, c, lookup_from())
    a, b = effective_claim(c, request)["spec"]["devices"]["requests"]
    assert a["exactly"] == {
        "deviceClassName": "cls",
        "allocationMode": "ExactCount",
        "count": 4,
        "selectors": [{"cel": {"expression": "s-all"}}],
    }
    one, two = b["firstAvailable"]
    assert one["selectors"] == [{"cel": {"expression": "s-b1"}}, {"cel": {"expression": "s-all"}}]
    assert two == {
        "name": "two",
        "deviceClassName": "cls",
        "count": 1,
        "selectors": [{"cel": {"expression": "s-all"}}],
    }
    # A config entry naming the main request covers all of its subrequests.
    c["spec"]["devices"]["config"] = [opaque(inline({"count": 2}), requests=["b"])]
    request = allocation_request(DRIVER, c, lookup_from())
    a, b = effective_claim(c, request)["spec"]["devices"]["requests"]
    assert "count" not in a["exactly"]
    assert [s["count"] for s in b["firstAvailable"]] == [2, 2]


# --- parameters in use ------------------------------------------------------------------


def allocated(name: str, config: list[Obj], namespace: str = "ns") -> Obj:
    c = claim(name, config=config, allocation=allocation("dev-0"))
    c["metadata"]["namespace"] = namespace
    return c


def test_referenced_parameters_and_the_claims_keeping_them() -> None:
    c = claim(config=[opaque(reference("p")), opaque(reference("q")), opaque(reference("p"))])
    assert referenced_parameters(DRIVER, c) == ["p", "q"]
    assert referenced_parameters(DRIVER, claim(config=[opaque(inline({}))])) == []
    assert referenced_parameters("other.dev", c) == []
    broken = claim(config=[opaque({"kind": "Nope"})])
    assert referenced_parameters(DRIVER, broken) == []
    claims = [
        allocated("b", [opaque(reference("p"))]),
        allocated("a", [opaque(reference("p")), opaque(reference("q"))]),
        claim("pending", config=[opaque(reference("p"))]),  # not allocated: not in use
        allocated("elsewhere", [opaque(reference("p"))], namespace="other"),
        allocated("foreign", [opaque(reference("p"), driver="other.dev")]),
    ]
    assert claims_keeping(DRIVER, claims, "ns", "p") == ["a", "b"]
    assert claims_keeping(DRIVER, claims, "ns", "q") == ["a"]
    assert claims_keeping(DRIVER, claims, "ns", "r") == []
    assert parameters_used_by(DRIVER)(claims[1]) == ["ns/p", "ns/q"]
    assert list(parameters_used_by(DRIVER)(claims[2])) == ["ns/p"]


def test_in_use_message() -> None:
    assert in_use_message(["a"]) == "in use by claim a"
    assert in_use_message(["a", "b"]) == "in use by claims a, b"
    names = [f"c{i}" for i in range(12)]
    assert in_use_message(names, limit=3) == "in use by claims c0, c1, c2 and 9 more"


def params_object(name: str, **metadata: Any) -> Obj:
    """A stored object whose Valid condition is up to date (no status write expected)."""
    obj = stored(name, {"profile": "x"})
    obj["metadata"].update({"uid": f"uid-{name}", "generation": 1, **metadata})
    valid, _ = params.set_condition(
        [], params.VALID_CONDITION, "True", "Valid", "the spec is valid", 1
    )
    obj["status"] = {"conditions": valid}
    return obj


def params_path(name: str) -> str:
    return path_for(API, params.PLURAL, "ns", name)


def events_in(api: FakeAPIServer) -> list[Obj]:
    prefix = path_for("v1", "events", "ns") + "/"
    return [o for path, o in sorted(api.objects.items()) if path.startswith(prefix)]


def rig(
    objs: list[Obj], claims: list[Obj], leader: bool = True
) -> tuple[FakeAPIServer, ParametersReconciler]:
    """A ParametersReconciler whose informer shows ``objs`` as the fake apiserver has them."""
    api = FakeAPIServer()
    informer = FakeInformer(*(api.put(params_path(o["metadata"]["name"]), o) for o in objs))
    reconciler = ParametersReconciler(
        cast(Any, api),
        DRIVER,
        cast(Any, informer),
        lambda: leader,
        claims=cast(Any, FakeInformer(*claims)),
    )
    return api, reconciler


def run_reconciler(
    objs: list[Obj], claims: list[Obj], key: str, leader: bool = True
) -> FakeAPIServer:
    api, reconciler = rig(objs, claims, leader)
    asyncio.run(reconciler(key))
    return api


def test_parameters_reconciler_adds_and_removes_the_in_use_finalizer() -> None:
    users = [allocated("a", [opaque(reference("p"))]), allocated("b", [opaque(reference("p"))])]
    api = run_reconciler([params_object("p", finalizers=["x/keep"])], users, "ns/p")
    [write] = api.history
    assert (write.method, write.path) == ("PATCH", params_path("p"))
    # At the resourceVersion the informer showed (the first the fake apiserver issues).
    assert write.body == {
        "metadata": {"resourceVersion": "1", "finalizers": ["x/keep", IN_USE_FINALIZER]}
    }
    assert events_in(api) == []  # not being deleted: nothing to say
    protected = api.stored(params_path("p"))
    assert protected is not None
    assert protected["metadata"]["finalizers"] == ["x/keep", IN_USE_FINALIZER]
    # Already there: nothing to write.
    assert run_reconciler([protected], users, "ns/p").writes == []
    # No allocated claim left: removed, other finalizers kept.
    api = run_reconciler([protected], [], "ns/p")
    assert [(w.method, w.path) for w in api.history] == [("PATCH", params_path("p"))]
    released = api.stored(params_path("p"))
    assert released is not None and released["metadata"]["finalizers"] == ["x/keep"]


def test_parameters_reconciler_explains_a_blocked_deletion_once() -> None:
    users = [allocated("b", [opaque(reference("p"))]), allocated("a", [opaque(reference("p"))])]
    deleting = params_object(
        "p", finalizers=[IN_USE_FINALIZER], deletionTimestamp="2026-01-01T00:00:00Z"
    )
    api, reconciler = rig([deleting], users)
    asyncio.run(reconciler("ns/p"))
    asyncio.run(reconciler("ns/p"))
    assert api.writes == [("POST", path_for("v1", "events", "ns"))]  # one event, no patch
    [event] = events_in(api)
    assert event["reason"] == "InUse" and event["type"] == "Warning"
    assert event["message"] == "deletion waits: in use by claims a, b"
    assert event["involvedObject"]["kind"] == params.KIND
    assert event["involvedObject"]["apiVersion"] == API
    assert event["involvedObject"]["namespace"] == "ns"


def test_parameters_reconciler_behind_the_server_retries_and_a_deleted_object_is_done() -> None:
    users = [allocated("a", [opaque(reference("p"))])]
    api, reconciler = rig([params_object("p")], users)
    newer = api.stored(params_path("p"))
    assert newer is not None
    api.put(params_path("p"), newer)  # changed meanwhile; the informer has not seen it
    with pytest.raises(KubeAPIError) as e:
        asyncio.run(reconciler("ns/p"))
    assert is_conflict(e.value)  # the workqueue retries once the cache catches up
    after = api.stored(params_path("p"))
    assert after is not None and IN_USE_FINALIZER not in after["metadata"].get("finalizers", [])
    del api.objects[params_path("p")]  # deleted meanwhile: nothing left to protect
    asyncio.run(reconciler("ns/p"))


def test_parameters_reconciler_adds_no_finalizer_while_deleting_nor_writes_as_standby() -> None:
    users = [allocated("a", [opaque(reference("p"))])]
    deleting = params_object("p", deletionTimestamp="2026-01-01T00:00:00Z")
    assert run_reconciler([deleting], users, "ns/p").writes == []
    with pytest.raises(NotLeader):
        run_reconciler([params_object("p")], users, "ns/p", leader=False)
