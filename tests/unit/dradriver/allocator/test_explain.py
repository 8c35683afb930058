"""Explanations of (failed) allocations, device by device."""

from __future__ import annotations

from typing import Any

from dradriver.allocator import (
    AllocatedState,
    Allocator,
    ExplainRow,
    SliceInventory,
    explain,
    format_table,
    summarize,
)
from tests.unit.dradriver.allocator.builders import (
    DRIVER,
    A,
    claim,
    device,
    device_class,
    exact,
    first_available,
    node,
    node_slice,
    request,
    result,
    shared_slice,
)

GPU = device_class()
A100 = f'{A}.model == "a100"'


def inventory() -> SliceInventory:
    slices = [
        node_slice(
            "node-1",
            [
                device("gpu-0", {"model": "a100"}),
                device("gpu-1", {"model": "t4"}),
                device("gpu-2"),
                device(
                    "gpu-3",
                    {"model": "a100"},
                    taints=[{"key": "hw", "value": "bad", "effect": "NoSchedule"}],
                ),
            ],
        ),
        node_slice(
            "node-1", [device("foreign", {"model": "a100"})], pool="foreign", driver="other.dev"
        ),
        node_slice("node-2", [device("gpu-0", {"model": "a100"})]),
        node_slice("node-3", [device("gpu-0", {"model": "a100"})], name="s-old", generation=1),
        node_slice("node-3", [], name="s-new", generation=2),
        node_slice("node-4", [device("gpu-0", {"model": "a100"})], count=2),
    ]
    return SliceInventory(slices, [GPU])


def state() -> AllocatedState:
    s = AllocatedState()
    s.add("ns/holder", {"devices": {"results": [result("gpu-0", "node-1")]}})
    return s


def by_device(rows: list[ExplainRow]) -> dict[tuple[str, str], ExplainRow]:
    return {(r.pool, r.device): r for r in rows if r.device}


def test_every_device_gets_a_reason() -> None:
    rows = explain(
        inventory(), claim("c", request("gpu", selectors=[A100])), state(), node=node("node-1")
    )
    devices = by_device(rows)
    assert devices[("node-1", "gpu-0")].reason == "allocated to claim ns/holder"
    assert devices[("node-1", "gpu-0")].category == "allocated"
    assert devices[("node-1", "gpu-1")].reason == f"request gpu selector #0 is false: {A100}"
    gpu2 = devices[("node-1", "gpu-2")]
    assert gpu2.category == "selector"
    assert gpu2.reason.startswith("request gpu selector #0 failed: no such key: model")
    assert devices[("node-1", "gpu-3")].reason == "untolerated taint hw=bad:NoSchedule"
    assert devices[("foreign", "foreign")].reason == (
        f'class gpu selector #0 is false: device.driver == "{DRIVER}"'
    )
    assert devices[("node-2", "gpu-0")].reason == (
        "not reachable from node node-1: local to node node-2"
    )
    assert "stale, ignored" in devices[("node-3", "gpu-0")].reason
    assert devices[("node-4", "gpu-0")].reason.startswith(
        f"pool {DRIVER}/node-4 is incomplete: 1 of 2 slices"
    )
    assert all(r.verdict == "excluded" for r in devices.values())
    summary_row = [r for r in rows if not r.device]
    assert summary_row == [
        ExplainRow(
            "ns/c", "gpu", "", "", "", "unsatisfied", "needs 1 device(s), 0 available", "count"
        )
    ]


def test_pick_a_node_explanation_uses_each_devices_own_node() -> None:
    rows = explain(
        inventory(),
        claim("c", request("gpu", selectors=[A100])),
        state(),
        nodes=["node-1", "node-2"],
    )
    devices = by_device(rows)
    # On its own node, node-2's gpu-0 is fine: the claim is in fact allocatable there.
    assert devices[("node-2", "gpu-0")].verdict == "allocated"
    rows = explain(
        inventory(),
        claim("c", request("gpu", selectors=[A100], count=2)),
        state(),
        nodes=["node-1", "node-2"],
    )
    devices = by_device(rows)
    assert devices[("node-2", "gpu-0")].verdict == "available"
    assert devices[("node-1", "gpu-0")].verdict == "excluded"
    assert any(r.reason == "needs 2 device(s), 1 available" for r in rows)


def test_devices_on_different_nodes_do_not_add_up() -> None:
    slices = [node_slice("node-1", [device("a")]), node_slice("node-2", [device("b")])]
    rows = explain(
        SliceInventory(slices, [GPU]), claim("c", request("g", count=2)), nodes=["node-1", "node-2"]
    )
    assert (
        rows[-1].reason
        == "needs 2 device(s) usable from one node; available per node: node-1: 1, node-2: 1"
    )


def test_no_node_given_for_node_local_devices() -> None:
    rows = explain(
        SliceInventory([node_slice("node-1", [device("a")])], [GPU]), claim("c", request("g"))
    )
    assert by_device(rows)[("node-1", "a")].reason == (
        "local to node node-1: it needs a node, and no candidate nodes were given"
    )


def test_allocatable_claim_lists_the_chosen_devices() -> None:
    rows = explain(inventory(), claim("c", request("gpu", selectors=[A100])), node=node("node-1"))
    assert rows == [
        ExplainRow(
            "ns/c",
            "gpu",
            DRIVER,
            "node-1",
            "gpu-0",
            "allocated",
            "allocatable on node node-1",
            "ok",
        )
    ]
    assert summarize(rows) == "allocatable: gpu=node-1/gpu-0"


def test_explaining_an_allocated_claim_ignores_its_own_allocation() -> None:
    s = state()
    rows = explain(
        inventory(), claim("holder", request("gpu", selectors=[A100])), s, node=node("node-1")
    )
    assert rows[0].verdict == "allocated" and rows[0].device == "gpu-0"
    assert s.holders((DRIVER, "node-1", "gpu-0")) == ["ns/holder"]  # not modified


def test_constraint_that_cannot_be_met_is_named() -> None:
    slices = [
        node_slice(
            "node-1",
            [device("g0", {"kind": "gpu", "numa": 0}), device("n1", {"kind": "nic", "numa": 1})],
        )
    ]
    c = claim(
        "c",
        request("gpu", selectors=[f'{A}.kind == "gpu"']),
        request("nic", selectors=[f'{A}.kind == "nic"']),
        constraints=[{"matchAttribute": f"{DRIVER}/numa"}],
    )
    rows = explain(SliceInventory(slices, [GPU]), c, node=node("node-1"))
    last = rows[-1]
    assert last.category == "constraint" and last.verdict == "unsatisfied"
    assert last.reason.startswith(
        f"constraint #0 (matchAttribute {DRIVER}/numa) cannot be satisfied"
    )
    assert "gpu → 0: g0" in last.reason and "nic → 1: n1" in last.reason
    assert "constraint #0" in summarize(rows)


def test_competing_requests() -> None:
    slices = [node_slice("node-1", [device("only")])]
    rows = explain(
        SliceInventory(slices, [GPU]), claim("c", request("a"), request("b")), node=node("node-1")
    )
    assert rows[-1].reason.startswith(
        "each request can be satisfied on its own, but not all of them"
    )


def test_first_available_rows_per_subrequest() -> None:
    slices = [node_slice("node-1", [device("t4", {"model": "t4"})])]
    c = claim(
        "c",
        first_available(
            "gpu",
            ("big", exact(selectors=[f'{A}.model == "h100"'])),
            ("mid", exact(selectors=[A100])),
        ),
    )
    rows = explain(SliceInventory(slices, [GPU]), c, node=node("node-1"))
    requests = {r.request for r in rows}
    assert requests == {"gpu/big", "gpu/mid", "gpu"}
    assert rows[-1] == ExplainRow(
        "ns/c",
        "gpu",
        "",
        "",
        "",
        "unsatisfied",
        "none of the 2 firstAvailable subrequests can be satisfied",
        "count",
    )


def test_class_errors_are_rows() -> None:
    rows = explain(inventory(), claim("c", request("gpu", "missing")), node=node("node-1"))
    assert rows[0].verdict == "error" and rows[0].request == "gpu"
    assert 'deviceclass.resource.k8s.io "missing" not found' in rows[0].reason
    assert "not found" in summarize(rows)


def test_counters_and_capacity_reasons() -> None:
    counters = node_slice(
        "node-1",
        [],
        name="node-1-counters",
        count=2,
        sharedCounters=[{"name": "set", "counters": {"mem": {"value": "10Gi"}}}],
    )
    devices = node_slice(
        "node-1",
        [
            device(
                "part",
                consumesCounters=[{"counterSet": "set", "counters": {"mem": {"value": "8Gi"}}}],
            ),
            device(
                "part-2",
                consumesCounters=[{"counterSet": "set", "counters": {"mem": {"value": "4Gi"}}}],
            ),
            device("nic", capacity={"bw": "10G"}, allowMultipleAllocations=True),
        ],
        name="node-1-devices",
        count=2,
    )
    s = AllocatedState()
    s.add("ns/a", {"devices": {"results": [result("part", "node-1")]}})
    s.add(
        "ns/b",
        {
            "devices": {
                "results": [
                    result(
                        "nic",
                        "node-1",
                        shareID="0d5c6a3e-1111-4a4a-8a8a-123456789abc",
                        consumedCapacity={"bw": "8G"},
                    )
                ]
            }
        },
    )
    c = claim("c", request("g", selectors=["device.attributes.size() >= 0"], capacity={"bw": "4G"}))
    rows = explain(SliceInventory([counters, devices], [GPU]), c, s, node=node("node-1"))
    found = by_device(rows)
    assert found[("node-1", "part")].reason == "allocated to claim ns/a"
    assert (
        found[("node-1", "part-2")].reason
        == "not enough counter mem in counter set set: needs 4Gi, 2Gi left"
    )
    assert (
        found[("node-1", "nic")].reason
        == "not enough bw: needs 4G, 2G of 10G free (in use by ns/b)"
    )


def test_driver_filter_and_table() -> None:
    rows = explain(
        inventory(),
        claim("c", request("gpu", selectors=[A100])),
        state(),
        node=node("node-1"),
        drivers=[DRIVER],
    )
    assert all(r.driver in ("", DRIVER) for r in rows)
    table = format_table(rows)
    lines = table.splitlines()
    assert lines[0].split() == ["REQUEST", "DRIVER", "POOL", "DEVICE", "VERDICT", "REASON"]
    assert any("allocated to claim ns/holder" in line for line in lines)
    assert "-" in lines[-1].split()[1]  # request-level row has no device
    message = summarize(rows)
    assert message.startswith("request gpu: needs 1 device(s), 0 available (0 of ")
    assert "allocated to other claims (ns/holder)" in message
    assert len(summarize(rows, max_length=40)) == 40


def test_reuses_a_previous_outcome() -> None:
    allocator = Allocator(inventory())
    c = claim("c", request("gpu", selectors=[A100]))
    outcome = allocator.allocate([c], state(), node=node("node-1"))
    rows = explain(allocator, c, state(), node=node("node-1"), outcome=outcome)
    assert rows[-1].reason == "needs 1 device(s), 0 available"


def test_network_pool_unreachable_from_candidates() -> None:
    slices: list[dict[str, Any]] = [
        shared_slice(
            "net",
            "fabric",
            [device("nic")],
            node_selector={
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}
                ]
            },
        )
    ]
    rows = explain(
        SliceInventory(slices, [GPU]), claim("c", request("n")), nodes=[node("node-1", zone="a")]
    )
    assert (
        by_device(rows)[("fabric", "nic")].reason
        == "no node matches the node selector of its slice"
    )


def test_a_deadline_stops_the_searches_of_an_explanation() -> None:
    # Five distinct values of v among four: the search with the constraint is exhaustive.
    slices = [node_slice("node-1", [device(f"d{i}", {"v": i % 4}) for i in range(16)])]
    allocator = Allocator(SliceInventory(slices, [GPU]))
    c = claim("c", request("g", count=5), constraints=[{"distinctAttribute": f"{DRIVER}/v"}])
    outcome = allocator.allocate([c], node=node("node-1"))
    assert outcome.unsatisfiable
    rows = explain(allocator, c, node=node("node-1"), outcome=outcome)
    assert "cannot be satisfied together" in summarize(rows)
    # The explanation tries the claim again with and without the constraint: out of time,
    # it says so instead of blaming the constraint.
    rows = explain(allocator, c, node=node("node-1"), outcome=outcome, deadline=0.0)
    assert rows[-1] == ExplainRow(
        "ns/c", "", "", "", "", "error", "search ran out of time without a result", "error"
    )
