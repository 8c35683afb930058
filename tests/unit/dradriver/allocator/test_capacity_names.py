"""Capacity named with or without the driver's domain, as the 1.38 scheduler resolves it.

``slots`` and ``<driver>/slots`` are one capacity, in a claim's requests, in a slice and in
a claim's status; a request naming it both ways is an error; the status spells it as the
slice does (k8s.io/dynamic-resource-allocation v0.38.0-beta.0, ``consumable_capacity.go``).
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest

from dradriver.allocator import AllocatedState, Allocator, SliceInventory, claim_key, explain
from dradriver.k8s.objects import Obj
from tests.unit.dradriver.allocator.builders import (
    DRIVER,
    allocated_claim,
    allocation,
    claim,
    device,
    device_class,
    node,
    node_slice,
    request,
    result,
)

NODE_1 = node("node-1")
KVM = (DRIVER, "node-1", "kvm")
QUALIFIED = f"{DRIVER}/slots"


def slots(value: str = "2") -> Obj:
    return {"value": value, "requestPolicy": {"default": "1", "validRange": {"min": "1"}}}


def allocator(capacity: dict[str, Any] | None = None) -> Allocator:
    """One shareable device ``kvm`` (by default 2 ``slots``, spelled as the slice does)."""
    kvm = device("kvm", capacity=capacity or {"slots": slots()}, allowMultipleAllocations=True)
    return Allocator(SliceInventory([node_slice("node-1", [kvm])], [device_class()]))


def asking(name: str, *spellings: str) -> Obj:
    return claim(name, request("r", capacity={s: "1" for s in spellings}))


def consumed(outcome: Any, index: int = 0) -> dict[str, str]:
    entry = allocation(outcome, index)["devices"]["results"][0]
    assert uuid.UUID(entry["shareID"])
    found: dict[str, str] = entry["consumedCapacity"]
    return found


def test_both_spellings_count_against_one_capacity_in_one_attempt() -> None:
    alloc = allocator()
    both = alloc.allocate([asking("a", QUALIFIED), asking("b", "slots")], node=NODE_1)
    assert both.ok, both.error
    # Whichever spelling the claim used, the status spells it as the slice does.
    assert consumed(both, 0) == consumed(both, 1) == {"slots": "1"}
    # 1 + 1 + 1 of 2 slots: a third claim in the same attempt does not fit, either spelling.
    for third in (QUALIFIED, "slots"):
        claims = [asking("a", QUALIFIED), asking("b", "slots"), asking("c", third)]
        assert alloc.allocate(claims, node=NODE_1).unsatisfiable


def test_both_spellings_count_across_claims() -> None:
    alloc = allocator()
    state = AllocatedState()
    for c in (asking("a", QUALIFIED), asking("b", "slots")):
        outcome = alloc.allocate([c], state, node=NODE_1)
        assert outcome.ok, outcome.error
        state.add(claim_key(c), allocation(outcome))
    assert state.consumed[KVM] == {QUALIFIED: Decimal(2)}
    assert alloc.allocate([asking("c", QUALIFIED)], state, node=NODE_1).unsatisfiable
    assert alloc.allocate([asking("c", "slots")], state, node=NODE_1).unsatisfiable
    # Statuses read back from the API server, one written with each spelling.
    statuses = [
        allocated_claim(
            name,
            {
                "devices": {
                    "results": [
                        result("kvm", "node-1", shareID=str(uuid.uuid4()), consumedCapacity=cc)
                    ]
                }
            },
        )
        for name, cc in (("x", {QUALIFIED: "1"}), ("y", {"slots": "1"}))
    ]
    state = AllocatedState.from_claims(statuses)
    assert state.consumed[KVM] == {QUALIFIED: Decimal(2)}
    assert alloc.allocate([asking("c", "slots")], state, node=NODE_1).unsatisfiable
    state.remove("ns/y")
    assert alloc.allocate([asking("c", "slots")], state, node=NODE_1).ok


def test_a_status_spelling_both_keeps_the_qualified_entry() -> None:
    for cc in ({"slots": "1", QUALIFIED: "2"}, {QUALIFIED: "2", "slots": "1"}):
        state = AllocatedState()
        state.add(
            "ns/a",
            {"devices": {"results": [result("kvm", "node-1", shareID="s", consumedCapacity=cc)]}},
        )
        assert state.consumed[KVM] == {QUALIFIED: Decimal(2)}


def test_both_spellings_in_one_request_are_refused() -> None:
    alloc = allocator()
    c = asking("c", "slots", QUALIFIED)
    outcome = alloc.allocate([c], node=NODE_1)
    assert not outcome.ok
    assert outcome.error == (
        f"claim ns/c, request r: capacity 'slots' requested both as 'slots' and as "
        f"'{QUALIFIED}', which name the same capacity of {DRIVER} devices: request it once"
    )
    # The same order the other way round gives the same message.
    outcome = alloc.allocate([asking("c", QUALIFIED, "slots")], node=NODE_1)
    assert outcome.error is not None and "both as 'slots' and as" in outcome.error
    rows = explain(alloc, c, AllocatedState(), node=NODE_1)
    assert any(
        r.device == "kvm" and r.category == "capacity" and "requested both as" in r.reason
        for r in rows
    )
    # A device without that capacity just does not match (as in the scheduler).
    other = allocator({"memory": {"value": "8Gi"}})
    assert other.allocate([c], node=NODE_1).unsatisfiable


@pytest.mark.parametrize(
    ("in_slice", "asked", "status"),
    [
        ("slots", QUALIFIED, "slots"),
        ("slots", "slots", "slots"),
        (QUALIFIED, "slots", QUALIFIED),
        (QUALIFIED, QUALIFIED, QUALIFIED),
        ("example.com/slots", "example.com/slots", "example.com/slots"),
    ],
)
def test_status_spells_the_capacity_as_the_slice(in_slice: str, asked: str, status: str) -> None:
    outcome = allocator({in_slice: slots()}).allocate([asking("c", asked)], node=NODE_1)
    assert consumed(outcome) == {status: "1"}


def test_another_domain_is_not_the_driver_s() -> None:
    alloc = allocator({"example.com/slots": slots()})
    assert alloc.allocate([asking("c", "slots")], node=NODE_1).unsatisfiable
    assert alloc.allocate([asking("c", QUALIFIED)], node=NODE_1).unsatisfiable


def test_a_slice_spelling_both_keeps_the_qualified_entry() -> None:
    for capacity in (
        {"slots": slots("1"), QUALIFIED: slots("3")},
        {QUALIFIED: slots("3"), "slots": slots("1")},
    ):
        alloc = allocator(capacity)
        outcome = alloc.allocate([asking(n, "slots") for n in "abc"], node=NODE_1)
        assert [consumed(outcome, i) for i in range(3)] == [{QUALIFIED: "1"}] * 3
        assert alloc.allocate([asking(n, "slots") for n in "abcd"], node=NODE_1).unsatisfiable
