"""Fair turns at the allocation worker: which waiting searches go next, with what budget.

Pure policy (no I/O, a clock passed in), used by :mod:`controller.claims.search`.

Invariants:

* **Per namespace**: waiting claims are queued per namespace, first come first served
  within one. A batch takes them round-robin across namespaces, the namespace that used
  the least worker time recently first (its searches' seconds, halving every
  ``half_life`` s), so a namespace with many waiting claims cannot fill every batch and
  one that used the worker a lot goes after the others.
* **Two lanes**: a claim is *slow* once a search of it ran out of time (its budget, or
  the turn of its batch: :data:`TURN` below), and so is every claim of its namespace for
  :data:`SUSPECT` s after that. Fresh claims are searched in batches whose whole round
  trip is bounded by a short turn; a slow claim is searched alone, with its own budget,
  in the slow lane, so it never sits in a batch ahead of fresh claims. With two worker
  processes the lanes run side by side; with one, fresh batches go first.
  A batch holds the claims of *light* namespaces only (less than a turn used lately)
  while any waits, so a light namespace's claim waits at most for the batch in flight.
* **Shrinking budget**: a claim's budget is the full one (``--allocation-timeout``)
  halved for every failed search since the last change that could help (an inventory
  change, devices freed: :meth:`FairQueue.changed`), down to ``floor``; a success or the
  claim's deletion resets it. So a claim that cannot be satisfied costs less and less, and
  what it costs is charged to its own namespace.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["FLOOR", "HALF_LIFE", "SUSPECT", "TURN", "FairQueue", "Pick"]

T = TypeVar("T")

TURN = 0.5
"""Seconds one batch of fresh claims may take in the worker; a search not done by then
continues in the slow lane (seconds a fresh claim waits for the batch ahead, at most)."""
FLOOR = 0.5
"""Seconds: a budget is never halved below this (or the full budget, if smaller)."""
HALF_LIFE = 30.0
"""Seconds over which a namespace's recorded worker time halves."""
SUSPECT = 30.0
"""Seconds a namespace's claims all go to the slow lane after one of them ran out of time."""


@dataclass
class _Record:
    strikes: int = 0  # failed searches since ``epoch``
    epoch: int = 0
    slow: bool = False


@dataclass
class Pick(Generic[T]):
    """One round trip: the items with their budgets; ``turn``: the seconds the whole
    batch may take (None: the sum of the budgets)."""

    items: list[tuple[str, T, float]] = field(default_factory=list)
    turn: float | None = None


def namespace_of(key: str) -> str:
    return key.partition("/")[0] if "/" in key else ""


class FairQueue(Generic[T]):
    """The waiting searches of both lanes and what the policy remembers (module docstring).

    ``budget``: the full budget of a search; ``turn``: seconds a batch of fresh claims may
    take (at most ``budget``); ``floor``: the smallest budget.
    """

    def __init__(
        self,
        budget: float,
        *,
        turn: float = TURN,
        floor: float = FLOOR,
        half_life: float = HALF_LIFE,
        suspect: float = SUSPECT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.full = budget
        self.turn = min(turn, budget)
        self.floor = min(floor, budget)
        self.half_life = half_life
        self.suspect = suspect
        self._slow_since: dict[str, float] = {}  # namespace -> when a search of it ran out
        self.clock = clock
        self._lanes: tuple[dict[str, deque[tuple[str, T]]], ...] = ({}, {})  # fresh, slow
        self._records: dict[str, _Record] = {}
        self._usage: dict[str, tuple[float, float]] = {}  # namespace -> (seconds, at)
        self._served: dict[str, int] = {}  # namespace -> when last served (a counter)
        self._serial = 0
        self._epoch = 0

    # --- what is known of a claim ---------------------------------------------------------

    def _record(self, key: str) -> _Record:
        record = self._records.setdefault(key, _Record(epoch=self._epoch))
        if record.epoch != self._epoch:  # something changed since its failures
            record.strikes, record.epoch = 0, self._epoch
        return record

    def budget(self, key: str) -> float:
        """The budget of ``key``'s next search."""
        strikes = self._record(key).strikes
        return max(self.floor, self.full * math.ldexp(1.0, -strikes))

    def is_slow(self, key: str) -> bool:
        """Whether ``key`` is searched in the slow lane: it, or a claim of its namespace
        in the last ``suspect`` s, ran out of time."""
        if key in self._records and self._records[key].slow:
            return True
        since = self._slow_since.get(namespace_of(key))
        return since is not None and self.clock() - since < self.suspect

    def _ran_out(self, key: str) -> None:
        self._record(key).slow = True
        self._slow_since[namespace_of(key)] = self.clock()

    def failed(self, key: str, *, slow: bool) -> None:
        """A search of ``key`` found nothing; ``slow``: it ran out of time."""
        self._record(key).strikes += 1
        if slow:
            self._ran_out(key)

    def cut_short(self, key: str) -> None:
        """A search of ``key`` ran out of its batch's turn: it goes to the slow lane (its
        budget unchanged: it did not fail)."""
        self._ran_out(key)

    def succeeded(self, key: str) -> None:
        self._records.pop(key, None)

    def forget(self, key: str) -> None:
        """``key`` is gone (deleted): nothing is remembered of it."""
        self._records.pop(key, None)

    def changed(self) -> None:
        """The inventory changed or devices were freed: every budget is full again."""
        self._epoch += 1

    # --- worker time ------------------------------------------------------------------------

    def usage(self, namespace: str) -> float:
        """Seconds of worker time ``namespace`` used recently (decayed)."""
        seconds, at = self._usage.get(namespace, (0.0, 0.0))
        return seconds * math.exp2((at - self.clock()) / self.half_life)

    def charge(self, key: str, seconds: float) -> None:
        """``key``'s search took ``seconds`` of worker time: its namespace pays."""
        ns = namespace_of(key)
        self._usage[ns] = (self.usage(ns) + max(0.0, seconds), self.clock())

    # --- the queues ---------------------------------------------------------------------

    def push(self, key: str, item: T, *, front: bool = False) -> None:
        """Queue ``item`` (the search of ``key``) in its lane, at the end of its
        namespace's queue, or at the front (a search that was not run keeps its place)."""
        lane = self._lanes[1 if self.is_slow(key) else 0]
        queue = lane.setdefault(namespace_of(key), deque())
        if front:
            queue.appendleft((key, item))
        else:
            queue.append((key, item))

    def waiting(self, slow: bool) -> int:
        return sum(len(q) for q in self._lanes[1 if slow else 0].values())

    def _order(self, lane: dict[str, deque[tuple[str, T]]]) -> list[str]:
        """Namespaces with waiting claims: least recent use first, then the one served
        longest ago (round-robin among equals)."""
        return sorted(lane, key=lambda ns: (round(self.usage(ns), 3), self._served.get(ns, -1)))

    def _take(self, lane: dict[str, deque[tuple[str, T]]], ns: str) -> tuple[str, T]:
        queue = lane[ns]
        entry = queue.popleft()
        if not queue:
            del lane[ns]
        self._serial += 1
        self._served[ns] = self._serial
        return entry

    def fresh(self, size: int) -> Pick[T]:
        """Up to ``size`` fresh claims, round-robin across namespaces, within one turn.
        While a *light* namespace (one that used less than a turn lately) waits, the batch
        is of light namespaces only: a claim of theirs never waits in a batch for a turn
        spent on a heavy namespace's claims (all of a batch are answered together)."""
        lane = self._lanes[0]
        pick: Pick[T] = Pick(turn=self.turn)
        order = self._order(lane)
        light = [ns for ns in order if self.usage(ns) < self.turn]
        order = light or order
        while order and len(pick.items) < size:
            for ns in order:
                if ns in lane and len(pick.items) < size:
                    key, item = self._take(lane, ns)
                    pick.items.append((key, item, self.budget(key)))
            order = [ns for ns in order if ns in lane]
        return pick

    def slow(self) -> Pick[T]:
        """One slow claim (of the namespace that used the least time), alone."""
        lane = self._lanes[1]
        pick: Pick[T] = Pick()
        order = self._order(lane)
        if order:
            key, item = self._take(lane, order[0])
            pick.items.append((key, item, self.budget(key)))
        self._prune()
        return pick

    def _prune(self) -> None:
        """Forget the worker time of namespaces that used next to none lately."""
        if len(self._usage) > 64:
            for ns in [ns for ns in self._usage if self.usage(ns) < 0.001]:
                del self._usage[ns]
                self._served.pop(ns, None)
        if len(self._slow_since) > 64:
            now = self.clock()
            for ns in [ns for ns, at in self._slow_since.items() if now - at >= self.suspect]:
                del self._slow_since[ns]
