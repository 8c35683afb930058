"""FreeNodes: the nodes with a free own device, kept current from the state's journal."""

from __future__ import annotations

import random

import pytest

from dradriver.allocator import AllocatedState, Allocator, SliceInventory
from dradriver.allocator import state as state_module
from dradriver.allocator.freenodes import FreeNodes
from tests.unit.dradriver.allocator.builders import (
    DRIVER,
    claim,
    device,
    device_class,
    node_slice,
    request,
    shared_slice,
)


def inventory(nodes: int, per_node: int) -> SliceInventory:
    slices = [
        node_slice(f"n{n:02d}", [device(f"d{i}") for i in range(per_node)]) for n in range(nodes)
    ]
    return SliceInventory(slices, [device_class()])


def hold(state: AllocatedState, key: str, node: str, dev: str) -> None:
    state.add(key, {"devices": {"results": [{"driver": DRIVER, "pool": node, "device": dev}]}})


def fresh(inv: SliceInventory, state: AllocatedState) -> list[str]:
    index = FreeNodes(inv)
    index.sync(state)
    return list(index.names())


def test_a_node_leaves_when_its_last_device_is_taken_and_returns_when_one_is_freed() -> None:
    inv = inventory(3, 2)
    state = AllocatedState()
    index = FreeNodes(inv)
    index.sync(state)
    assert index.names() == ["n00", "n01", "n02"]
    hold(state, "ns/a", "n01", "d0")
    index.sync(state)
    assert index.names() == ["n00", "n01", "n02"]
    hold(state, "ns/b", "n01", "d1")
    index.sync(state)
    assert index.names() == ["n00", "n02"]
    state.remove("ns/a")
    index.sync(state)
    assert index.names() == ["n00", "n01", "n02"]


def test_incremental_sync_matches_a_rebuild_through_random_changes() -> None:
    rng = random.Random(7)
    inv = inventory(6, 3)
    state = AllocatedState()
    index = FreeNodes(inv)
    held: list[str] = []
    for step in range(400):
        if held and rng.random() < 0.4:
            state.remove(held.pop(rng.randrange(len(held))))
        else:
            key = f"ns/c{step}"
            hold(state, key, f"n{rng.randrange(6):02d}", f"d{rng.randrange(3)}")
            held.append(key)
        if rng.random() < 0.3:
            index.sync(state)
            assert index.names() == fresh(inv, state)
    index.sync(state)
    assert index.names() == fresh(inv, state)


def test_a_cleared_journal_or_another_state_means_a_rebuild(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(state_module, "JOURNAL_LIMIT", 4)
    inv = inventory(3, 1)
    state = AllocatedState()
    index = FreeNodes(inv)
    index.sync(state)
    for n in range(3):
        hold(state, f"ns/c{n}", f"n{n:02d}", "d0")
        hold(state, f"ns/x{n}", "n00", "d0")  # churn on n00 runs the journal over
    assert state.changes_since(0) is None
    index.sync(state)
    assert index.names() == []
    other = AllocatedState()
    index.sync(other)
    assert index.names() == ["n00", "n01", "n02"]


def test_shared_devices_and_unusable_pools_keep_their_node_in_the_list() -> None:
    shared = node_slice("n00", [device("d0", allowMultipleAllocations=True)])
    broken = node_slice("n01", [device("d0"), device("d0")])  # duplicate: invalid pool
    wide = shared_slice("fabric", "fabric", [device("net0")], all_nodes=True)
    inv = SliceInventory([shared, broken, wide], [device_class()])
    state = AllocatedState()
    hold(state, "ns/a", "n00", "d0")
    assert fresh(inv, state) == ["n00", "n01"]


def test_a_full_cluster_is_answered_without_trying_its_nodes() -> None:
    """The observable effect: after the attempt without a node finds nothing, only the
    nodes with a free own device are tried (the others could add nothing)."""
    inv = inventory(50, 1)
    allocator = Allocator(inv)
    state = AllocatedState()
    nodes = [f"n{n:02d}" for n in range(50)]
    for n in range(49):
        hold(state, f"ns/c{n}", f"n{n:02d}", "d0")
    outcome = allocator.allocate([claim("last", request("r"))], state, nodes=nodes)
    assert outcome.ok and outcome.node == "n49"
    assert outcome.nodes_tried == [None, "n49"]
    hold(state, "ns/c49", "n49", "d0")
    outcome = allocator.allocate([claim("more", request("r"))], state, nodes=nodes)
    assert not outcome.ok and outcome.nodes_tried == [None]


def test_admin_access_still_tries_every_node() -> None:
    inv = inventory(3, 1)
    allocator = Allocator(inv)
    state = AllocatedState()
    for n in range(3):
        hold(state, f"ns/c{n}", f"n{n:02d}", "d0")
    outcome = allocator.allocate(
        [claim("admin", request("r", admin=True))], state, nodes=["n00", "n01", "n02"]
    )
    assert outcome.ok and outcome.node == "n00"
