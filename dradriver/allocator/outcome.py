"""The result of one allocation call: the allocations, or why there are none.

Invariants:
- Exactly one of: ``allocations`` (one AllocationResult per claim, in the claims' order),
  ``error`` (the attempt could not run or was stopped), or neither (``unsatisfiable``:
  the claims do not fit; :func:`dradriver.allocator.explain` says why).
- ``exhausted`` names the budget (:data:`OUT_OF_STEPS`, :data:`OUT_OF_TIME`) that stopped
  the search on at least one node: the claims may still fit, given more search.
- ``steps`` and ``nodes_tried`` add up over every node the call tried (``None`` is the
  attempt without a node).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dradriver.k8s.objects import Obj

__all__ = ["OUT_OF_STEPS", "OUT_OF_TIME", "Outcome"]

OUT_OF_STEPS, OUT_OF_TIME = "steps", "time"
"""Values of :attr:`Outcome.exhausted`: which budget stopped the search."""


@dataclass
class Outcome:
    """The result of :meth:`Allocator.allocate`.

    ``allocations`` has one AllocationResult dict per claim (same order) when it worked;
    ``allocationTimestamp`` is left to the caller. Otherwise ``error`` says why the
    attempt could not run, or ``unsatisfiable`` is true (see :func:`explain` for why).
    """

    allocations: list[Obj] | None = None
    node: str | None = None
    error: str | None = None
    steps: int = 0
    nodes_tried: list[str | None] = field(default_factory=list)
    node_dependent_error: bool = False
    exhausted: str | None = None
    """``"steps"`` or ``"time"`` when that budget stopped the search without a result (on
    at least one node: the claim may still fit, given more search)."""

    @property
    def ok(self) -> bool:
        return self.allocations is not None

    @property
    def unsatisfiable(self) -> bool:
        return self.allocations is None and self.error is None
