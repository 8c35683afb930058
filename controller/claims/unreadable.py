"""What a claim too deep to decode holds: "unreadable means held".

The claims informer shows a claim nested deeper than the decoder's limit as its cut
version (:class:`~dradriver.k8s.jsondecode.TooDeepObject`, deep parts replaced by
:data:`~dradriver.k8s.jsondecode.CUT`). Invariants of :func:`read_cut_claim`:

* every allocation result it can read whole (driver, pool and device are strings) counts
  as held; one whose other fields (share, consumed capacity) were cut counts as held
  exclusively;
* where the allocation could hold devices it cannot name, it names pools to block
  whole: the result's pool if driver and pool are readable, else every pool of the
  result's driver, else (nothing readable: the status, the allocation or its results
  were cut, or the claim is known by its name only) every pool of the controller's own
  driver;
* a readable status without an allocation holds nothing (a previous readable version's
  allocation is the claims cache's, kept there as the last good version).

Pure: :class:`~controller.claims.holdings.Holdings` keeps what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from dradriver.allocator import DeviceID, Held
from dradriver.k8s.jsondecode import CUT, TooDeepObject, was_cut
from dradriver.k8s.objects import Obj


@dataclass(frozen=True)
class UnreadableClaim:
    """What a cut claim holds: ``allocation`` (its results readable whole, or None) and
    the pools it blocks whole, as ``(driver, pool)`` and as drivers all of whose pools
    are blocked; ``why`` says where the cut hit, for a log line."""

    allocation: Obj | None
    pools: frozenset[tuple[str, str]] = frozenset()
    drivers: frozenset[str] = frozenset()
    why: str = ""

    @property
    def blocks(self) -> bool:
        return bool(self.pools or self.drivers)

    def blocks_device(self, device: DeviceID) -> bool:
        driver, pool, _ = device
        return driver in self.drivers or (driver, pool) in self.pools

    def describe_blocked(self) -> list[str]:
        """``driver/pool`` and ``driver/*`` for the log line and the failure message."""
        return sorted(f"{d}/{p}" for d, p in self.pools) + sorted(f"{d}/*" for d in self.drivers)


def read_cut_claim(cut: Obj, driver: str) -> UnreadableClaim:
    """What the cut claim ``cut`` holds; ``driver`` is the controller's own driver (the
    pools it blocks when nothing of the allocation can be read)."""
    if isinstance(cut, TooDeepObject) and cut.identity_only:
        return UnreadableClaim(None, drivers=frozenset({driver}), why="only its name readable")
    status = cut.get("status")
    if status is None:
        return UnreadableClaim(None, why="no status: not allocated")
    if not isinstance(status, dict):
        return UnreadableClaim(None, drivers=frozenset({driver}), why="status cut")
    allocation = status.get("allocation")
    if allocation is None:
        return UnreadableClaim(None, why="status readable, not allocated")
    devices = allocation.get("devices") if isinstance(allocation, dict) else CUT
    results = devices.get("results") if isinstance(devices, dict) else CUT
    if not isinstance(results, list):
        where = "status.allocation" + (".devices" if isinstance(allocation, dict) else "")
        return UnreadableClaim(None, drivers=frozenset({driver}), why=f"{where} cut")
    held: list[Obj] = []
    pools: set[tuple[str, str]] = set()
    drivers: set[str] = set()
    for result in results:
        entry = result if isinstance(result, dict) else {}
        name, pool, owner = entry.get("device"), entry.get("pool"), entry.get("driver")
        if isinstance(name, str) and isinstance(pool, str) and isinstance(owner, str):
            whole = {k: v for k, v in entry.items() if not was_cut(v)}
            if len(whole) != len(entry):  # a share or capacity cut: held exclusively
                whole.pop("shareID", None)
                whole.pop("consumedCapacity", None)
            held.append(whole)
        elif isinstance(owner, str) and isinstance(pool, str):
            pools.add((owner, pool))
        else:
            drivers.add(owner if isinstance(owner, str) else driver)
    why = "allocation readable" if not (pools or drivers) else "some allocation results cut"
    return UnreadableClaim(
        {"devices": {"results": held}} if held else None,
        frozenset(pools),
        frozenset(drivers),
        why,
    )


def pool_devices(slices: list[Obj], claim: UnreadableClaim) -> tuple[Held, ...]:
    """Every device of the slices in the pools ``claim`` blocks, as exclusive holds."""
    out: list[Held] = []
    for s in slices:
        spec = s.get("spec") or {}
        owner, pool = str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", ""))
        if owner in claim.drivers or (owner, pool) in claim.pools:
            for device in spec.get("devices") or []:
                out.append(Held((owner, pool, str(device.get("name", ""))), None, {}))
    return tuple(out)
