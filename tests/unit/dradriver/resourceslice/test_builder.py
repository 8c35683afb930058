"""ResourceSlices for a node pool: splitting to the API limits, determinism, comparison."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dradriver.devices.model import CounterConsumption, CounterSet, Device, DeviceTaint
from dradriver.k8s.limits import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS,
)
from dradriver.k8s.names import validate_dns_subdomain
from dradriver.k8s.objects import Obj
from dradriver.resourceslice.builder import build_slices, device_limit, slice_name, slices_equal
from dradriver.resourceslice.pool import SliceError, node_pool, node_slice_prefix

DRIVER = "dradriver.dev"
NODE = "node-1"
TAINT = DeviceTaint(key="example.com/maintenance", effect="NoSchedule")


def build_node_slices(
    driver: str,
    node: str,
    devices: list[Device],
    counter_sets: list[CounterSet],
    generation: int,
) -> list[Obj]:
    return build_slices(node_pool(driver, node, devices, counter_sets), generation)


def node_slice_name(node: str, driver: str, index: int) -> str:
    return slice_name(node_slice_prefix(node, driver), index)


def _devices(count: int, **fields: Any) -> list[Device]:
    return [
        Device.model_validate({"name": f"dev-{i:05d}", "attributes": {"index": i}, **fields})
        for i in range(count)
    ]


def _slice_devices(slices: list[dict[str, Any]]) -> list[list[str]]:
    return [[d["name"] for d in s["spec"].get("devices", [])] for s in slices]


def _check_pool(slices: list[dict[str, Any]], generation: int = 1) -> None:
    for index, s in enumerate(slices):
        assert s["apiVersion"] == "resource.k8s.io/v1"
        assert s["kind"] == "ResourceSlice"
        assert s["metadata"]["name"] == node_slice_name(NODE, DRIVER, index)
        spec = s["spec"]
        assert spec["driver"] == DRIVER
        assert spec["nodeName"] == NODE
        assert spec["pool"] == {
            "name": NODE,
            "generation": generation,
            "resourceSliceCount": len(slices),
        }
        assert not ("devices" in spec and "sharedCounters" in spec)
        assert len(spec.get("devices", [])) <= device_limit(spec.get("devices", []))
        assert len(spec.get("sharedCounters", [])) <= MAX_COUNTER_SETS_PER_SLICE


@pytest.mark.parametrize(
    ("count", "sizes"),
    [
        (0, [0]),
        (1, [1]),
        (128, [128]),
        (129, [128, 1]),
        (10000, [128] * 78 + [16]),
    ],
)
def test_devices_split_at_128_per_slice(count: int, sizes: list[int]) -> None:
    slices = build_node_slices(DRIVER, NODE, _devices(count), [], generation=1)
    assert [len(names) for names in _slice_devices(slices)] == sizes
    _check_pool(slices)
    assert [n for names in _slice_devices(slices) for n in names] == [
        f"dev-{i:05d}" for i in range(count)
    ]


def test_empty_pool_is_one_slice_without_devices() -> None:
    (only,) = build_node_slices(DRIVER, NODE, [], [], generation=0)
    assert only["spec"] == {
        "driver": DRIVER,
        "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1},
        "nodeName": NODE,
    }


def test_taints_lower_the_limit_to_64() -> None:
    slices = build_node_slices(DRIVER, NODE, _devices(129, taints=[TAINT]), [], 1)
    assert [len(n) for n in _slice_devices(slices)] == [64, 64, 1]
    _check_pool(slices)


def test_an_unhealthy_device_counts_as_tainted() -> None:
    devices = _devices(128)
    devices[5] = devices[5].model_copy(update={"healthy": False})
    slices = build_node_slices(DRIVER, NODE, devices, [], 1)
    assert [len(n) for n in _slice_devices(slices)] == [64, 64]
    tainted = slices[0]["spec"]["devices"][5]
    assert tainted["taints"][0]["key"] == "dradriver.dev/unhealthy"


def test_counter_sets_get_their_own_slices_and_consumers_the_lower_limit() -> None:
    counter_sets = [CounterSet(name=f"card-{i}", counters={"memory": "32Gi"}) for i in range(9)]
    consumption = CounterConsumption(counter_set="card-3", counters={"memory": "8Gi"})
    devices = _devices(70, consumes_counters=[consumption])
    slices = build_node_slices(DRIVER, NODE, devices, counter_sets, 4)
    _check_pool(slices, generation=4)
    assert len(slices) == 4
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == [8, 1, 0, 0]
    assert [len(n) for n in _slice_devices(slices)] == [0, 0, 64, 6]
    assert slices[0]["spec"]["sharedCounters"][0] == {
        "name": "card-0",
        "counters": {"memory": {"value": "32Gi"}},
    }
    assert slices[2]["spec"]["devices"][0]["consumesCounters"] == [consumption.to_api()]


def test_mixed_devices_each_slice_is_as_full_as_its_own_limit_allows() -> None:
    plain = _devices(200)
    tainted = [d.model_copy(update={"taints": (TAINT,)}) for d in _devices(250)[200:]]
    slices = build_node_slices(DRIVER, NODE, plain + tainted, [], 1)
    # 72 plain devices fill the second slice; the first tainted one would make it 73 > 64.
    assert [len(n) for n in _slice_devices(slices)] == [128, 72, 50]
    _check_pool(slices)


def test_counter_references_are_checked() -> None:
    consumption = CounterConsumption(counter_set="nope", counters={"memory": "1"})
    with pytest.raises(SliceError, match="unknown counter set 'nope'"):
        build_node_slices(DRIVER, NODE, _devices(1, consumes_counters=[consumption]), [], 1)
    counter_set = CounterSet(name="nope", counters={"cores": "1"})
    with pytest.raises(SliceError, match=r"consumes counters \['memory'\]"):
        build_node_slices(
            DRIVER, NODE, _devices(1, consumes_counters=[consumption]), [counter_set], 1
        )
    with pytest.raises(SliceError, match="counter set 'nope' is given twice"):
        build_node_slices(DRIVER, NODE, [], [counter_set, counter_set], 1)


def test_bad_input_is_refused() -> None:
    with pytest.raises(SliceError, match="device name 'dev-00000' is given twice"):
        build_node_slices(DRIVER, NODE, _devices(1) * 2, [], 1)
    with pytest.raises(SliceError, match="generation must be >= 0"):
        build_node_slices(DRIVER, NODE, [], [], -1)
    with pytest.raises(SliceError, match="node name 'Node_1'"):
        build_node_slices(DRIVER, "Node_1", [], [], 1)
    with pytest.raises(SliceError, match="driver name"):
        build_node_slices("Bad_Driver", NODE, [], [], 1)


def test_output_is_deterministic() -> None:
    devices = _devices(300, taints=[TAINT])
    counter_sets = [CounterSet(name=f"s{i}", counters={"c": "1"}) for i in range(3)]
    first = build_node_slices(DRIVER, NODE, devices, counter_sets, 2)
    shuffled = devices[:]
    random.Random(7).shuffle(shuffled)
    second = build_node_slices(DRIVER, NODE, shuffled, list(reversed(counter_sets)), 2)
    assert first == second


def test_slice_names() -> None:
    assert node_slice_name("node-1", "dradriver.dev", 0) == "node-1-dradriver-dev-00000"
    assert node_slice_name("node-1", "dradriver.dev", 12) == "node-1-dradriver-dev-00012"
    names = [node_slice_name(NODE, DRIVER, i) for i in range(12)]
    assert names == sorted(names)  # name order is slice order
    long_node = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    validate_dns_subdomain(long_node)
    long_names = {node_slice_name(long_node, DRIVER, i) for i in range(3)}
    assert len(long_names) == 3
    for name in long_names:
        assert len(name) <= 253
        validate_dns_subdomain(name)
    other = node_slice_name(long_node[:-1] + "c", DRIVER, 0)
    assert other not in long_names


# --------------------------------------------------------------------------------------------
# slices_equal
# --------------------------------------------------------------------------------------------


def _spec() -> dict[str, Any]:
    device = Device.model_validate(
        {
            "name": "dev-0",
            "attributes": {"model": "m", "fw": {"version": "1.0.0"}},
            "capacity": {"memory": "1024Mi"},
            "consumesCounters": [{"counterSet": "card", "counters": {"memory": "1000m"}}],
            "taints": [{"key": "k", "effect": "NoSchedule"}],
        }
    )
    counters = [CounterSet(name="card", counters={"memory": "2"})]
    slices = build_node_slices(DRIVER, NODE, [device], counters, 1)
    spec: dict[str, Any] = slices[1]["spec"]
    return spec


def test_slices_equal_ignores_generation_server_fields_and_quantity_spelling() -> None:
    desired = _spec()
    existing = copy.deepcopy(desired)
    assert slices_equal(desired, existing)
    existing["pool"]["generation"] = 7
    device = existing["devices"][0]
    device["taints"][0]["timeAdded"] = "2025-01-01T00:00:00Z"
    device["capacity"]["memory"]["value"] = "1Gi"
    device["consumesCounters"][0]["counters"]["memory"]["value"] = "1"
    device["allowMultipleAllocations"] = False
    device["bindingConditions"] = None
    assert slices_equal(desired, existing)
    assert slices_equal(
        {**desired, "devices": []}, {k: v for k, v in desired.items() if k != "devices"}
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["devices"][0]["attributes"]["model"].update(string="n"),
        lambda s: s["devices"][0]["attributes"].pop("fw"),
        lambda s: s["devices"][0]["capacity"]["memory"].update(value="2Gi"),
        lambda s: s["devices"][0].pop("taints"),
        lambda s: s["devices"][0]["taints"][0].update(effect="NoExecute"),
        lambda s: s["devices"][0].update(allowMultipleAllocations=True),
        lambda s: s["devices"].append({"name": "dev-1"}),
        lambda s: s["devices"][0].update(name="dev-9"),
        lambda s: s["pool"].update(resourceSliceCount=3),
        lambda s: s.update(nodeName="node-2"),
        lambda s: s.update(sharedCounters=[{"name": "x", "counters": {"c": {"value": "1"}}}]),
    ],
)
def test_slices_equal_sees_every_field_we_set(change: Any) -> None:
    desired = _spec()
    existing = copy.deepcopy(desired)
    change(existing)
    assert not slices_equal(desired, existing)


def test_slices_equal_on_shared_counters() -> None:
    counter_sets = [CounterSet(name="card", counters={"memory": "32Gi"})]
    (desired,) = build_node_slices(DRIVER, NODE, [], counter_sets, 1)
    existing = copy.deepcopy(desired["spec"])
    existing["sharedCounters"][0]["counters"]["memory"]["value"] = "32768Mi"
    assert slices_equal(desired["spec"], existing)
    existing["sharedCounters"][0]["counters"]["memory"]["value"] = "16Gi"
    assert not slices_equal(desired["spec"], existing)


# --------------------------------------------------------------------------------------------
# Property: every device exactly once, no slice over its limit
# --------------------------------------------------------------------------------------------


_PLAIN, _TAINTED, _COUNTING, _UNHEALTHY = range(4)
_COUNTER_SET = CounterSet(name="card", counters={"memory": "64Gi"})
_CONSUMPTION = CounterConsumption(counter_set="card", counters={"memory": "1Gi"})


def _device(index: int, kind: int) -> Device:
    if kind == _TAINTED:
        return Device(name=f"d-{index}", taints=(TAINT,))
    if kind == _COUNTING:
        return Device(name=f"d-{index}", consumes_counters=(_CONSUMPTION,))
    return Device(name=f"d-{index}", healthy=kind != _UNHEALTHY)


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(
        st.sampled_from([_PLAIN, _PLAIN, _PLAIN, _TAINTED, _COUNTING, _UNHEALTHY]), max_size=700
    ),
    counter_sets=st.integers(min_value=0, max_value=20),
)
def test_every_device_exactly_once_and_no_slice_over_its_limit(
    kinds: list[int], counter_sets: int
) -> None:
    devices = [_device(i, kind) for i, kind in enumerate(kinds)]
    sets = [_COUNTER_SET] + [
        CounterSet(name=f"extra-{i}", counters={"c": "1"}) for i in range(counter_sets)
    ]
    slices = build_node_slices(DRIVER, NODE, devices, sets, 3)
    _check_pool(slices, generation=3)
    published = [n for names in _slice_devices(slices) for n in names]
    assert sorted(published) == sorted(d.name for d in devices)
    assert len(published) == len(set(published))
    for s in slices:
        spec_devices = s["spec"].get("devices", [])
        assert len(spec_devices) <= MAX_DEVICES_PER_SLICE
        if any("taints" in d or "consumesCounters" in d for d in spec_devices):
            assert len(spec_devices) <= MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
    published_sets = [c["name"] for s in slices for c in s["spec"].get("sharedCounters", [])]
    assert sorted(published_sets) == sorted(c.name for c in sets)
