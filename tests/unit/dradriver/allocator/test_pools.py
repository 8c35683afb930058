"""PoolCache: a new inventory reuses the pools whose slices are the same objects, and is
then the same as one built from nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dradriver.allocator import AllocatedState, Allocator
from dradriver.allocator.inventory import PoolCache, SliceInventory
from dradriver.allocator.nodes import node_info
from dradriver.k8s.objects import Obj
from tests.unit.dradriver.allocator.builders import (
    A,
    claim,
    device,
    device_class,
    node,
    node_slice,
    picked,
    request,
)


def summary(inventory: SliceInventory) -> tuple[Any, ...]:
    """Everything an allocation reads from the inventory's pools and devices."""
    return (
        [
            (p.id, p.generation, p.complete, p.invalid, p.slice_names, sorted(p.node_names))
            for p in inventory.pools
        ],
        [(d.id, d.index, d.slice_name, d.placement) for d in inventory.devices],
        [(d.id, d.stale) for d in inventory.stale],
        {k: d.index for k, d in inventory.by_id.items()},
    )


def slices_for(nodes: int) -> dict[str, Obj]:
    return {
        f"n{i}": node_slice(f"n{i}", [device(f"d{j}", {"model": "a"}) for j in range(2)])
        for i in range(nodes)
    }


def test_an_unchanged_slice_keeps_its_pool_and_a_changed_one_is_rebuilt() -> None:
    slices = slices_for(4)
    cache = PoolCache()
    first = SliceInventory(slices.values(), pools=cache)
    assert (cache.built, cache.reused) == (4, 0)
    kept = first.pools[0]

    slices["n2"] = node_slice("n2", [device("d0"), device("d1"), device("d2")], generation=2)
    second = SliceInventory(slices.values(), pools=cache)

    assert (cache.built, cache.reused) == (5, 3)
    assert second.pools[0] is kept
    assert summary(second) == summary(SliceInventory(slices.values()))
    assert [d.name for d in second.pools[2].devices] == ["d0", "d1", "d2"]


def test_an_equal_slice_in_a_new_object_is_rebuilt() -> None:
    """Reuse is by identity, never by a deep comparison of 40,000 devices."""
    slices = slices_for(2)
    cache = PoolCache()
    SliceInventory(slices.values(), pools=cache)
    slices["n0"] = dict(slices["n0"])
    SliceInventory(slices.values(), pools=cache)
    assert (cache.built, cache.reused) == (3, 1)


def test_a_pool_whose_slices_are_gone_leaves_the_cache() -> None:
    slices = slices_for(3)
    cache = PoolCache()
    SliceInventory(slices.values(), pools=cache)
    del slices["n1"]
    inventory = SliceInventory(slices.values(), pools=cache)
    assert len(cache) == 2
    assert [p.name for p in inventory.pools] == ["n0", "n2"]


def test_the_newest_inventory_allocates_the_changed_pool() -> None:
    """End to end: the device added to a reused inventory is allocated, by its new index."""
    slices = slices_for(2)
    classes = [device_class("gpu")]
    cache = PoolCache()
    SliceInventory(slices.values(), classes, pools=cache)
    slices["n1"] = node_slice(
        "n1", [device("d0"), device("d1"), device("big", {"model": "b"})], generation=2
    )
    allocator = Allocator(SliceInventory(slices.values(), classes, pools=cache))
    want = claim("c", request("r", selectors=[f'{A}.model == "b"']))
    outcome = allocator.allocate([want], AllocatedState(), nodes=[node_info(node("n1"))])
    assert picked(outcome) == [("r", "big")]


# A slice edit: (node, generation bump, device count, whether the pool is split in two).
edits = st.lists(
    st.tuples(st.integers(0, 5), st.booleans(), st.integers(0, 3), st.booleans()),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(edits)
def test_after_any_edits_the_cached_inventory_equals_a_fresh_one(
    steps: list[tuple[int, bool, int, bool]],
) -> None:
    slices: dict[str, Obj] = {}
    generations: dict[int, int] = {}
    cache = PoolCache()
    for index, bump, count, split in steps:
        generation = generations.get(index, 1) + (1 if bump else 0)
        generations[index] = generation
        nodename = f"n{index}"
        for name in [k for k in slices if k.startswith(f"{nodename}-")]:
            if bump:  # an older generation's slices stay for a while: stale
                continue
            del slices[name]
        devices = [device(f"d{j}") for j in range(count)]
        parts = [devices[: count // 2], devices[count // 2 :]] if split else [devices]
        for k, part in enumerate(parts):
            name = f"{nodename}-g{generation}-{k}"
            slices[name] = node_slice(
                nodename, part, name=name, pool=nodename, generation=generation, count=len(parts)
            )
        if not count:  # no devices at all: the node's pool is gone
            for name in [k for k in slices if k.startswith(f"{nodename}-")]:
                del slices[name]
        cached = SliceInventory(slices.values(), pools=cache)
        assert summary(cached) == summary(SliceInventory(slices.values()))
        assert len(cache) == len(cached.pools)
