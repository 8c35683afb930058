"""The fair-turn policy alone (pure: a clock of its own, no worker)."""

from __future__ import annotations

import pytest

from controller.claims.fairqueue import FairQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def queue(budget: float = 10.0, **kw: float) -> tuple[FairQueue[str], Clock]:
    clock = Clock()
    return FairQueue(budget, clock=clock, **kw), clock


def keys(q: FairQueue[str], size: int = 32) -> list[str]:
    return [key for key, _item, _budget in q.fresh(size).items]


def test_a_batch_takes_namespaces_round_robin() -> None:
    q, _ = queue()
    for i in range(10):
        q.push(f"a/c{i}", "a")
    q.push("b/c0", "b")
    q.push("c/c0", "c")
    # The namespace with ten claims does not fill the batch ahead of the others.
    assert keys(q, 4) == ["a/c0", "b/c0", "c/c0", "a/c1"]
    assert keys(q) == [f"a/c{i}" for i in range(2, 10)]
    assert keys(q) == []


def test_the_namespace_that_used_the_worker_goes_after_the_others() -> None:
    q, clock = queue()
    q.charge("a/c0", 10.0)
    for i in range(3):
        q.push(f"a/c{i}", "a")
    q.push("b/c0", "b")
    # Namespace a used more than a turn lately: b's claim is not batched with a's (it
    # would wait for the batch's turn spent on them), and goes first.
    assert keys(q, 2) == ["b/c0"]
    assert keys(q, 2) == ["a/c0", "a/c1"]
    # What a namespace used fades: after many half-lives it is even again.
    assert q.usage("a") == pytest.approx(10.0)
    clock.now += 30.0
    assert q.usage("a") == pytest.approx(5.0)
    clock.now += 600.0
    q.push("b/c1", "b")
    q.charge("b/c0", 0.01)
    assert keys(q) == ["a/c2", "b/c1"]  # both light again: least used first


def test_a_search_not_run_keeps_its_place() -> None:
    q, _ = queue()
    q.push("a/c0", "a")
    q.push("a/c1", "a")
    (first, *_rest) = q.fresh(1).items
    q.push("a/c0", first[1], front=True)
    assert keys(q) == ["a/c0", "a/c1"]


def test_the_budget_halves_per_failure_down_to_the_floor_and_resets() -> None:
    q, _ = queue(budget=10.0, floor=0.5)
    budgets = []
    for _ in range(7):
        budgets.append(q.budget("a/c0"))
        q.failed("a/c0", slow=False)
    assert budgets == [10.0, 5.0, 2.5, 1.25, 0.625, 0.5, 0.5]
    q.changed()  # the inventory changed, or devices were freed: it may succeed now
    assert q.budget("a/c0") == 10.0
    q.failed("a/c0", slow=False)
    assert q.budget("a/c0") == 5.0
    q.succeeded("a/c0")
    assert q.budget("a/c0") == 10.0
    q.failed("a/c0", slow=False)
    q.forget("a/c0")  # deleted
    assert q.budget("a/c0") == 10.0
    # Another claim's failures are its own.
    q.failed("a/c1", slow=False)
    assert q.budget("a/c2") == 10.0


def test_slow_claims_go_alone_in_their_lane_and_fresh_batches_have_a_turn() -> None:
    q, clock = queue(budget=10.0, turn=1.0)
    q.failed("a/slow0", slow=True)
    q.cut_short("a/slow1")  # ran out of its batch's turn: slow, but did not fail
    q.cut_short("b/slow0")
    for key in ("a/slow0", "a/slow1", "b/slow0", "c/fresh"):
        q.push(key, key)
    fresh = q.fresh(32)
    assert [(k, b) for k, _i, b in fresh.items] == [("c/fresh", 10.0)] and fresh.turn == 1.0
    assert (q.waiting(slow=False), q.waiting(slow=True)) == (0, 3)
    # A claim of a namespace whose claims ran out of time lately is slow too, for a while.
    assert q.is_slow("a/new") and not q.is_slow("c/new")
    clock.now += q.suspect
    assert not q.is_slow("a/new") and q.is_slow("a/slow0")
    q.charge("a/slow0", 5.0)
    picks = [q.slow() for _ in range(4)]
    assert [[(k, b) for k, _i, b in p.items] for p in picks] == [
        [("b/slow0", 10.0)],  # namespace a used the worker: b first
        [("a/slow0", 5.0)],  # one failure: half the budget
        [("a/slow1", 10.0)],
        [],
    ]
    assert all(p.turn is None for p in picks)
    q.succeeded("a/slow0")  # found: fresh again next time
    assert not q.is_slow("a/slow0")


def test_the_turn_is_never_longer_than_the_budget() -> None:
    q, _ = queue(budget=0.3, turn=1.0, floor=0.5)
    assert (q.turn, q.floor, q.budget("a/c")) == (0.3, 0.3, 0.3)
