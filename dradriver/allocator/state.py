"""What is already allocated: devices, shares of multi-allocatable devices, their capacity.

Built the way the scheduler gathers its allocated state from every allocated claim:

* results with ``adminAccess: true`` do not count (admin access never takes a device);
* results with a ``shareID`` are shares of a multi-allocatable device: the device stays
  allocatable, but its ``consumedCapacity`` adds up, by fully-qualified name whichever
  spelling (``slots`` or ``<driver>/slots``) each claim's status uses;
* every other result takes the device exclusively.

The state also remembers which claim holds what, so explanations can say "allocated to
claim ns/name". Claims are keyed by ``namespace/name`` (or whatever key the caller uses
with :meth:`AllocatedState.add`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TypeVar

from dradriver.k8s.names import qualify
from dradriver.k8s.objects import allocation_of
from dradriver.k8s.quantity import QuantityError, parse_quantity

__all__ = [
    "AllocatedState",
    "DeviceID",
    "Held",
    "by_qualified_name",
    "claim_key",
    "qualify",
]

T = TypeVar("T")

DeviceID = tuple[str, str, str]
"""(driver, pool, device)."""

JOURNAL_LIMIT = 65_536
"""Changes :meth:`AllocatedState.changes_since` remembers before it starts over."""


def by_qualified_name(
    raw: Mapping[str, Any] | None, driver: str, parse: Callable[[str, Any], T]
) -> dict[str, T]:
    """``raw``'s entries under their driver-qualified names, each value read by ``parse``
    (given the name as spelled and the value).

    A name spelled both ways keeps the driver-qualified entry (as in Go); an entry whose
    value ``parse`` refuses with :class:`QuantityError` is left out."""
    parsed: dict[str, T] = {}
    for name, value in (raw or {}).items():
        qualified = qualify(name, driver)
        if "/" not in name and qualified in parsed:
            continue
        try:
            parsed[qualified] = parse(name, value)
        except QuantityError:
            continue
    return parsed


def claim_key(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


@dataclass(frozen=True)
class Held:
    """One device (or share of one) a claim holds, with the capacity it consumes."""

    device: DeviceID
    share_id: str | None
    consumed: dict[str, Decimal]


@dataclass
class AllocatedState:
    """Devices held by allocated claims; mutable so callers can keep it up to date."""

    dedicated: dict[DeviceID, list[str]] = field(default_factory=dict)
    """Devices taken exclusively, with the claims holding them."""
    shared: dict[DeviceID, dict[str, str]] = field(default_factory=dict)
    """Multi-allocatable devices: share ID → holding claim."""
    consumed: dict[DeviceID, dict[str, Decimal]] = field(default_factory=dict)
    """Capacity consumed on multi-allocatable devices (fully-qualified names)."""
    # Per claim, a tuple replaced (never changed) on every change: the identity of a
    # claim's entry says whether it changed since a snapshot (see update()).
    _by_claim: dict[str, tuple[Held, ...]] = field(default_factory=dict, repr=False)
    # The devices held or let go, in order: entry i is change ``_journal_base + i + 1``
    # (see changes_since()); cleared when it grows past JOURNAL_LIMIT.
    _journal: list[DeviceID] = field(default_factory=list, repr=False)
    _journal_base: int = field(default=0, repr=False)

    @property
    def revision(self) -> int:
        """How many times a device was held or let go so far (never decreases)."""
        return self._journal_base + len(self._journal)

    def changes_since(self, revision: int) -> list[DeviceID] | None:
        """The devices held or let go after ``revision`` (repeats possible), or None when
        that is no longer known (the journal was cleared): then look at everything."""
        if revision < self._journal_base or revision > self.revision:
            return None
        return self._journal[revision - self._journal_base :]

    def _changed(self, device: DeviceID) -> None:
        if len(self._journal) >= JOURNAL_LIMIT:
            self._journal_base += len(self._journal)
            self._journal = []
        self._journal.append(device)

    @classmethod
    def from_claims(cls, claims: Iterable[Mapping[str, Any]]) -> AllocatedState:
        state = cls()
        for claim in claims:
            allocation = allocation_of(claim)
            if allocation:
                state.add(claim_key(claim), allocation)
        return state

    def copy(self) -> AllocatedState:
        state = AllocatedState()
        for key, held in self._by_claim.items():
            for item in held:
                state._hold(key, item)
        return state

    def claims(self) -> list[str]:
        return list(self._by_claim)

    def add(self, key: str, allocation: Mapping[str, Any]) -> None:
        """Record the devices of ``allocation`` (an AllocationResult) as held by ``key``."""
        if key in self._by_claim:
            self.remove(key)
        self._by_claim[key] = ()
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("adminAccess"):
                continue
            driver = str(result.get("driver", ""))
            device: DeviceID = (driver, str(result.get("pool", "")), str(result.get("device", "")))
            share_id = result.get("shareID")
            consumed = by_qualified_name(
                result.get("consumedCapacity"), driver, lambda _, value: parse_quantity(str(value))
            )
            self._hold(key, Held(device, str(share_id) if share_id else None, consumed))

    def snapshot(self) -> dict[str, tuple[Held, ...]]:
        """What each claim holds, now; cheap (the entries are shared, never changed)."""
        return dict(self._by_claim)

    def update(self, changed: Mapping[str, Sequence[Held]], removed: Iterable[str]) -> None:
        """Make this state match another one, given what changed since the last update:
        the new entries of ``changed`` claims (from its :meth:`snapshot`), and the claims
        ``removed`` from it."""
        for key in removed:
            self.remove(key)
        for key, held in changed.items():
            self.remove(key)
            self._by_claim[key] = ()
            for item in held:
                self._hold(key, item)

    def held_by(self, key: str) -> tuple[Held, ...] | None:
        """What claim ``key`` holds (None: it is not in the state)."""
        return self._by_claim.get(key)

    def _hold(self, key: str, held: Held) -> None:
        self._by_claim[key] = (*self._by_claim.get(key, ()), held)
        self._changed(held.device)
        if held.share_id is None:
            self.dedicated.setdefault(held.device, []).append(key)
            return
        self.shared.setdefault(held.device, {})[held.share_id] = key
        total = self.consumed.setdefault(held.device, {})
        for name, value in held.consumed.items():
            total[name] = total.get(name, Decimal(0)) + value

    def remove(self, key: str) -> None:
        """Forget what claim ``key`` holds (it was deallocated)."""
        for held in self._by_claim.pop(key, ()):
            self._changed(held.device)
            if held.share_id is None:
                holders = self.dedicated.get(held.device, [])
                if key in holders:
                    holders.remove(key)
                if not holders:
                    self.dedicated.pop(held.device, None)
                continue
            shares = self.shared.get(held.device, {})
            shares.pop(held.share_id, None)
            if not shares:
                self.shared.pop(held.device, None)
                self.consumed.pop(held.device, None)
                continue
            total = self.consumed.get(held.device, {})
            for name, value in held.consumed.items():
                total[name] = total.get(name, Decimal(0)) - value

    def is_allocated(self, device: DeviceID) -> bool:
        """Held exclusively or through any share (it then consumes its counters)."""
        return device in self.dedicated or device in self.shared

    def holders(self, device: DeviceID) -> list[str]:
        return list(self.dedicated.get(device, [])) + sorted(
            set(self.shared.get(device, {}).values())
        )
