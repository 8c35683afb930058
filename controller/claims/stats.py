"""What the claim reconciler and its parts have done, counted for tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AllocationStats:
    allocated: int = 0
    failed: int = 0
    yielded: int = 0  # held claims that gave their allocation back
    deallocated: int = 0
    fences_allocated: int = 0  # fence allocation writes (creations and pulses)
    fences_deleted: int = 0
    held: int = 0  # claims held after a conflict (not cleared while the device is shared)
