"""Why a claim can (not) be allocated, device by device.

:func:`explain` runs the allocator for one claim; when that fails it looks at every device
of the inventory for every request (and every ``firstAvailable`` subrequest) and says why
the device cannot serve it, in the order the allocator checks: stale slice, incomplete or
invalid pool, node reachability, the class's selectors, the request's selectors (which one
is false or fails, with its text), taken by which claim, untolerated taint, counters,
capacity. Devices that pass are ``available``. Request-level rows say how many devices a
request needs against how many are available; claim-level rows name the constraint that
cannot be met or the error that stopped the attempt.

The rows suit a table and a one-paragraph message for an event or a condition
(:mod:`dradriver.allocator.report`).
"""

from __future__ import annotations

import copy
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dradriver.allocator.capacity import consumed_capacity, fit
from dradriver.allocator.constraints import parse_constraints
from dradriver.allocator.core import Allocator
from dradriver.allocator.inventory import CandidateDevice, SliceInventory
from dradriver.allocator.nodes import NodeInfo, node_info
from dradriver.allocator.outcome import Outcome
from dradriver.allocator.request import AllocationError, Req, build_request, untolerated
from dradriver.allocator.state import AllocatedState, claim_key
from dradriver.cel.quantity import display_quantity

__all__ = ["ALLOCATED", "AVAILABLE", "ERROR", "EXCLUDED", "UNSATISFIED", "ExplainRow", "explain"]

ALLOCATED, AVAILABLE, EXCLUDED, UNSATISFIED, ERROR = (
    "allocated",
    "available",
    "excluded",
    "unsatisfied",
    "error",
)


@dataclass(frozen=True)
class ExplainRow:
    """One line of an explanation.

    ``verdict``: ``allocated`` (chosen), ``available`` (usable, not chosen), ``excluded``
    (this device cannot serve the request), ``unsatisfied`` (a request or the whole claim
    cannot be met), ``error`` (the attempt could not run). ``category`` groups reasons:
    stale, pool, node, selector, allocated, taint, counters, capacity, count, constraint,
    error, ok.
    """

    claim: str
    request: str
    driver: str
    pool: str
    device: str
    verdict: str
    reason: str
    category: str = ""


def explain(
    inventory: SliceInventory | Allocator,
    claim: Mapping[str, Any],
    state: AllocatedState | None = None,
    node: Mapping[str, Any] | NodeInfo | str | None = None,
    nodes: Sequence[Mapping[str, Any] | NodeInfo | str] | None = None,
    *,
    drivers: Collection[str] | None = None,
    outcome: Outcome | None = None,
    deadline: float | None = None,
) -> list[ExplainRow]:
    """Rows explaining the allocation of ``claim`` (see the module docstring).

    ``state`` holds the allocations of all claims (this claim's own, if any, is left out).
    ``node``/``nodes`` as for :meth:`Allocator.allocate`; for the claim of a pod the
    scheduler could not place, pass every node as ``nodes``. ``drivers`` limits device rows
    to those drivers. ``outcome`` is a previous :meth:`Allocator.allocate` result to reuse.
    ``deadline``: the :func:`time.monotonic` time the searches it runs stop at.
    """
    allocator = inventory if isinstance(inventory, Allocator) else Allocator(inventory)
    inv = allocator.inventory
    state = state if state is not None else AllocatedState()
    key = claim_key(claim)
    if key in state.claims():  # explain the claim against the others only
        state = state.copy()
        state.remove(key)
    if outcome is None:
        outcome = allocator.allocate([claim], state, node=node, nodes=nodes, deadline=deadline)
    if outcome.ok and outcome.allocations is not None:
        return _allocated_rows(key, outcome)
    context = _Context(inv, state, node, nodes, drivers)
    rows: list[ExplainRow] = []
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    satisfiable_alone = True
    for request in requests:
        request_rows, ok = _request_rows(key, claim, request, context)
        rows.extend(request_rows)
        satisfiable_alone = satisfiable_alone and ok
    try:
        constraints = parse_constraints(claim)
    except AllocationError as e:
        rows.append(_summary_row(key, "", ERROR, e.message, "error"))
        constraints = []
    if outcome.error is not None and not any(r.verdict == ERROR for r in rows):
        rows.append(_summary_row(key, "", ERROR, outcome.error, "error"))
    elif satisfiable_alone and requests:
        rows.extend(
            _claim_rows(key, claim, constraints, allocator, state, node, nodes, context, deadline)
        )
    return rows


def _full(name: str, sub: str | None) -> str:
    return f"{name}/{sub}" if sub is not None else name


def _alternatives(request: Mapping[str, Any]) -> list[tuple[str | None, Any]]:
    """(subrequest name or None, spec) of an ``exactly`` or ``firstAvailable`` request."""
    if request.get("exactly") is not None:
        return [(None, request["exactly"])]
    return [(str(s.get("name", "")), s) for s in request.get("firstAvailable") or []]


def _summary_row(key: str, request: str, verdict: str, reason: str, category: str) -> ExplainRow:
    """A row about a whole request (``request`` set) or the whole claim (``request`` empty)."""
    return ExplainRow(key, request, "", "", "", verdict, reason, category)


def _request_rows(
    key: str, claim: Mapping[str, Any], request: Mapping[str, Any], context: _Context
) -> tuple[list[ExplainRow], bool]:
    """The rows of one request (each subrequest's), and whether it can be met on its own."""
    name = str(request.get("name", ""))
    alternatives = _alternatives(request)
    rows: list[ExplainRow] = []
    any_ok = False
    for sub, spec in alternatives:
        try:
            req = build_request(context.inventory, 0, claim, name, sub, spec)
        except AllocationError as e:
            rows.append(_summary_row(key, _full(name, sub), ERROR, e.message, "error"))
            continue
        device_rows, available, unavailable = _device_rows(key, req, context)
        count_rows = _count_rows(key, req, available, unavailable, context)
        rows.extend(device_rows)
        rows.extend(count_rows)
        any_ok = any_ok or not count_rows
    if len(alternatives) > 1 and not any_ok:
        reason = f"none of the {len(alternatives)} firstAvailable subrequests can be satisfied"
        rows.append(_summary_row(key, name, UNSATISFIED, reason, "count"))
    return rows, any_ok


def _allocated_rows(key: str, outcome: Outcome) -> list[ExplainRow]:
    assert outcome.allocations is not None
    allocation = outcome.allocations[0]
    where = f"on node {outcome.node}" if outcome.node else "without binding to one node"
    rows = []
    for result in allocation["devices"]["results"]:
        reason = f"allocatable {where}"
        if result.get("adminAccess"):
            reason += " (admin access)"
        if result.get("shareID"):
            reason += f" (shared, consumes {result.get('consumedCapacity')})"
        rows.append(
            ExplainRow(
                key,
                result["request"],
                result["driver"],
                result["pool"],
                result["device"],
                ALLOCATED,
                reason,
                "ok",
            )
        )
    return rows


class _Context:
    def __init__(
        self,
        inventory: SliceInventory,
        state: AllocatedState,
        node: Mapping[str, Any] | NodeInfo | str | None,
        nodes: Sequence[Mapping[str, Any] | NodeInfo | str] | None,
        drivers: Collection[str] | None,
    ) -> None:
        self.inventory = inventory
        self.state = state
        self.node = node_info(node) if node is not None else None
        self.nodes = [node_info(n) for n in nodes] if nodes is not None else None
        self._node_names = {n.name for n in self.nodes or ()}
        # Keyed by the identity of a slice's selector (held by its devices meanwhile).
        self._selector_reaches: dict[int, bool] = {}
        self.drivers = set(drivers) if drivers is not None else None
        self._counters: dict[int, dict[str, dict[str, Decimal]]] = {}

    def devices(self) -> Iterable[CandidateDevice]:
        for device in [*self.inventory.devices, *self.inventory.stale]:
            if self.drivers is None or device.driver in self.drivers:
                yield device

    def unreachable(self, device: CandidateDevice) -> str | None:
        if self.node is not None:
            if device.reachable(self.node):
                return None
            return f"not reachable from node {self.node.name}: {device.placement_text()}"
        kind = device.placement.get("kind")
        if kind not in ("node", "all", "selector"):
            return device.placement_text()
        if self.nodes is None:
            if device.reachable(None):
                return None
            what = "binds to a node" if device.binds_to_node else device.placement_text()
            return f"{what}: it needs a node, and no candidate nodes were given"
        if self._reaches_a_candidate(device):
            return None
        if kind == "selector":
            return "no node matches the node selector of its slice"
        return f"{device.placement_text()}, which is not one of the candidate nodes"

    def _reaches_a_candidate(self, device: CandidateDevice) -> bool:
        """Whether some candidate node can use ``device``: by name for a node's own
        device, once per slice selector (not each device against every node)."""
        assert self.nodes is not None
        kind = device.placement.get("kind")
        if kind == "node":
            return device.placement.get("node") in self._node_names
        if kind == "all":
            return bool(self.nodes)
        selector = device.placement.get("selector")
        known = self._selector_reaches.get(id(selector))
        if known is None:
            known = any(device.reachable(n) for n in self.nodes)
            self._selector_reaches[id(selector)] = known
        return known

    def nodes_for(self, device: CandidateDevice) -> list[str]:
        """Names of the candidate nodes the device can be used from ("*" = any)."""
        kind = device.placement.get("kind")
        if kind == "node":
            return [str(device.placement.get("node"))]
        if self.nodes is None:
            return ["*"] if kind in ("all", "selector") else []
        if kind == "all" and not device.binds_to_node:
            return ["*"]
        if kind == "selector" and not device.binds_to_node and self.nodes:
            return ["*"] if self._reaches_a_candidate(device) else []
        return [n.name for n in self.nodes if device.reachable(n)]

    def counters_left(self, device: CandidateDevice) -> dict[str, dict[str, Decimal]]:
        key = id(device.pool)
        left = self._counters.get(key)
        if left is None:
            left = {name: dict(values) for name, values in device.pool.counters.items()}
            for other in device.pool.devices:
                if other.consumes and self.state.is_allocated(other.id):
                    for set_name, counters in other.consumes:
                        for counter, value in counters.items():
                            if counter in left.get(set_name, {}):
                                left[set_name][counter] -= value
            self._counters[key] = left
        return left


def device_problem(req: Req, device: CandidateDevice, context: _Context) -> tuple[str, str] | None:
    """(category, reason) why ``device`` cannot serve ``req`` on its own, or None."""
    if device.stale is not None:
        return "stale", device.stale
    problem = device.pool.problem()
    if problem is not None:
        return "pool", problem
    unreachable = context.unreachable(device)
    if unreachable is not None:
        return "node", unreachable
    for label, selector in req.selectors:
        result = context.inventory.evaluate(selector, device)
        if result.error is not None:
            return "selector", f"{label} failed: {result.error} (expression: {selector.expression})"
        if not result.matched:
            return "selector", f"{label} is false: {selector.expression}"
    state = context.state
    if not req.admin and device.id in state.dedicated:
        holders = state.dedicated[device.id]
        return "allocated", "allocated to claim " + ", ".join(holders)
    taint = untolerated(device, req.tolerations) if device.taints else None
    if taint is not None:
        text = f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
        return "taint", f"untolerated taint {text}"
    capacity_in_use = device.id in state.shared
    if device.consumes and not (device.allow_multiple and capacity_in_use):
        left = context.counters_left(device)
        for set_name, counters in device.consumes:
            for counter, value in counters.items():
                have = left.get(set_name, {}).get(counter, Decimal(0))
                if value > have:
                    return "counters", (
                        f"not enough counter {counter} in counter set {set_name}: needs "
                        f"{display_quantity(value)}, {display_quantity(max(have, Decimal(0)))} left"
                    )
    if req.capacity is not None or device.allow_multiple:
        try:
            consumed, problem = consumed_capacity(req, device)
        except AllocationError as e:
            return "capacity", e.message
        if consumed is None:
            return "capacity", problem or "capacity does not fit"
        short = fit(consumed, device, state.consumed.get(device.id), None)
        if short is not None:
            holders = state.holders(device.id)
            if holders:
                short += " (in use by " + ", ".join(holders) + ")"
            return "capacity", short
    return None


def _device_rows(
    key: str, req: Req, context: _Context
) -> tuple[list[ExplainRow], list[CandidateDevice], int]:
    """A row per device for ``req``; the available devices; how many match but are taken."""
    rows: list[ExplainRow] = []
    available: list[CandidateDevice] = []
    matching_unavailable = 0
    for device in context.devices():
        found = device_problem(req, device, context)
        if found is None:
            available.append(device)
            verdict, reason, category = AVAILABLE, "usable for this request", "ok"
        else:
            category, reason = found
            verdict = EXCLUDED
            if category in ("allocated", "taint", "counters", "capacity"):
                matching_unavailable += 1
        rows.append(
            ExplainRow(
                key,
                req.full_name,
                device.driver,
                device.pool.name,
                device.name,
                verdict,
                reason,
                category,
            )
        )
    return rows, available, matching_unavailable


def _count_rows(
    key: str,
    req: Req,
    available: Sequence[CandidateDevice],
    matching_unavailable: int,
    context: _Context,
) -> list[ExplainRow]:
    """Why ``req`` cannot get its number of devices (empty: it can, on its own)."""
    if req.all_mode:
        if matching_unavailable:
            reason = (
                f"asks for all matching devices; {matching_unavailable} of them are unavailable"
            )
        elif not available:
            reason = "asks for all matching devices, but no device matches"
        else:
            return []
        return [_summary_row(key, req.full_name, UNSATISFIED, reason, "count")]
    need = req.num
    if len(available) < need:
        reason = f"needs {need} device(s), {len(available)} available"
        return [_summary_row(key, req.full_name, UNSATISFIED, reason, "count")]
    if context.node is not None:
        return []
    per_node: Counter[str] = Counter()
    anywhere = 0
    for device in available:
        names = context.nodes_for(device)
        if "*" in names:
            anywhere += 1
        for name in names:
            if name != "*":
                per_node[name] += 1
    if max(per_node.values(), default=0) + anywhere >= need:
        return []
    spread = ", ".join(f"{n}: {c}" for n, c in sorted(per_node.items()))
    reason = f"needs {need} device(s) usable from one node; available per node: {spread or 'none'}"
    return [_summary_row(key, req.full_name, UNSATISFIED, reason, "count")]


def _claim_rows(
    key: str,
    claim: Mapping[str, Any],
    constraints: list[Any],
    allocator: Allocator,
    state: AllocatedState,
    node: Mapping[str, Any] | NodeInfo | str | None,
    nodes: Sequence[Mapping[str, Any] | NodeInfo | str] | None,
    context: _Context,
    deadline: float | None = None,
) -> list[ExplainRow]:
    def attempt(keep: int) -> Outcome:
        trimmed = copy.deepcopy(dict(claim))
        raw = trimmed.setdefault("spec", {}).setdefault("devices", {})
        raw["constraints"] = list((raw.get("constraints") or [])[:keep])
        return allocator.allocate([trimmed], state, node=node, nodes=nodes, deadline=deadline)

    def stopped(outcome: Outcome) -> list[ExplainRow]:
        # Out of budget: no verdict about the constraints can be given.
        return [_summary_row(key, "", ERROR, str(outcome.error), "error")]

    first = attempt(0) if constraints else None
    if first is not None and first.exhausted is not None:
        return stopped(first)
    if first is not None and first.ok:
        for keep in range(1, len(constraints) + 1):
            trial = attempt(keep)
            if trial.exhausted is not None:
                return stopped(trial)
            if not trial.ok:
                constraint = constraints[keep - 1]
                reason = (
                    f"{constraint.describe()} cannot be satisfied together with the "
                    f"earlier constraints; {_values(claim, constraint, context)}"
                )
                return [_summary_row(key, "", UNSATISFIED, reason, "constraint")]
    reason = (
        "each request can be satisfied on its own, but not all of them together "
        "(they compete for the same devices, counters or capacity, or need more than one "
        "node)"
    )
    return [_summary_row(key, "", UNSATISFIED, reason, "count")]


def _values(claim: Mapping[str, Any], constraint: Any, context: _Context) -> str:
    """The attribute values available to each request the constraint covers."""
    parts = []
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    for request in requests:
        name = str(request.get("name", ""))
        for sub, spec in _alternatives(request):
            try:
                req = build_request(context.inventory, 0, claim, name, sub, spec)
            except AllocationError:
                continue
            if not constraint.applies(req):
                continue
            values: dict[str, list[str]] = defaultdict(list)
            for device in context.devices():
                if device_problem(req, device, context) is None:
                    value = device.attribute(constraint.attribute)
                    shown = "(unset)" if value is None else str(value[1])
                    values[shown].append(device.name)
            listing = "; ".join(
                f"{v}: {', '.join(names[:4])}{' …' if len(names) > 4 else ''}"
                for v, names in sorted(values.items())
            )
            parts.append(f"{req.full_name} → {listing or 'no available device'}")
    return "values of available devices: " + (" | ".join(parts) or "none")
