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
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from dradriver.allocator.capacity import consumed_capacity, fit
from dradriver.allocator.inventory import (
    AllocatorPool,
    CandidateDevice,
    QuantityValue,
    SliceInventory,
)
from dradriver.allocator.nodes import (
    NodeInfo,
    merge_selectors,
    node_info,
    node_name_selector,
    selector_matches,
)
from dradriver.allocator.state import AllocatedState, DeviceID, claim_key
from dradriver.cel import CompileError, Selector, compile_selector
from dradriver.k8s.objects import Obj
from dradriver.k8s.quantity import QuantityError

__all__ = [
    "MAX_RESULTS_PER_CLAIM",
    "AllocationError",
    "Allocator",
    "Constraint",
    "Outcome",
    "Req",
    "build_config",
    "build_request",
    "parse_constraints",
    "tolerates",
    "untolerated",
]

MAX_RESULTS_PER_CLAIM = 32
DEFAULT_MAX_STEPS = 1_000_000


class AllocationError(Exception):
    """The attempt cannot proceed (bad class, selector, constraint, pool state)."""

    def __init__(self, message: str, node_dependent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.node_dependent = node_dependent


class _MaxSize(Exception):
    """More than 32 results would be needed on this path."""


class _OutOfSteps(Exception):
    pass


class _OutOfTime(Exception):
    pass


OUT_OF_STEPS, OUT_OF_TIME = "steps", "time"
"""Values of :attr:`Outcome.exhausted`: which budget stopped the search."""
_CLOCK_EVERY = 256  # steps between two looks at the clock (a look costs as much as a step)


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


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """``resourceclaim.ToleratesTaint``."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return bool((toleration.get("value") or "") == (taint.get("value") or ""))
    return operator == "Exists"


def untolerated(
    device: CandidateDevice, tolerations: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint of the device no toleration covers."""
    for taint in device.taints:
        if not any(tolerates(t, taint) for t in tolerations):
            found: Mapping[str, Any] = taint
            return found
    return None


class Req:
    """One request, or one subrequest of a ``firstAvailable`` list, ready for the search."""

    __slots__ = (
        "admin",
        "all_devices",
        "all_mode",
        "base",
        "capacity",
        "claim_index",
        "class_name",
        "full_name",
        "klass",
        "match",
        "num",
        "parent",
        "selectors",
        "sub",
        "tolerations",
    )

    def __init__(self, claim_index: int, base: str, sub: str | None) -> None:
        self.claim_index = claim_index
        self.base = base
        self.sub = sub
        self.parent = base if sub is not None else None
        self.full_name = f"{base}/{sub}" if sub is not None else base
        self.class_name = ""
        self.klass: Mapping[str, Any] = {}
        self.selectors: list[tuple[str, Selector]] = []
        self.match = bytearray()
        self.all_mode = False
        self.num = 0
        self.all_devices: list[CandidateDevice] = []
        self.admin = False
        self.tolerations: list[Obj] = []
        self.capacity: dict[str, QuantityValue] | None = None


class _Result:
    __slots__ = ("consumed", "device", "req", "share_id")

    def __init__(
        self,
        req: Req,
        device: CandidateDevice,
        share_id: str | None,
        consumed: dict[str, QuantityValue] | None,
    ) -> None:
        self.req = req
        self.device = device
        self.share_id = share_id
        self.consumed = consumed


class Constraint:
    """matchAttribute or distinctAttribute over the devices chosen for some requests."""

    def __init__(self, index: int, kind: str, attribute: str, requests: Sequence[str]) -> None:
        self.index = index
        self.kind = kind
        self.attribute = attribute
        self.requests = frozenset(requests)
        self.values: list[tuple[str, Any]] = []

    def describe(self) -> str:
        scope = f" of requests {', '.join(sorted(self.requests))}" if self.requests else ""
        return f"constraint #{self.index} ({self.kind} {self.attribute}{scope})"

    def applies(self, req: Req) -> bool:
        if not self.requests:
            return True
        return req.base in self.requests or (req.sub is not None and req.full_name in self.requests)

    def admits(self, value: tuple[str, Any] | None) -> bool:
        if value is None:
            return False
        if self.kind == "matchAttribute":
            return not self.values or self.values[0] == value
        return all(not _same_value(have, value) for have in self.values)

    def add(self, req: Req, device: CandidateDevice) -> bool:
        if not self.applies(req):
            return True
        value = device.attribute(self.attribute)
        if not self.admits(value):
            return False
        assert value is not None
        self.values.append(value)
        return True

    def remove(self, req: Req) -> None:
        if self.applies(req):
            self.values.pop()


def _same_value(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "version":
        from dradriver.cel import SemverError, compare_semver, parse_semver

        try:
            return compare_semver(parse_semver(str(a[1])), parse_semver(str(b[1]))) == 0
        except SemverError:
            return bool(a[1] == b[1])
    return bool(a[1] == b[1])


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
        infos = sorted((node_info(n) for n in nodes or ()), key=lambda n: n.name)
        outcome = self._attempt(claims, state, None, deadline)
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
        for info in infos:
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
        run = _Run(self, claims, state, node, deadline)
        try:
            run.prepare()
            done = run.one(0, 0, 0, 0, False, 0)
        except AllocationError as e:
            return Outcome(
                error=e.message,
                steps=run.steps,
                nodes_tried=[run.node_name],
                node_dependent_error=e.node_dependent,
            )
        except _OutOfSteps:
            return Outcome(
                error=f"search stopped after {self.max_steps} steps without a result",
                steps=run.steps,
                nodes_tried=[run.node_name],
                node_dependent_error=True,
                exhausted=OUT_OF_STEPS,
            )
        except _OutOfTime:
            return Outcome(
                error="search ran out of time without a result",
                steps=run.steps,
                nodes_tried=[run.node_name],
                node_dependent_error=True,
                exhausted=OUT_OF_TIME,
            )
        except _MaxSize:
            done = False
        if not done:
            invalid = [p for p in run.pools_seen() if p.invalid is not None]
            error = None
            if invalid:
                error = "invalid resource pools were encountered: " + "; ".join(
                    p.problem() or p.id for p in invalid
                )
            return Outcome(
                error=error, steps=run.steps, nodes_tried=[run.node_name], node_dependent_error=True
            )
        return Outcome(
            allocations=[run.build(i) for i in range(len(claims))],
            node=run.node_name,
            steps=run.steps,
            nodes_tried=[run.node_name],
        )

    def match_cache(self, req: Req) -> bytearray:
        key = (
            req.class_name,
            tuple(s.expression for label, s in req.selectors if label.startswith("class ")),
            tuple(s.expression for label, s in req.selectors if not label.startswith("class ")),
        )
        found = self._match.get(key)
        if found is None:
            found = self._match[key] = bytearray(len(self.inventory.devices))
        return found


class _Run:
    """One allocation attempt (one node or none)."""

    def __init__(
        self,
        allocator: Allocator,
        claims: Sequence[Mapping[str, Any]],
        state: AllocatedState,
        node: NodeInfo | None,
        deadline: float | None = None,
    ) -> None:
        self.allocator = allocator
        self.inventory = allocator.inventory
        self.claims = claims
        self.state = state
        self.node = node
        self.node_name = node.name if node is not None else None
        self.candidates = self.inventory.visible(node)
        self.requests: list[list[list[Req]]] = []
        self.selected: dict[tuple[int, int], int] = {}
        self.constraints: list[list[Constraint]] = []
        self.allocating: dict[DeviceID, set[int]] = {}
        self.allocating_capacity: dict[DeviceID, dict[str, Decimal]] = {}
        self.available_counters: dict[int, dict[str, dict[str, Decimal]]] = {}
        self.consumed_counters: dict[int, dict[str, dict[str, Decimal]]] = {}
        self.results: list[list[_Result]] = [[] for _ in claims]
        self.steps = 0
        self.max_steps = allocator.max_steps
        self.deadline = deadline

    # --- preparation --------------------------------------------------------------------

    def pools_seen(self) -> list[AllocatorPool]:
        return self.inventory.visible_pools(self.node)

    def prepare(self) -> None:
        for ci, claim in enumerate(self.claims):
            devices = (claim.get("spec") or {}).get("devices") or {}
            per_claim: list[list[Req]] = []
            minimum = 0
            for request in devices.get("requests") or []:
                alternatives = self.prepare_request(ci, claim, request)
                per_claim.append(alternatives)
                minimum += min(r.num for r in alternatives)
            if minimum > MAX_RESULTS_PER_CLAIM:
                raise AllocationError(
                    f"claim {claim_key(claim)}: number of requested devices {minimum} exceeds "
                    f"the claim limit of {MAX_RESULTS_PER_CLAIM}",
                    node_dependent=True,
                )
            self.requests.append(per_claim)
            self.constraints.append(parse_constraints(claim))

    def prepare_request(
        self, ci: int, claim: Mapping[str, Any], request: Mapping[str, Any]
    ) -> list[Req]:
        name = str(request.get("name", ""))
        if request.get("exactly") is not None:
            return [self.prepare_one(ci, claim, name, None, request["exactly"])]
        subs = request.get("firstAvailable") or []
        if not subs:
            raise AllocationError(
                f"claim {claim_key(claim)}, request {name}: neither exactly nor firstAvailable "
                "is set (unsupported request type?)"
            )
        return [self.prepare_one(ci, claim, name, str(s.get("name", "")), s) for s in subs]

    def prepare_one(
        self,
        ci: int,
        claim: Mapping[str, Any],
        base: str,
        sub: str | None,
        spec: Mapping[str, Any],
    ) -> Req:
        req = build_request(self.inventory, ci, claim, base, sub, spec)
        req.match = self.allocator.match_cache(req)
        if req.all_mode:
            for pool in self.pools_seen():
                if not pool.complete:
                    raise AllocationError(
                        f"claim {claim_key(claim)}, request {req.full_name}: asks for all "
                        f"devices, but resource pool {pool.id} is currently being updated",
                        node_dependent=True,
                    )
                if pool.invalid is not None:
                    raise AllocationError(
                        f"claim {claim_key(claim)}, request {req.full_name}: asks for all "
                        f"devices, but resource pool {pool.id} is currently invalid",
                        node_dependent=True,
                    )
            for device in self.candidates:
                if not self.selectable(req, device):
                    continue
                if req.capacity is not None or device.allow_multiple:
                    consumed, _ = consumed_capacity(req.capacity, device)
                    if consumed is None or self.capacity_problem(device, consumed):
                        continue
                req.all_devices.append(device)
            req.num = len(req.all_devices)
        return req

    # --- checks -------------------------------------------------------------------------

    def selectable(self, req: Req, device: CandidateDevice) -> bool:
        verdict = req.match[device.index]
        if verdict == 0:
            verdict = 1
            for _, selector in req.selectors:
                result = self.inventory.evaluate(selector, device)
                if result.error is not None:
                    verdict = 3
                    break
                if not result.matched:
                    verdict = 2
                    break
            req.match[device.index] = verdict
        if verdict == 3 and self.allocator.abort_on_cel_error:
            raise AllocationError(self.cel_error(req, device), node_dependent=True)
        return verdict == 1

    def cel_error(self, req: Req, device: CandidateDevice) -> str:
        claim = self.claims[req.claim_index]
        for label, selector in req.selectors:
            result = self.inventory.evaluate(selector, device)
            if result.error is not None:
                who = label if label.startswith("class ") else f"claim {claim_key(claim)}: {label}"
                return f"{who} on device {'/'.join(device.id)}: CEL runtime error: {result.error}"
        return f"device {'/'.join(device.id)}: CEL runtime error"

    def capacity_problem(
        self, device: CandidateDevice, consumed: Mapping[str, QuantityValue]
    ) -> str | None:
        return fit(
            consumed,
            device,
            self.state.consumed.get(device.id),
            self.allocating_capacity.get(device.id),
        )

    def counters(self, pool: AllocatorPool) -> dict[str, dict[str, Decimal]]:
        key = id(pool)
        available = self.available_counters.get(key)
        if available is None:
            available = {name: dict(values) for name, values in pool.counters.items()}
            for device in pool.devices:
                if device.consumes and self.state.is_allocated(device.id):
                    for set_name, counters in device.consumes:
                        have = available.get(set_name)
                        if have is None:
                            continue
                        for counter, value in counters.items():
                            if counter in have:
                                have[counter] -= value
            self.available_counters[key] = available
        return available

    def take_counters(self, device: CandidateDevice) -> bool:
        available = self.counters(device.pool)
        consumed = self.consumed_counters.setdefault(id(device.pool), {})
        for set_name, counters in device.consumes:
            have = available.get(set_name, {})
            used = consumed.get(set_name, {})
            for counter, value in counters.items():
                if used.get(counter, Decimal(0)) + value > have.get(counter, Decimal(0)):
                    return False
        for set_name, counters in device.consumes:
            used = consumed.setdefault(set_name, {})
            for counter, value in counters.items():
                used[counter] = used.get(counter, Decimal(0)) + value
        return True

    def release_counters(self, device: CandidateDevice) -> None:
        consumed = self.consumed_counters.get(id(device.pool), {})
        for set_name, counters in device.consumes:
            used = consumed.get(set_name, {})
            for counter, value in counters.items():
                used[counter] = used.get(counter, Decimal(0)) - value

    def capacity_in_use(self, device_id: DeviceID) -> bool:
        return device_id in self.state.shared or device_id in self.allocating_capacity

    # --- search -------------------------------------------------------------------------

    def one(self, ci: int, ri: int, si: int, di: int, in_sub: bool, start: int) -> bool:
        self.steps += 1
        if self.steps > self.max_steps:
            raise _OutOfSteps
        if (
            self.deadline is not None
            and self.steps % _CLOCK_EVERY == 0
            and time.monotonic() > self.deadline
        ):
            raise _OutOfTime
        if ci >= len(self.claims):
            return True
        per_claim = self.requests[ci]
        if ri >= len(per_claim):
            try:
                return self.one(ci + 1, 0, 0, 0, False, 0)
            except _MaxSize:
                return False
        alternatives = per_claim[ri]
        if not in_sub and alternatives[0].parent is not None:
            all_exceeded = True
            for index in range(len(alternatives)):
                try:
                    done = self.one(ci, ri, index, 0, True, 0)
                except _MaxSize:
                    continue
                all_exceeded = False
                if done:
                    self.selected[(ci, ri)] = index
                    return True
            if all_exceeded:
                raise _MaxSize
            return False
        req = alternatives[si]
        if req.all_mode and not req.all_devices:
            return False
        if di >= req.num:
            return self.one(ci, ri + 1, 0, 0, False, 0)
        if len(self.results[ci]) + req.num - di > MAX_RESULTS_PER_CLAIM:
            raise _MaxSize
        if req.all_mode:
            undo = self.allocate_device(req, req.all_devices[di], must=True)
            if undo is None:
                return False
            try:
                done = self.one(ci, ri, si, di + 1, in_sub, 0)
            except BaseException:
                undo()
                raise
            if not done:
                undo()
            return done
        candidates = self.candidates
        dedicated = self.state.dedicated
        allocating = self.allocating
        admin = req.admin
        match = req.match
        for pos in range(start, len(candidates)):
            device = candidates[pos]
            if admin:
                if ci in allocating.get(device.id, ()):
                    continue
            elif device.id in dedicated or allocating.get(device.id):
                continue
            verdict = match[device.index]
            if verdict != 1 and (verdict != 0 or not self.selectable(req, device)):
                if verdict == 3 and self.allocator.abort_on_cel_error:
                    self.selectable(req, device)  # raises
                continue
            undo = self.allocate_device(req, device, must=False)
            if undo is None:
                continue
            try:
                done = self.one(ci, ri, si, di + 1, in_sub, pos + 1)
            except BaseException:
                undo()
                raise
            if done:
                return True
            undo()
        return False

    def allocate_device(
        self, req: Req, device: CandidateDevice, must: bool
    ) -> Callable[[], None] | None:
        ci = req.claim_index
        multi = device.allow_multiple
        if not multi and req.admin and ci in self.allocating.get(device.id, ()):
            return None
        if not req.admin and (device.id in self.state.dedicated or self.allocating.get(device.id)):
            return None
        if device.taints and untolerated(device, req.tolerations) is not None:
            return None
        took_counters = False
        if device.consumes and not (multi and self.capacity_in_use(device.id)):
            if not self.take_counters(device):
                return None
            took_counters = True
        added: list[Constraint] = []
        for constraint in self.constraints[ci]:
            if not constraint.add(req, device):
                for done in added:
                    done.remove(req)
                if took_counters:
                    self.release_counters(device)
                if must:
                    raise AllocationError(
                        f"claim {claim_key(self.claims[ci])}, request {req.full_name}: cannot "
                        f"add device {'/'.join(device.id)} because a claim constraint would "
                        "not be satisfied",
                        node_dependent=True,
                    )
                return None
            added.append(constraint)
        consumed: dict[str, QuantityValue] | None = None
        if req.capacity is not None or multi:
            consumed, _ = consumed_capacity(req.capacity, device)
            if consumed is None or self.capacity_problem(device, consumed) is not None:
                for done in added:
                    done.remove(req)
                if took_counters:
                    self.release_counters(device)
                return None
        share_id: str | None = None
        if multi:
            share_id = str(uuid.uuid4())
            assert consumed is not None
            total = self.allocating_capacity.setdefault(device.id, {})
            for name, amount in consumed.items():
                total[name] = total.get(name, Decimal(0)) + amount.value
        else:
            self.allocating.setdefault(device.id, set()).add(ci)
            consumed = None
        results = self.results[ci]
        results.append(_Result(req, device, share_id, consumed))

        def undo() -> None:
            results.pop()
            for done in added:
                done.remove(req)
            if multi:
                total = self.allocating_capacity.get(device.id, {})
                for name, amount in (consumed or {}).items():
                    total[name] = total.get(name, Decimal(0)) - amount.value
                if not any(total.values()):
                    self.allocating_capacity.pop(device.id, None)
            else:
                self.allocating[device.id].discard(ci)
            if took_counters:
                self.release_counters(device)

        return undo

    # --- output -------------------------------------------------------------------------

    def chosen(self, ci: int) -> list[Req]:
        chosen = []
        for ri, alternatives in enumerate(self.requests[ci]):
            index = self.selected.get((ci, ri), 0) if alternatives[0].parent is not None else 0
            chosen.append(alternatives[index])
        return chosen

    def build(self, ci: int) -> Obj:
        claim = self.claims[ci]
        results: list[Obj] = []
        for result in self.results[ci]:
            device = result.device
            entry: Obj = {
                "request": result.req.full_name,
                "driver": device.driver,
                "pool": device.pool.name,
                "device": device.name,
            }
            if result.req.admin:
                entry["adminAccess"] = True
            if result.req.tolerations:
                entry["tolerations"] = copy.deepcopy(result.req.tolerations)
            if device.binding_conditions:
                entry["bindingConditions"] = list(device.binding_conditions)
            if device.binding_failure_conditions:
                entry["bindingFailureConditions"] = list(device.binding_failure_conditions)
            if result.share_id is not None:
                entry["shareID"] = result.share_id
            if result.consumed is not None:
                entry["consumedCapacity"] = {
                    device.capacity[name].name: amount.text
                    for name, amount in result.consumed.items()
                }
            results.append(entry)
        allocation: Obj = {"devices": {"results": results}}
        config = build_config(claim, self.chosen(ci))
        if config:
            allocation["devices"]["config"] = config
        selector = self.node_selector(ci)
        if selector is not None:
            allocation["nodeSelector"] = selector
        return allocation

    def node_selector(self, ci: int) -> Obj | None:
        selectors: list[Mapping[str, Any]] = []
        for result in self.results[ci]:
            device = result.device
            kind = device.placement.get("kind")
            if kind == "node" or device.binds_to_node:
                name = self.node_name or str(device.placement.get("node", ""))
                return node_name_selector(name)
            if kind == "selector" and device.placement.get("selector"):
                selectors.append(device.placement["selector"])
        return merge_selectors(selectors)


def build_request(
    inventory: SliceInventory,
    ci: int,
    claim: Mapping[str, Any],
    base: str,
    sub: str | None,
    spec: Mapping[str, Any],
) -> Req:
    """A :class:`Req` with its class and compiled selectors; raises :class:`AllocationError`."""
    req = Req(ci, base, sub)
    who = f"claim {claim_key(claim)}, request {req.full_name}"
    for i, selector in enumerate(spec.get("selectors") or []):
        if not (selector.get("cel") or {}).get("expression"):
            raise AllocationError(
                f"{who}, selector #{i}: CEL expression empty (unsupported selector type?)"
            )
    class_name = str(spec.get("deviceClassName") or "")
    if not class_name:
        raise AllocationError(f"{who}: missing device class name (unsupported request type?)")
    klass = inventory.classes.get(class_name)
    if klass is None:
        raise AllocationError(
            f"{who}: could not retrieve device class {class_name}: deviceclass.resource.k8s.io "
            f'"{class_name}" not found'
        )
    req.class_name = class_name
    req.klass = klass
    for i, selector in enumerate((klass.get("spec") or {}).get("selectors") or []):
        expression = str((selector.get("cel") or {}).get("expression") or "")
        try:
            req.selectors.append(
                (f"class {class_name} selector #{i}", compile_selector(expression))
            )
        except CompileError as e:
            raise AllocationError(f"class {class_name}: selector #{i}: {e}") from None
    for i, selector in enumerate(spec.get("selectors") or []):
        expression = str(selector["cel"]["expression"])
        try:
            req.selectors.append(
                (f"request {req.full_name} selector #{i}", compile_selector(expression))
            )
        except CompileError as e:
            raise AllocationError(f"claim {claim_key(claim)}: selector #{i}: {e}") from None
    mode = spec.get("allocationMode") or "ExactCount"
    if mode == "ExactCount":
        req.num = int(spec.get("count") or 1)
    elif mode == "All":
        req.all_mode = True
    else:
        raise AllocationError(f"{who}: unsupported count mode {mode}")
    req.admin = bool(spec.get("adminAccess")) and sub is None
    req.tolerations = list(spec.get("tolerations") or [])
    requests = (spec.get("capacity") or {}).get("requests")
    if requests:
        try:
            req.capacity = {
                str(name): QuantityValue.parse(value) for name, value in requests.items()
            }
        except QuantityError as e:
            raise AllocationError(f"{who}: capacity request: {e}") from None
    return req


def parse_constraints(claim: Mapping[str, Any]) -> list[Constraint]:
    constraints = []
    devices = (claim.get("spec") or {}).get("devices") or {}
    for i, raw in enumerate(devices.get("constraints") or []):
        requests = [str(r) for r in raw.get("requests") or []]
        if raw.get("matchAttribute"):
            constraints.append(
                Constraint(i, "matchAttribute", str(raw["matchAttribute"]), requests)
            )
        elif raw.get("distinctAttribute"):
            constraints.append(
                Constraint(i, "distinctAttribute", str(raw["distinctAttribute"]), requests)
            )
        else:
            raise AllocationError(
                f"claim {claim_key(claim)}, constraint #{i}: empty constraint (unsupported "
                "constraint type?)"
            )
    return constraints


def build_config(claim: Mapping[str, Any], chosen: Sequence[Req]) -> list[Obj]:
    """``devices.config``: class configs (FromClass) first, then the claim's (FromClaim)."""
    config: list[Obj] = []
    by_class: dict[str, tuple[int, int]] = {}
    for req in chosen:
        span = by_class.get(req.class_name)
        if span is not None:
            for i in range(*span):
                config[i]["requests"].append(req.full_name)
            continue
        start = len(config)
        for entry in (req.klass.get("spec") or {}).get("config") or []:
            item: Obj = {"source": "FromClass", "requests": [req.full_name]}
            item.update({k: copy.deepcopy(v) for k, v in entry.items() if k != "requests"})
            config.append(item)
        by_class[req.class_name] = (start, len(config))
    names = {req.base for req in chosen} | {req.full_name for req in chosen}
    for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
        requests = list(entry.get("requests") or [])
        if requests and not names.intersection(requests):
            continue
        item = {"source": "FromClaim"}
        if requests:
            item["requests"] = requests
        item.update({k: copy.deepcopy(v) for k, v in entry.items() if k != "requests"})
        config.append(item)
    for item in config:
        if len(item.get("requests") or []) == len(chosen):
            item.pop("requests", None)
    return config
