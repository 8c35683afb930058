"""The structured allocator's semantics, with real CEL evaluation."""

from __future__ import annotations

import time
import uuid
from decimal import Decimal
from typing import Any

import pytest

from dradriver.allocator import AllocatedState, Allocator, SliceInventory, allocate, claim_key
from tests.unit.dradriver.allocator.builders import (
    DRIVER,
    A,
    allocated_claim,
    allocation,
    claim,
    device,
    device_class,
    exact,
    first_available,
    label_selector,
    node,
    node_slice,
    picked,
    request,
    result,
    shared_slice,
)

GPU = device_class()
NODE_1 = node("node-1", region="east")


def run(
    slices: list[dict[str, Any]],
    claims: list[dict[str, Any]],
    classes: list[dict[str, Any]] | None = None,
    state: AllocatedState | None = None,
    **kwargs: Any,
) -> Any:
    allocator = Allocator(SliceInventory(slices, classes if classes is not None else [GPU]))
    node_arg = kwargs.pop("node", NODE_1 if "nodes" not in kwargs else None)
    return allocator.allocate(claims, state or AllocatedState(), node=node_arg, **kwargs)


def gpus(node_name: str = "node-1", n: int = 4, **attrs_by_index: Any) -> dict[str, Any]:
    return node_slice(node_name, [device(f"gpu-{i}", {"index": i}) for i in range(n)])


# --- basics -----------------------------------------------------------------------------


def test_allocates_first_device_and_writes_the_result_shape() -> None:
    outcome = run([gpus()], [claim("c", request("gpu"))])
    assert outcome.ok and outcome.node == "node-1"
    assert allocation(outcome) == {
        "devices": {
            "results": [{"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0"}]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
            ]
        },
    }


def test_class_and_request_selectors_both_apply() -> None:
    slices = [
        node_slice(
            "node-1",
            [
                device("a", {"model": "a100", "healthy": False}),
                device("b", {"model": "h100", "healthy": True}),
                device("c", {"model": "a100", "healthy": True}),
            ],
        )
    ]
    healthy = device_class("healthy", [f'device.driver == "{DRIVER}"', f"{A}.healthy"])
    outcome = run(
        slices,
        [claim("c", request("g", "healthy", selectors=[f'{A}.model == "a100"']))],
        classes=[healthy],
    )
    assert picked(outcome) == [("g", "c")]


def test_first_fit_follows_slice_names_then_device_order() -> None:
    slices = [
        node_slice("node-1", [device("z-first")], name="b-slice", pool="p2"),
        node_slice("node-1", [device("y"), device("x")], name="a-slice", pool="p1"),
    ]
    outcome = run(slices, [claim("c", request("g", count=2))])
    assert picked(outcome) == [("g", "y"), ("g", "x")]


def test_exact_count_needs_enough_devices() -> None:
    assert picked(run([gpus(n=3)], [claim("c", request("g", count=3))])) == [
        ("g", "gpu-0"),
        ("g", "gpu-1"),
        ("g", "gpu-2"),
    ]
    outcome = run([gpus(n=3)], [claim("c", request("g", count=4))])
    assert outcome.unsatisfiable and not outcome.ok


def test_devices_already_allocated_are_skipped() -> None:
    taken = allocated_claim("other", {"devices": {"results": [result("gpu-0", "node-1")]}})
    state = AllocatedState.from_claims([taken])
    assert state.holders((DRIVER, "node-1", "gpu-0")) == ["ns/other"]
    assert picked(run([gpus()], [claim("c", request("g"))], state=state)) == [("g", "gpu-1")]


def test_claims_are_allocated_together_all_or_nothing() -> None:
    claims = [claim("a", request("g", count=2)), claim("b", request("g", count=2))]
    outcome = run([gpus(n=4)], claims)
    assert picked(outcome, 0) == [("g", "gpu-0"), ("g", "gpu-1")]
    assert picked(outcome, 1) == [("g", "gpu-2"), ("g", "gpu-3")]
    assert run([gpus(n=3)], claims).unsatisfiable


# --- allocation modes -------------------------------------------------------------------


def test_all_mode_takes_every_matching_device() -> None:
    slices = [
        node_slice(
            "node-1", [device("a", {"m": "x"}), device("b", {"m": "y"}), device("c", {"m": "x"})]
        )
    ]
    outcome = run(slices, [claim("c", request("g", mode="All", selectors=[f'{A}.m == "x"']))])
    assert picked(outcome) == [("g", "a"), ("g", "c")]


def test_all_mode_fails_when_one_matching_device_is_taken() -> None:
    state = AllocatedState()
    state.add("ns/other", {"devices": {"results": [result("gpu-2", "node-1")]}})
    outcome = run([gpus()], [claim("c", request("g", mode="All"))], state=state)
    assert outcome.unsatisfiable


def test_all_mode_with_no_matching_device_fails() -> None:
    outcome = run([gpus()], [claim("c", request("g", mode="All", selectors=["false"]))])
    assert outcome.unsatisfiable


def test_all_mode_refuses_incomplete_pools() -> None:
    incomplete = node_slice("node-1", [device("a")], count=2)
    outcome = run([incomplete], [claim("c", request("g", mode="All"))])
    assert outcome.error is not None
    assert "asks for all devices, but resource pool" in outcome.error
    assert "is currently being updated" in outcome.error


# --- firstAvailable ---------------------------------------------------------------------


def test_first_available_falls_back_in_order() -> None:
    slices = [node_slice("node-1", [device("small", {"model": "l4"})])]
    outcome = run(
        slices,
        [
            claim(
                "c",
                first_available(
                    "gpu",
                    ("big", exact(selectors=[f'{A}.model == "h100"'])),
                    ("small", exact(selectors=[f'{A}.model == "l4"'])),
                ),
            )
        ],
    )
    assert picked(outcome) == [("gpu/small", "small")]


def test_first_available_prefers_the_first_subrequest() -> None:
    slices = [node_slice("node-1", [device("s", {"model": "l4"}), device("b", {"model": "h100"})])]
    outcome = run(
        slices,
        [
            claim(
                "c",
                first_available(
                    "gpu",
                    ("big", exact(selectors=[f'{A}.model == "h100"'])),
                    ("small", exact(selectors=[f'{A}.model == "l4"'])),
                ),
            )
        ],
    )
    assert picked(outcome) == [("gpu/big", "b")]


def test_first_available_is_revised_when_a_later_request_needs_it() -> None:
    # "x" may take either device; "y" only the h100. The search backtracks into x's
    # subrequest choice.
    slices = [node_slice("node-1", [device("b", {"model": "h100"}), device("s", {"model": "l4"})])]
    outcome = run(
        slices,
        [
            claim(
                "c",
                first_available(
                    "x",
                    ("big", exact(selectors=[f'{A}.model == "h100"'])),
                    ("small", exact(selectors=[f'{A}.model == "l4"'])),
                ),
                request("y", selectors=[f'{A}.model == "h100"']),
            )
        ],
    )
    assert picked(outcome) == [("x/small", "s"), ("y", "b")]


# --- constraints ------------------------------------------------------------------------


def numa_slice() -> dict[str, Any]:
    return node_slice(
        "node-1",
        [
            device("gpu-0", {"numa": 0, "kind": "gpu"}),
            device("gpu-1", {"numa": 1, "kind": "gpu"}),
            device("nic-0", {"numa": 1, "kind": "nic"}),
        ],
    )


def test_match_attribute_backtracks_over_a_first_choice() -> None:
    # The first GPU (numa 0) has no NIC on its NUMA node: the search must revise it.
    outcome = run(
        [numa_slice()],
        [
            claim(
                "c",
                request("gpu", selectors=[f'{A}.kind == "gpu"']),
                request("nic", selectors=[f'{A}.kind == "nic"']),
                constraints=[{"matchAttribute": f"{DRIVER}/numa"}],
            )
        ],
    )
    assert picked(outcome) == [("gpu", "gpu-1"), ("nic", "nic-0")]
    assert outcome.steps > 4  # it did backtrack


def test_match_attribute_only_for_named_requests() -> None:
    outcome = run(
        [numa_slice()],
        [
            claim(
                "c",
                request("a", selectors=[f'{A}.kind == "gpu"']),
                request("b", selectors=[f'{A}.kind == "gpu"']),
                request("nic", selectors=[f'{A}.kind == "nic"']),
                constraints=[{"requests": ["a", "nic"], "matchAttribute": f"{DRIVER}/numa"}],
            )
        ],
    )
    assert picked(outcome) == [("a", "gpu-1"), ("b", "gpu-0"), ("nic", "nic-0")]


def test_match_attribute_missing_on_device_excludes_it() -> None:
    slices = [node_slice("node-1", [device("no-attr"), device("with", {"numa": 0})])]
    outcome = run(
        slices, [claim("c", request("g"), constraints=[{"matchAttribute": f"{DRIVER}/numa"}])]
    )
    assert picked(outcome) == [("g", "with")]


def test_match_attribute_with_qualified_name_of_another_domain() -> None:
    slices = [
        node_slice(
            "node-1",
            [
                device("a", {"example.com/root": "pci-1"}),
                device("b", {"example.com/root": "pci-2"}),
                device("c", {"example.com/root": "pci-2"}),
            ],
        )
    ]
    outcome = run(
        slices,
        [
            claim(
                "c",
                request("x", selectors=['device.attributes["example.com"].root == "pci-2"']),
                request("y"),
                constraints=[{"matchAttribute": "example.com/root"}],
            )
        ],
    )
    assert picked(outcome) == [("x", "b"), ("y", "c")]


def test_distinct_attribute() -> None:
    slices = [
        node_slice(
            "node-1",
            [device("a", {"port": 1}), device("b", {"port": 1}), device("c", {"port": 2})],
        )
    ]
    outcome = run(
        slices,
        [claim("c", request("g", count=2), constraints=[{"distinctAttribute": f"{DRIVER}/port"}])],
    )
    assert picked(outcome) == [("g", "a"), ("g", "c")]
    outcome = run(
        slices,
        [claim("c", request("g", count=3), constraints=[{"distinctAttribute": f"{DRIVER}/port"}])],
    )
    assert outcome.unsatisfiable


def test_distinct_versions_ignore_build_metadata() -> None:
    slices = [
        node_slice("node-1", [device("a", {"fw": "v:1.0.0+a"}), device("b", {"fw": "v:1.0.0+b"})])
    ]
    outcome = run(
        slices,
        [claim("c", request("g", count=2), constraints=[{"distinctAttribute": f"{DRIVER}/fw"}])],
    )
    assert outcome.unsatisfiable


def test_constraint_on_subrequest_name() -> None:
    outcome = run(
        [numa_slice()],
        [
            claim(
                "c",
                first_available("x", ("gpu", exact(selectors=[f'{A}.kind == "gpu"']))),
                request("nic", selectors=[f'{A}.kind == "nic"']),
                constraints=[{"requests": ["x/gpu", "nic"], "matchAttribute": f"{DRIVER}/numa"}],
            )
        ],
    )
    assert picked(outcome) == [("x/gpu", "gpu-1"), ("nic", "nic-0")]


# --- taints -----------------------------------------------------------------------------


def tainted(effect: str) -> dict[str, Any]:
    return node_slice(
        "node-1",
        [
            device("t", taints=[{"key": "broken", "value": "yes", "effect": effect}]),
            device("ok"),
        ],
    )


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_untolerated_taint_blocks(effect: str) -> None:
    assert picked(run([tainted(effect)], [claim("c", request("g"))])) == [("g", "ok")]


def test_taint_with_effect_none_or_unknown_does_not_block() -> None:
    assert picked(run([tainted("None")], [claim("c", request("g"))])) == [("g", "t")]
    assert picked(run([tainted("Sometime")], [claim("c", request("g"))])) == [("g", "t")]


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "broken", "operator": "Exists"},
        {"key": "broken", "value": "yes"},
        {"key": "broken", "operator": "Equal", "value": "yes", "effect": "NoSchedule"},
        {"operator": "Exists"},
    ],
)
def test_tolerated_taint_and_tolerations_are_copied(toleration: dict[str, Any]) -> None:
    outcome = run([tainted("NoSchedule")], [claim("c", request("g", tolerations=[toleration]))])
    assert picked(outcome) == [("g", "t")]
    assert allocation(outcome)["devices"]["results"][0]["tolerations"] == [toleration]


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "broken", "value": "no"},
        {"key": "other", "operator": "Exists"},
        {"key": "broken", "operator": "Exists", "effect": "NoExecute"},
    ],
)
def test_tolerations_that_do_not_match(toleration: dict[str, Any]) -> None:
    outcome = run([tainted("NoSchedule")], [claim("c", request("g", tolerations=[toleration]))])
    assert picked(outcome) == [("g", "ok")]


# --- admin access -----------------------------------------------------------------------


def test_admin_access_ignores_allocations_and_does_not_take_the_device() -> None:
    state = AllocatedState()
    state.add("ns/user", {"devices": {"results": [result("gpu-0", "node-1")]}})
    outcome = run([gpus(n=1)], [claim("admin", request("g", admin=True))], state=state)
    assert picked(outcome) == [("g", "gpu-0")]
    entry = allocation(outcome)["devices"]["results"][0]
    assert entry["adminAccess"] is True
    state.add("ns/admin", allocation(outcome))
    assert state.holders((DRIVER, "node-1", "gpu-0")) == ["ns/user"]  # admin holds nothing


def test_admin_access_does_not_pick_the_same_device_twice_in_a_claim() -> None:
    outcome = run([gpus(n=2)], [claim("c", request("g", admin=True, count=2))])
    assert picked(outcome) == [("g", "gpu-0"), ("g", "gpu-1")]
    assert run([gpus(n=1)], [claim("c", request("g", admin=True, count=2))]).unsatisfiable


# --- counters (partitionable devices) ---------------------------------------------------


def partitioned_pool(extra_devices: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    def part(name: str, memory: str, slices_used: str) -> dict[str, Any]:
        return device(
            name,
            {"kind": "part"},
            consumesCounters=[
                {
                    "counterSet": "gpu-0",
                    "counters": {"memory": {"value": memory}, "slices": {"value": slices_used}},
                }
            ],
        )

    devices = [
        part("whole", "40Gi", "4"),
        part("half-0", "20Gi", "2"),
        part("half-1", "20Gi", "2"),
        part("quarter-0", "10Gi", "1"),
        *(extra_devices or []),
    ]
    counters = shared_slice(
        "node-1-counters",
        "node-1",
        node_name=None,
        count=2,
        sharedCounters=[
            {"name": "gpu-0", "counters": {"memory": {"value": "40Gi"}, "slices": {"value": "4"}}}
        ],
    )
    counters["spec"]["nodeName"] = "node-1"
    return [node_slice("node-1", devices, count=2, name="node-1-devices"), counters]


def test_counters_limit_partitions() -> None:
    outcome = run(partitioned_pool(), [claim("c", request("g", count=2))])
    # "whole" uses up everything, so the second device cannot come after it: backtrack.
    assert picked(outcome) == [("g", "half-0"), ("g", "half-1")]
    assert run(partitioned_pool(), [claim("c", request("g", count=3))]).unsatisfiable


def test_counters_consumed_by_allocated_devices() -> None:
    state = AllocatedState()
    state.add("ns/other", {"devices": {"results": [result("half-0", "node-1")]}})
    # 20Gi and 2 slices are left: "whole" no longer fits, half-1 does, not with quarter-0.
    assert picked(run(partitioned_pool(), [claim("c", request("g"))], state=state)) == [
        ("g", "half-1")
    ]
    assert run(partitioned_pool(), [claim("c", request("g", count=2))], state=state).unsatisfiable
    state.add("ns/more", {"devices": {"results": [result("quarter-0", "node-1")]}})
    assert run(partitioned_pool(), [claim("c", request("g"))], state=state).unsatisfiable


def test_counters_exhausted_across_claims_in_sequence() -> None:
    allocator = Allocator(SliceInventory(partitioned_pool(), [GPU]))
    state = AllocatedState()
    got = []
    for i in range(5):
        c = claim(f"c{i}", request("g"))
        outcome = allocator.allocate([c], state, node=NODE_1)
        if not outcome.ok:
            break
        got.append(picked(outcome)[0][1])
        state.add(claim_key(c), allocation(outcome))
    assert got == ["whole"]


# --- consumable capacity and shared devices ---------------------------------------------


def shareable(policy: dict[str, Any] | None = None, value: str = "10G") -> dict[str, Any]:
    bandwidth: dict[str, Any] = {"value": value}
    if policy:
        bandwidth["requestPolicy"] = policy
    return node_slice(
        "node-1",
        [
            device(
                "nic",
                capacity={"bandwidth": bandwidth, "queues": "8"},
                allowMultipleAllocations=True,
            )
        ],
    )


def test_multi_allocatable_device_is_shared_with_share_ids() -> None:
    policy = {"default": "1G", "validRange": {"min": "1G", "step": "1G"}}
    allocator = Allocator(SliceInventory([shareable(policy)], [GPU]))
    state = AllocatedState()
    shares = []
    for i in range(3):
        c = claim(f"c{i}", request("n", capacity={"bandwidth": "2500M", "queues": "2"}))
        outcome = allocator.allocate([c], state, node=NODE_1)
        assert outcome.ok, outcome.error
        entry = allocation(outcome)["devices"]["results"][0]
        assert entry["device"] == "nic"
        assert entry["consumedCapacity"] == {"bandwidth": "3G", "queues": "2"}
        shares.append(uuid.UUID(entry["shareID"]))
        state.add(claim_key(c), allocation(outcome))
    assert len(set(shares)) == 3
    assert state.consumed[(DRIVER, "node-1", "nic")][f"{DRIVER}/bandwidth"] == Decimal(9) * 10**9
    # 1G bandwidth left, queues 2 left: a 2G request no longer fits.
    c = claim("big", request("n", capacity={"bandwidth": "2G", "queues": "1"}))
    assert allocator.allocate([c], state, node=NODE_1).unsatisfiable
    c = claim("fits", request("n", capacity={"bandwidth": "1G", "queues": "1"}))
    assert allocator.allocate([c], state, node=NODE_1).ok


def test_capacity_default_and_full_value_when_not_requested() -> None:
    policy = {"default": "2G", "validValues": ["2G", "5G"]}
    outcome = run([shareable(policy)], [claim("c", request("n"))])
    # Not requested: bandwidth takes the policy default, queues (no policy) all of it.
    assert allocation(outcome)["devices"]["results"][0]["consumedCapacity"] == {
        "bandwidth": "2G",
        "queues": "8",
    }


def test_capacity_valid_values_round_up_and_max() -> None:
    policy = {"default": "2G", "validValues": ["2G", "5G"]}
    outcome = run(
        [shareable(policy)], [claim("c", request("n", capacity={"bandwidth": "3G", "queues": "1"}))]
    )
    assert allocation(outcome)["devices"]["results"][0]["consumedCapacity"]["bandwidth"] == "5G"
    outcome = run([shareable(policy)], [claim("c", request("n", capacity={"bandwidth": "6G"}))])
    assert outcome.unsatisfiable  # above the largest valid value: policy violated


def test_capacity_valid_range_max() -> None:
    policy = {"default": "1G", "validRange": {"min": "1G", "max": "4G"}}
    assert run(
        [shareable(policy)], [claim("c", request("n", capacity={"bandwidth": "4G", "queues": "1"}))]
    ).ok
    assert run(
        [shareable(policy)], [claim("c", request("n", capacity={"bandwidth": "5G"}))]
    ).unsatisfiable


def test_capacity_request_for_missing_capacity() -> None:
    assert run([shareable()], [claim("c", request("n", capacity={"memory": "1"}))]).unsatisfiable
    # As in the 1.38 scheduler, "<driver>/queues" is the slice's "queues" (more in
    # test_capacity_names.py); another domain is another capacity.
    outcome = run(
        [shareable()],
        [claim("c", request("n", capacity={f"{DRIVER}/queues": "1", "bandwidth": "1G"}))],
    )
    assert allocation(outcome)["devices"]["results"][0]["consumedCapacity"]["queues"] == "1"
    assert run([shareable()], [claim("c", request("n", capacity={"queues": "1"}))]).ok
    assert run(
        [shareable()], [claim("c", request("n", capacity={"example.com/queues": "1"}))]
    ).unsatisfiable


def test_capacity_request_on_a_dedicated_device_must_fit() -> None:
    slices = [
        node_slice(
            "node-1",
            [
                device("small", capacity={"memory": "8Gi"}),
                device("big", capacity={"memory": "80Gi"}),
            ],
        )
    ]
    outcome = run(slices, [claim("c", request("g", capacity={"memory": "16Gi"}))])
    entry = allocation(outcome)["devices"]["results"][0]
    assert entry["device"] == "big" and "shareID" not in entry and "consumedCapacity" not in entry


def test_allocated_shares_count_against_capacity() -> None:
    state = AllocatedState()
    state.add(
        "ns/other",
        {
            "devices": {
                "results": [
                    result(
                        "nic",
                        "node-1",
                        shareID=str(uuid.uuid4()),
                        consumedCapacity={"bandwidth": "9G", "queues": "1"},
                    )
                ]
            }
        },
    )
    assert state.is_allocated((DRIVER, "node-1", "nic"))
    assert (DRIVER, "node-1", "nic") not in state.dedicated
    c = claim("c", request("n", capacity={"bandwidth": "2G", "queues": "1"}))
    assert run([shareable()], [c], state=state).unsatisfiable
    state.remove("ns/other")
    assert run([shareable()], [c], state=state).ok


# --- pools ------------------------------------------------------------------------------


def test_stale_generations_are_ignored() -> None:
    slices = [
        node_slice("node-1", [device("old")], name="s-old", generation=1),
        node_slice("node-1", [device("new")], name="s-new", generation=2),
    ]
    assert picked(run(slices, [claim("c", request("g", count=1))])) == [("g", "new")]
    assert run(slices, [claim("c", request("g", count=2))]).unsatisfiable


def test_incomplete_pools_are_not_used_for_exact_count() -> None:
    slices = [
        node_slice("node-1", [device("partial")], name="a", pool="p1", count=2),
        node_slice("node-1", [device("complete")], name="b", pool="p2"),
    ]
    assert picked(run(slices, [claim("c", request("g"))])) == [("g", "complete")]


def test_invalid_pool_error_when_nothing_else_fits() -> None:
    slices = [
        node_slice("node-1", [device("dup")], name="a", pool="p", count=2),
        node_slice("node-1", [device("dup")], name="b", pool="p", count=2),
    ]
    outcome = run(slices, [claim("c", request("g"))])
    assert outcome.error is not None and "duplicate device name dup" in outcome.error


# --- network-attached devices and nodes -------------------------------------------------


def test_node_selector_pool_reachable_by_labels() -> None:
    slices = [
        shared_slice(
            "net", "fabric", [device("nic")], node_selector=label_selector("region", "east")
        )
    ]
    outcome = run(slices, [claim("c", request("n"))], node=node("node-1", region="east"))
    assert allocation(outcome)["nodeSelector"] == label_selector("region", "east")
    assert run(slices, [claim("c", request("n"))], node=node("node-2", region="west")).unsatisfiable


def test_all_nodes_pool_has_no_node_selector() -> None:
    slices = [shared_slice("net", "fabric", [device("nic")], all_nodes=True)]
    outcome = run(slices, [claim("c", request("n"))], node=None)
    assert outcome.ok and outcome.node is None and "nodeSelector" not in allocation(outcome)


def test_pick_a_node_prefers_devices_needing_no_node() -> None:
    slices = [
        gpus("node-1", n=1),
        shared_slice(
            "net", "fabric", [device("nic")], node_selector=label_selector("region", "east")
        ),
    ]
    nodes = [node("node-1", region="east")]
    outcome = run(slices, [claim("c", request("g"))], nodes=nodes)
    assert picked(outcome) == [("g", "nic")] and outcome.node is None
    assert allocation(outcome)["nodeSelector"] == label_selector("region", "east")


def test_pick_a_node_skips_a_network_pool_no_candidate_node_reaches() -> None:
    slices = [
        gpus("node-1", n=1),
        shared_slice(
            "net", "fabric", [device("nic")], node_selector=label_selector("region", "mars")
        ),
    ]
    outcome = run(slices, [claim("c", request("g"))], nodes=[node("node-1", region="east")])
    assert picked(outcome) == [("g", "gpu-0")] and outcome.node == "node-1"


def test_pick_a_node_takes_the_first_node_that_fits() -> None:
    slices = [gpus("node-1", n=1), gpus("node-2", n=2), gpus("node-3", n=2)]
    nodes = ["node-3", "node-2", "node-1"]
    outcome = run(slices, [claim("c", request("g", count=2))], nodes=nodes)
    assert outcome.node == "node-2" and picked(outcome) == [("g", "gpu-0"), ("g", "gpu-1")]
    assert outcome.nodes_tried == [None, "node-1", "node-2"]
    fields = allocation(outcome)["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"]
    assert fields[0]["values"] == ["node-2"]


def test_devices_of_one_claim_come_from_one_node() -> None:
    slices = [gpus("node-1", n=1), gpus("node-2", n=1)]
    assert run(
        slices, [claim("c", request("g", count=2))], nodes=["node-1", "node-2"]
    ).unsatisfiable


def test_per_device_node_selection_and_binds_to_node() -> None:
    slices = [
        shared_slice(
            "per-device",
            "fabric",
            [
                device("on-2", nodeName="node-2"),
                device(
                    "attachable",
                    allNodes=True,
                    bindsToNode=True,
                    bindingConditions=["dradriver.dev/attached"],
                    bindingFailureConditions=["dradriver.dev/attach-failed"],
                ),
            ],
            per_device=True,
        )
    ]
    outcome = run(slices, [claim("c", request("n"))], node=node("node-1"))
    entry = allocation(outcome)["devices"]["results"][0]
    assert entry["device"] == "attachable"
    assert entry["bindingConditions"] == ["dradriver.dev/attached"]
    assert entry["bindingFailureConditions"] == ["dradriver.dev/attach-failed"]
    fields = allocation(outcome)["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"]
    assert fields == [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]
    # Without a node, a bindsToNode device cannot be chosen; with candidates, a node is picked.
    assert run(slices, [claim("c", request("n"))], node=None).unsatisfiable
    outcome = run(slices, [claim("c", request("n"))], nodes=["node-2"])
    assert outcome.node == "node-2" and picked(outcome) == [("n", "on-2")]


def test_pools_with_binding_conditions_come_last() -> None:
    slices = [
        shared_slice(
            "a-conditional",
            "p1",
            [device("cond", bindingConditions=["x"], bindingFailureConditions=["y"])],
            all_nodes=True,
        ),
        shared_slice("b-plain", "p2", [device("plain")], all_nodes=True),
    ]
    assert picked(run(slices, [claim("c", request("n"))], node=None)) == [("n", "plain")]


# --- config -----------------------------------------------------------------------------


def test_config_from_class_then_from_claim() -> None:
    classes = [
        device_class("gpu", config=[{"class": 1}]),
        device_class("other", config=[{"other": 1}]),
    ]
    c = claim(
        "c",
        request("a"),
        request("b"),
        request("c", "other"),
        config=[
            {"requests": ["b"], "opaque": {"driver": DRIVER, "parameters": {"claim": "b"}}},
            {"opaque": {"driver": DRIVER, "parameters": {"claim": "all"}}},
            {"requests": ["zzz"], "opaque": {"driver": DRIVER, "parameters": {"claim": "none"}}},
        ],
    )
    outcome = run([gpus()], [c], classes=classes)
    assert allocation(outcome)["devices"]["config"] == [
        {
            "source": "FromClass",
            "requests": ["a", "b"],
            "opaque": {"driver": DRIVER, "parameters": {"class": 1}},
        },
        {
            "source": "FromClass",
            "requests": ["c"],
            "opaque": {"driver": DRIVER, "parameters": {"other": 1}},
        },
        {
            "source": "FromClaim",
            "requests": ["b"],
            "opaque": {"driver": DRIVER, "parameters": {"claim": "b"}},
        },
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"claim": "all"}}},
    ]


def test_config_for_all_requests_drops_the_request_list_and_names_subrequests() -> None:
    classes = [device_class("gpu", config=[{"k": 1}])]
    c = claim(
        "c",
        first_available("x", ("one", exact())),
        config=[{"requests": ["x/one"], "opaque": {"driver": DRIVER, "parameters": {"p": 1}}}],
    )
    outcome = run([gpus()], [c], classes=classes)
    assert allocation(outcome)["devices"]["config"] == [
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"k": 1}}},
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"p": 1}}},
    ]


# --- errors -----------------------------------------------------------------------------


def test_missing_class_is_an_error() -> None:
    outcome = run([gpus()], [claim("c", request("g", "nope"))])
    assert outcome.error is not None
    assert (
        'could not retrieve device class nope: deviceclass.resource.k8s.io "nope" not found'
        in outcome.error
    )


def test_selector_compile_errors() -> None:
    bad_class = device_class("gpu", ["1"])
    outcome = run([gpus()], [claim("c", request("g"))], classes=[bad_class])
    assert outcome.error is not None and outcome.error.startswith(
        "class gpu: selector #0: CEL compile error"
    )
    outcome = run([gpus()], [claim("c", request("g", selectors=["nope()"]))])
    assert (
        outcome.error is not None and "claim ns/c: selector #0: CEL compile error" in outcome.error
    )
    assert "undeclared reference to 'nope'" in outcome.error


def test_unknown_allocation_mode_is_an_error() -> None:
    outcome = run([gpus()], [claim("c", request("g", mode="Some"))])
    assert outcome.error is not None and "unsupported count mode Some" in outcome.error


def test_cel_runtime_error_means_no_match_or_abort() -> None:
    slices = [node_slice("node-1", [device("no-model"), device("m", {"model": "a"})])]
    c = claim("c", request("g", selectors=[f'{A}.model == "a"']))
    assert picked(run(slices, [c])) == [("g", "m")]
    allocator = Allocator(SliceInventory(slices, [GPU]), abort_on_cel_error=True)
    outcome = allocator.allocate([c], AllocatedState(), node=NODE_1)
    assert outcome.error is not None
    assert (
        "selector #0 on device" in outcome.error
        and "CEL runtime error: no such key: model" in outcome.error
    )


def test_at_most_32_results_per_claim() -> None:
    slices = [node_slice("node-1", [device(f"d{i}") for i in range(40)])]
    assert run(slices, [claim("c", request("g", count=32))]).ok
    outcome = run(slices, [claim("c", request("g", count=33))])
    assert outcome.error is not None and "exceeds the claim limit of 32" in outcome.error
    outcome = run(slices, [claim("c", request("g", mode="All"))])
    assert outcome.error is not None and "exceeds the claim limit of 32" in outcome.error


def test_search_budget() -> None:
    # Five pairwise distinct values are needed, only four exist: an exhaustive search.
    slices = [node_slice("node-1", [device(f"d{i}", {"v": i % 4}) for i in range(16)])]
    c = claim("c", request("g", count=5), constraints=[{"distinctAttribute": f"{DRIVER}/v"}])
    allocator = Allocator(SliceInventory(slices, [GPU]), max_steps=50)
    outcome = allocator.allocate([c], AllocatedState(), node=NODE_1)
    assert outcome.error is not None and "search stopped after 50 steps" in outcome.error
    assert Allocator(SliceInventory(slices, [GPU])).allocate([c], node=NODE_1).unsatisfiable
    assert outcome.exhausted == "steps"


def test_time_budget_stops_the_search_and_the_remaining_nodes() -> None:
    # The search above, on two nodes, with a deadline already past: the first look at the
    # clock stops it, and the second node is not tried (it would be out of time too).
    devices = [device(f"d{i}", {"v": i % 4}) for i in range(16)]
    slices = [node_slice("node-1", devices), node_slice("node-2", devices)]
    c = claim("c", request("g", count=5), constraints=[{"distinctAttribute": f"{DRIVER}/v"}])
    allocator = Allocator(SliceInventory(slices, [GPU]))
    nodes = [NODE_1, node("node-2")]
    outcome = allocator.allocate([c], AllocatedState(), nodes=nodes, deadline=time.monotonic() - 1)
    assert outcome.exhausted == "time" and not outcome.ok
    assert outcome.error == "search ran out of time without a result"
    assert outcome.nodes_tried == [None, "node-1"]
    # Without a deadline the same search ends, unsatisfiable, on both nodes.
    outcome = allocator.allocate([c], AllocatedState(), nodes=nodes)
    assert outcome.unsatisfiable and outcome.exhausted is None
    assert outcome.nodes_tried == [None, "node-1", "node-2"]


def test_one_shot_helper() -> None:
    taken = allocated_claim("other", {"devices": {"results": [result("gpu-0", "node-1")]}})
    outcome = allocate([gpus()], [GPU], [claim("c", request("g"))], [taken], node="node-1")
    assert picked(outcome) == [("g", "gpu-1")]


def test_a_state_follows_another_from_the_changes_of_its_snapshots() -> None:
    def results(*devices: str) -> dict[str, Any]:
        return {"devices": {"results": [result(d, "node-1") for d in devices]}}

    source, copy = AllocatedState(), AllocatedState()
    source.add("ns/a", results("gpu-0"))
    source.add("ns/b", results("gpu-1", "gpu-2"))
    before = source.snapshot()
    copy.update(before, [])
    source.add("ns/b", results("gpu-3"))  # changed
    source.remove("ns/a")
    source.add("ns/c", results("gpu-0"))
    after = source.snapshot()
    changed = {k: v for k, v in after.items() if before.get(k) is not v}
    assert set(changed) == {"ns/b", "ns/c"}  # an unchanged entry is the same object
    copy.update(changed, [k for k in before if k not in after])
    assert copy.dedicated == source.dedicated
    assert copy.holders(("gpu.alloc.test", "node-1", "gpu-0")) == ["ns/c"]
