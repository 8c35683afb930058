"""The structured allocator: the scheduler's search, over plain resource.k8s.io/v1 dicts.

A port of ``k8s.io/dynamic-resource-allocation/structured`` (the "incubating" variant the
1.36 scheduler runs with its default feature gates): claims are allocated together, all or
nothing; for each claim every request, for each request one device after the other, each
device first-fit in inventory order, backtracking when a later choice fails. Inside one
request only combinations are tried, not permutations.

Per candidate device, in order: taken by another claim (or by this attempt), selectors
(the class's, then the request's; the first false stops), taints (NoSchedule/NoExecute
must be tolerated), counters of partitionable devices, the claim's constraints, consumable
capacity. ``firstAvailable`` tries its subrequests in order; ``All`` needs every matching
device of the visible pools and fails if one of them is unavailable or if a visible pool is
incomplete or invalid. Admin access ignores other claims' allocations.

Differences from the scheduler, on purpose:

* A CEL runtime error on a device makes that device not match (with the error kept for
  explanations). The scheduler instead aborts the attempt ("CEL runtime error"); pass
  ``abort_on_cel_error=True`` for that behaviour.
* Claim configs that name several requests are copied once (the scheduler copies such a
  config once per named request).
* The search stops after ``max_steps`` recursion steps per node, and, when
  :meth:`Allocator.allocate` gets a ``deadline`` (a :func:`time.monotonic` time), once
  that has passed, over all the nodes it tries (the scheduler has its 10 s Filter timeout
  per node instead). An attempt stopped either way names the budget in
  :attr:`Outcome.exhausted`.

Where the parts live: the requests (:mod:`~dradriver.allocator.request`), the claim's
constraints (:mod:`~dradriver.allocator.constraints`), the search of one attempt
(:mod:`~dradriver.allocator.search`), the AllocationResult it builds
(:mod:`~dradriver.allocator.results`) and the :class:`Outcome`
(:mod:`~dradriver.allocator.outcome`). This module tries the nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dradriver.allocator.freenodes import FreeNodes
from dradriver.allocator.inventory import SliceInventory
from dradriver.allocator.nodes import NodeInfo, node_info, selector_matches
from dradriver.allocator.outcome import OUT_OF_TIME, Outcome
from dradriver.allocator.request import Req
from dradriver.allocator.search import Search
from dradriver.allocator.state import AllocatedState

__all__ = ["DEFAULT_MAX_STEPS", "Allocator"]

DEFAULT_MAX_STEPS = 1_000_000


class Allocator:
    """Allocates claims from an :class:`SliceInventory`; reusable across calls and states.

    Selector results are cached for the inventory's lifetime (they do not depend on what
    is allocated), so keep one allocator per inventory and rebuild both when slices or
    classes change. Not thread-safe: use it from one thread (or behind a lock).
    """

    def __init__(
        self,
        inventory: SliceInventory,
        *,
        abort_on_cel_error: bool = False,
        max_steps: int = DEFAULT_MAX_STEPS,
    ) -> None:
        self.inventory = inventory
        self.abort_on_cel_error = abort_on_cel_error
        self.max_steps = max_steps
        self._match: dict[tuple[str, tuple[str, ...], tuple[str, ...]], bytearray] = {}
        self._free = FreeNodes(inventory)
        self._nodes: tuple[object, list[NodeInfo], dict[str, NodeInfo]] | None = None

    def _sorted_nodes(
        self, nodes: Sequence[Mapping[str, Any] | NodeInfo | str] | None
    ) -> tuple[list[NodeInfo], dict[str, NodeInfo]]:
        """``nodes`` in name order and by name; kept while the caller passes the same
        sequence object (do not change one after passing it)."""
        if nodes is None:
            return [], {}
        if self._nodes is None or self._nodes[0] is not nodes:
            infos = sorted((node_info(n) for n in nodes), key=lambda n: n.name)
            self._nodes = (nodes, infos, {n.name: n for n in infos})
        return self._nodes[1], self._nodes[2]

    def _worth_trying(
        self,
        claims: Sequence[Mapping[str, Any]],
        state: AllocatedState,
        infos: list[NodeInfo],
        by_name: dict[str, NodeInfo],
        found_nothing: bool,
    ) -> Iterable[NodeInfo]:
        """The nodes to try after the attempt without a node: all of them, or, when that
        attempt looked at a superset of what a node with no free own device offers and
        found nothing, only the nodes that have one (:class:`FreeNodes`).

        Superset: a node's attempt sees the devices usable without a node that reach it
        (selector pools: a subset), its own devices and those binding to it; with its own
        all taken and none binding to a node, nothing new. A search that ran out of steps
        or time, one that found an allocation reaching none of the nodes, admin access
        (taken devices count) and ``All`` (every device on the node is needed, a different
        question) are not comparable: then every node is tried."""
        if not found_nothing or self._free.binds_to_node or not _comparable(claims):
            return infos
        self._free.sync(state)
        # Lazily: the first few usually fit.
        return (by_name[name] for name in self._free.names() if name in by_name)

    def allocate(
        self,
        claims: Sequence[Mapping[str, Any]],
        state: AllocatedState | None = None,
        node: Mapping[str, Any] | NodeInfo | str | None = None,
        nodes: Sequence[Mapping[str, Any] | NodeInfo | str] | None = None,
        *,
        deadline: float | None = None,
    ) -> Outcome:
        """Allocate ``claims`` together.

        With ``node``: for that node, like the scheduler's Filter. Without: first with the
        devices usable without a node (``allNodes``/``nodeSelector`` pools, no
        ``bindsToNode``), whose merged node selector must match one of ``nodes`` when they
        are given; then, if ``nodes`` are given, each of them in name order until one fits.
        ``deadline``: the :func:`time.monotonic` time the whole call stops searching at, over
        all nodes (the wall-clock budget of one allocation).
        """
        state = state if state is not None else AllocatedState()
        if node is not None:
            return self._attempt(claims, state, node_info(node), deadline)
        infos, by_name = self._sorted_nodes(nodes)
        outcome = self._attempt(claims, state, None, deadline)
        # A complete search that found nothing (not one cut short, nor one whose finding
        # reaches none of the nodes).
        found_nothing = not outcome.ok and outcome.exhausted is None
        if outcome.ok and outcome.allocations is not None:
            selectors = [a.get("nodeSelector") for a in outcome.allocations]
            if not infos or all(
                s is None or any(selector_matches(s, n) for n in infos) for s in selectors
            ):
                return outcome
            # The devices usable without a node reach none of the given nodes.
            outcome = Outcome(steps=outcome.steps, nodes_tried=[None])
        if outcome.exhausted == OUT_OF_TIME or (
            outcome.error is not None and not outcome.node_dependent_error
        ):
            return outcome
        tried: list[str | None] = [None]
        steps = outcome.steps
        error = outcome.error
        exhausted = outcome.exhausted
        for info in self._worth_trying(claims, state, infos, by_name, found_nothing):
            attempt = self._attempt(claims, state, info, deadline)
            steps += attempt.steps
            tried.append(info.name)
            exhausted = attempt.exhausted or exhausted
            if attempt.ok or attempt.exhausted == OUT_OF_TIME:
                attempt.steps, attempt.nodes_tried = steps, tried
                return attempt  # out of time: the next nodes would be too
            if attempt.error is not None:
                if not attempt.node_dependent_error:
                    attempt.steps, attempt.nodes_tried = steps, tried
                    return attempt
                error = error or attempt.error
        return Outcome(error=error, steps=steps, nodes_tried=tried, exhausted=exhausted)

    def _attempt(
        self,
        claims: Sequence[Mapping[str, Any]],
        state: AllocatedState,
        node: NodeInfo | None,
        deadline: float | None = None,
    ) -> Outcome:
        search = Search(
            self.inventory,
            claims,
            state,
            node,
            match_cache=self.match_cache,
            abort_on_cel_error=self.abort_on_cel_error,
            max_steps=self.max_steps,
            deadline=deadline,
        )
        return search.run()

    def match_cache(self, req: Req) -> bytearray:
        """The selector verdicts of every device for ``req``'s class and selectors."""
        key = (
            req.class_name,
            tuple(s.expression for label, s in req.selectors if label.startswith("class ")),
            tuple(s.expression for label, s in req.selectors if not label.startswith("class ")),
        )
        found = self._match.get(key)
        if found is None:
            found = self._match[key] = bytearray(len(self.inventory.devices))
        return found


def _comparable(claims: Sequence[Mapping[str, Any]]) -> bool:
    """No request (or subrequest) asks for admin access or for all devices."""
    for claim in claims:
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            for spec in (request.get("exactly"), *(request.get("firstAvailable") or ())):
                if isinstance(spec, Mapping) and (
                    spec.get("adminAccess") or spec.get("allocationMode") == "All"
                ):
                    return False
    return True
