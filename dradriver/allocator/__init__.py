"""Structured allocation of ResourceClaims over ResourceSlices, and why it fails.

Pure logic over resource.k8s.io/v1 JSON dicts, matching the kube-scheduler's structured
allocator (see :mod:`dradriver.allocator.core` for the semantics and the deliberate
differences)::

    inventory = SliceInventory(slices, classes)     # index once, reuse
    allocator = Allocator(inventory)
    state = AllocatedState.from_claims(all_claims)  # what other claims hold
    outcome = allocator.allocate([claim], state, nodes=nodes)
    if outcome.ok:
        allocation = outcome.allocations[0]         # AllocationResult (add a timestamp)
        state.add(claim_key(claim), allocation)
    else:
        rows = explain(allocator, claim, state, nodes=nodes)
        print(format_table(rows)); message = summarize(rows)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dradriver.allocator.core import Allocator
from dradriver.allocator.explain import ExplainRow, explain
from dradriver.allocator.inventory import AllocatorPool, CandidateDevice, SliceInventory
from dradriver.allocator.nodes import NodeInfo, node_info, selector_matches
from dradriver.allocator.outcome import Outcome
from dradriver.allocator.report import format_table, summarize
from dradriver.allocator.request import AllocationError, tolerates
from dradriver.allocator.search import MAX_RESULTS_PER_CLAIM
from dradriver.allocator.state import AllocatedState, DeviceID, Held, claim_key

__all__ = [
    "MAX_RESULTS_PER_CLAIM",
    "AllocatedState",
    "AllocationError",
    "Allocator",
    "AllocatorPool",
    "CandidateDevice",
    "DeviceID",
    "ExplainRow",
    "Held",
    "NodeInfo",
    "Outcome",
    "SliceInventory",
    "allocate",
    "claim_key",
    "explain",
    "format_table",
    "node_info",
    "selector_matches",
    "summarize",
    "tolerates",
]


def allocate(
    slices: Iterable[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    allocated_claims: Iterable[Mapping[str, Any]] = (),
    node: Mapping[str, Any] | NodeInfo | str | None = None,
    nodes: Sequence[Mapping[str, Any] | NodeInfo | str] | None = None,
    *,
    abort_on_cel_error: bool = False,
) -> Outcome:
    """One-shot :meth:`Allocator.allocate` (builds the inventory and state each call)."""
    allocator = Allocator(SliceInventory(slices, classes), abort_on_cel_error=abort_on_cel_error)
    return allocator.allocate(claims, AllocatedState.from_claims(allocated_claims), node, nodes)
