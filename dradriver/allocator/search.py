"""One allocation attempt: the backtracking search for one node (or for no node).

Invariants:
- Claims in order, for each claim its requests in order, for each request one device after
  the other, each first-fit in the order of the visible candidates; a failure further on
  undoes the latest choice and tries the next candidate. Inside one request only
  combinations are tried (candidates after the previous one's position), not permutations.
- Per candidate device, in order: taken by another claim (or by this attempt), selectors,
  taints, counters, the claim's constraints, consumable capacity. Every check that takes
  something (counters, constraint values, capacity, the device) is undone on backtracking.
- A ``firstAvailable`` request tries its subrequests in order and keeps the first that
  lets the rest of the search succeed; an ``All`` request takes every device it listed at
  preparation, or fails.
- A claim never gets more than :data:`MAX_RESULTS_PER_CLAIM` results; a path that would
  need more is abandoned (and the claim fails when every path would).
- The search counts steps (one per call of :meth:`Search.one`) and stops past
  ``max_steps``, or once ``deadline`` (a :func:`time.monotonic` time) has passed, looked
  at every ``_CLOCK_EVERY`` steps; the outcome then names the budget in ``exhausted``.
- Selector verdicts are written to the request's shared match cache (0 unknown, 1 match,
  2 no match, 3 CEL error); they do not depend on what is allocated.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from dradriver.allocator.capacity import consumed_capacity, fit
from dradriver.allocator.constraints import Constraint, parse_constraints
from dradriver.allocator.inventory import (
    AllocatorPool,
    CandidateDevice,
    QuantityValue,
    SliceInventory,
)
from dradriver.allocator.nodes import NodeInfo
from dradriver.allocator.outcome import OUT_OF_STEPS, OUT_OF_TIME, Outcome
from dradriver.allocator.request import AllocationError, Req, build_request, untolerated
from dradriver.allocator.results import Result, allocation_result
from dradriver.allocator.state import AllocatedState, DeviceID, claim_key
from dradriver.k8s.objects import Obj

__all__ = ["MAX_RESULTS_PER_CLAIM", "Search"]

MAX_RESULTS_PER_CLAIM = 32
_CLOCK_EVERY = 256  # steps between two looks at the clock (a look costs as much as a step)


class _MaxSize(Exception):
    """More than 32 results would be needed on this path."""


class _OutOfSteps(Exception):
    pass


class _OutOfTime(Exception):
    pass


class Search:
    """One allocation attempt (one node or none); :meth:`run` once, then discard it.

    ``match_cache`` gives the selector verdicts of a request (shared by every attempt over
    the same inventory). ``abort_on_cel_error``: a CEL runtime error aborts the attempt
    instead of making the device not match.
    """

    def __init__(
        self,
        inventory: SliceInventory,
        claims: Sequence[Mapping[str, Any]],
        state: AllocatedState,
        node: NodeInfo | None,
        *,
        match_cache: Callable[[Req], bytearray],
        abort_on_cel_error: bool,
        max_steps: int,
        deadline: float | None = None,
    ) -> None:
        self.inventory = inventory
        self.match_cache = match_cache
        self.abort_on_cel_error = abort_on_cel_error
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
        self.results: list[list[Result]] = [[] for _ in claims]
        self.steps = 0
        self.max_steps = max_steps
        self.deadline = deadline

    def run(self) -> Outcome:
        """Prepare the requests and search; the outcome of this one attempt."""
        try:
            self.prepare()
            done = self.one(0, 0, 0, 0, False, 0)
        except AllocationError as e:
            return Outcome(
                error=e.message,
                steps=self.steps,
                nodes_tried=[self.node_name],
                node_dependent_error=e.node_dependent,
            )
        except _OutOfSteps:
            return Outcome(
                error=f"search stopped after {self.max_steps} steps without a result",
                steps=self.steps,
                nodes_tried=[self.node_name],
                node_dependent_error=True,
                exhausted=OUT_OF_STEPS,
            )
        except _OutOfTime:
            return Outcome(
                error="search ran out of time without a result",
                steps=self.steps,
                nodes_tried=[self.node_name],
                node_dependent_error=True,
                exhausted=OUT_OF_TIME,
            )
        except _MaxSize:
            done = False
        if not done:
            invalid = [p for p in self.pools_seen() if p.invalid is not None]
            error = None
            if invalid:
                error = "invalid resource pools were encountered: " + "; ".join(
                    p.problem() or p.id for p in invalid
                )
            return Outcome(
                error=error,
                steps=self.steps,
                nodes_tried=[self.node_name],
                node_dependent_error=True,
            )
        return Outcome(
            allocations=[self.build(i) for i in range(len(self.claims))],
            node=self.node_name,
            steps=self.steps,
            nodes_tried=[self.node_name],
        )

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
        req.match = self.match_cache(req)
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
                    consumed, _ = consumed_capacity(req, device)
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
        if verdict == 3 and self.abort_on_cel_error:
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
        """Whether claim ``ci`` from request ``ri`` (subrequest ``si``), device ``di``,
        candidates from position ``start`` on, and every claim after it, fit."""
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
            return self.one_of(ci, ri, len(alternatives))
        req = alternatives[si]
        if req.all_mode and not req.all_devices:
            return False
        if di >= req.num:
            return self.one(ci, ri + 1, 0, 0, False, 0)
        if len(self.results[ci]) + req.num - di > MAX_RESULTS_PER_CLAIM:
            raise _MaxSize
        if req.all_mode:
            return self.all_of(req, ci, ri, si, di, in_sub)
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
                if verdict == 3 and self.abort_on_cel_error:
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

    def one_of(self, ci: int, ri: int, count: int) -> bool:
        """A ``firstAvailable`` request: the first of its ``count`` subrequests that works."""
        all_exceeded = True
        for index in range(count):
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

    def all_of(self, req: Req, ci: int, ri: int, si: int, di: int, in_sub: bool) -> bool:
        """An ``All`` request: its device ``di`` (every one must fit), then the rest."""
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
            consumed, _ = consumed_capacity(req, device)
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
        results.append(Result(req, device, share_id, consumed))

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
        return allocation_result(self.claims[ci], self.results[ci], self.chosen(ci), self.node_name)
