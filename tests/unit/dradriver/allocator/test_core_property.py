"""Property tests: random small pools and claims, allocated one claim after the other.

Soundness (every generated case): no device is handed out twice across claims (admin
access and shares of multi-allocatable devices aside, whose capacity must still fit),
every result satisfies its request's selectors, tolerations, counts and the claim's
constraints, and a claim's node-local devices share one node that its node selector names.

Completeness (cases without admin access, shared devices or firstAvailable): when the
allocator finds nothing, a brute-force search over all device combinations finds nothing
either; the allocator is an exhaustive backtracking search, so it must agree.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dradriver.allocator import (
    AllocatedState,
    Allocator,
    SliceInventory,
    claim_key,
    selector_matches,
)
from dradriver.allocator.nodes import NodeInfo
from tests.unit.dradriver.allocator.builders import (
    DRIVER,
    A,
    claim,
    device,
    device_class,
    exact,
    first_available,
    node_slice,
    shared_slice,
)

NODES = ("n0", "n1")
MODELS = ("a", "b")
BANDWIDTH = 4


@dataclass
class Dev:
    pool: str
    name: str
    node: str | None  # None: reachable from all nodes
    model: str
    numa: int
    tainted: bool
    multi: bool

    @property
    def id(self) -> tuple[str, str, str]:
        return (DRIVER, self.pool, self.name)


@dataclass
class Req:
    name: str
    count: int
    model: str | None
    tolerate: bool
    admin: bool = False
    bandwidth: int | None = None
    alternatives: list[Req] = field(default_factory=list)


@dataclass
class ClaimSpec:
    name: str
    requests: list[Req]
    constraint: str | None  # "match" | "distinct" | None


@st.composite
def inventories(draw: st.DrawFn, rich: bool) -> list[Dev]:
    devices: list[Dev] = []
    for node in NODES:
        for i in range(draw(st.integers(0, 4))):
            devices.append(
                Dev(
                    node,
                    f"d{i}",
                    node,
                    draw(st.sampled_from(MODELS)),
                    draw(st.integers(0, 1)),
                    draw(st.booleans()) and draw(st.booleans()),
                    rich and draw(st.booleans()) and draw(st.booleans()),
                )
            )
    for i in range(draw(st.integers(0, 2))):
        devices.append(
            Dev(
                "fabric",
                f"net{i}",
                None,
                draw(st.sampled_from(MODELS)),
                draw(st.integers(0, 1)),
                False,
                rich and draw(st.booleans()),
            )
        )
    return devices


@st.composite
def requests(draw: st.DrawFn, name: str, rich: bool) -> Req:
    req = Req(
        name,
        draw(st.integers(1, 2)),
        draw(st.sampled_from([None, *MODELS])),
        draw(st.booleans()),
    )
    if rich:
        req.admin = draw(st.booleans()) and draw(st.booleans())
        if draw(st.booleans()):
            req.bandwidth = draw(st.integers(1, 3))
        if draw(st.booleans()) and draw(st.booleans()):
            req.alternatives = [
                Req("x", 1, draw(st.sampled_from(MODELS)), True),
                Req("y", 1, None, False),
            ]
    return req


@st.composite
def claim_specs(draw: st.DrawFn, rich: bool) -> list[ClaimSpec]:
    specs = []
    for c in range(draw(st.integers(1, 4))):
        reqs = [draw(requests(f"r{i}", rich)) for i in range(draw(st.integers(1, 2)))]
        specs.append(ClaimSpec(f"c{c}", reqs, draw(st.sampled_from([None, "match", "distinct"]))))
    return specs


def to_slices(devices: list[Dev]) -> list[dict[str, Any]]:
    def raw(d: Dev) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if d.tainted:
            extra["taints"] = [{"key": "t", "value": "1", "effect": "NoSchedule"}]
        if d.multi:
            extra["allowMultipleAllocations"] = True
        capacity = {"bw": str(BANDWIDTH)} if d.multi else None
        return device(d.name, {"model": d.model, "numa": d.numa}, capacity, **extra)

    slices = []
    for node in NODES:
        mine = [raw(d) for d in devices if d.node == node]
        if mine:
            slices.append(node_slice(node, mine))
    net = [raw(d) for d in devices if d.node is None]
    if net:
        slices.append(shared_slice("fabric", "fabric", net, all_nodes=True))
    return slices


def to_request(req: Req) -> dict[str, Any]:
    def spec(r: Req) -> dict[str, Any]:
        return exact(
            selectors=[f'{A}.model == "{r.model}"'] if r.model else [],
            count=r.count,
            admin=True if r.admin else None,
            tolerations=[{"key": "t", "operator": "Exists"}] if r.tolerate else None,
            capacity={"bw": str(r.bandwidth)} if r.bandwidth else None,
        )

    if req.alternatives:
        return first_available(req.name, *((a.name, spec(a)) for a in req.alternatives))
    return {"name": req.name, "exactly": spec(req)}


def to_claim(spec: ClaimSpec) -> dict[str, Any]:
    constraints = []
    if spec.constraint == "match":
        constraints = [{"matchAttribute": f"{DRIVER}/numa"}]
    elif spec.constraint == "distinct":
        constraints = [{"distinctAttribute": f"{DRIVER}/numa"}]
    return claim(spec.name, *(to_request(r) for r in spec.requests), constraints=constraints)


def eligible(req: Req, dev: Dev) -> bool:
    if req.model is not None and dev.model != req.model:
        return False
    if dev.tainted and not req.tolerate:
        return False
    return not (req.bandwidth is not None and not dev.multi)


def check_allocation(
    spec: ClaimSpec,
    allocation: dict[str, Any],
    by_id: dict[tuple[str, str, str], Dev],
    used: Counter[tuple[str, str, str]],
    bandwidth: Counter[tuple[str, str, str]],
) -> None:
    results = allocation["devices"]["results"]
    per_request: Counter[str] = Counter()
    numas = []
    nodes = set()
    share_ids = []
    for entry in results:
        dev = by_id[(entry["driver"], entry["pool"], entry["device"])]
        base, _, sub = entry["request"].partition("/")
        req = next(r for r in spec.requests if r.name == base)
        if sub:
            req = next(a for a in req.alternatives if a.name == sub)
        per_request[base] += 1
        assert eligible(req, dev), (req, dev)
        numas.append(dev.numa)
        if dev.node is not None:
            nodes.add(dev.node)
        if dev.multi:
            assert "shareID" in entry and "consumedCapacity" in entry
            share_ids.append(entry["shareID"])
            if not req.admin:
                bandwidth[dev.id] += int(entry["consumedCapacity"]["bw"])
        elif not req.admin:
            used[dev.id] += 1
        assert bool(entry.get("adminAccess")) == req.admin
    for req in spec.requests:
        want = req.alternatives[0].count if req.alternatives else req.count
        if req.alternatives:
            assert per_request[req.name] in {a.count for a in req.alternatives}
        else:
            assert per_request[req.name] == want
    if spec.constraint == "match":
        assert len(set(numas)) <= 1
    elif spec.constraint == "distinct":
        assert len(set(numas)) == len(numas)
    assert len(nodes) <= 1
    if nodes:
        (name,) = nodes
        assert selector_matches(allocation.get("nodeSelector"), NodeInfo(name))
    assert len(set(share_ids)) == len(share_ids)
    assert all(n <= 1 for n in used.values()), used
    assert all(b <= BANDWIDTH for b in bandwidth.values()), bandwidth


def brute_force(spec: ClaimSpec, devices: list[Dev], taken: set[tuple[str, str, str]]) -> bool:
    """Whether some allocation exists (restricted model: no admin, shares, subrequests)."""

    def search(
        pool: list[Dev], i: int, used: frozenset[tuple[str, str, str]], numas: tuple[int, ...]
    ) -> bool:
        if i == len(spec.requests):
            return True
        req = spec.requests[i]
        candidates = [d for d in pool if d.id not in used and eligible(req, d)]
        for combo in itertools.combinations(candidates, req.count):
            values = numas + tuple(d.numa for d in combo)
            if spec.constraint == "match" and len(set(values)) > 1:
                continue
            if spec.constraint == "distinct" and len(set(values)) < len(values):
                continue
            if search(pool, i + 1, used | {d.id for d in combo}, values):
                return True
        return False

    for node in [None, *NODES]:
        pool = [d for d in devices if d.id not in taken and (d.node is None or d.node == node)]
        if search(pool, 0, frozenset(), ()):
            return True
    return False


def run_sequence(
    devices: list[Dev], specs: list[ClaimSpec], complete: bool, record: bool = True
) -> None:
    allocator = Allocator(SliceInventory(to_slices(devices), [device_class()]))
    by_id = {d.id: d for d in devices}
    state = AllocatedState()
    used: Counter[tuple[str, str, str]] = Counter()
    bandwidth: Counter[tuple[str, str, str]] = Counter()
    for spec in specs:
        raw = to_claim(spec)
        outcome = allocator.allocate([raw], state, nodes=list(NODES))
        assert outcome.error is None, outcome.error
        if record:
            event("allocated" if outcome.ok else "not allocated")
        if complete:  # the brute force must agree both ways
            assert brute_force(spec, devices, set(state.dedicated)) == outcome.ok, spec
        if outcome.ok:
            assert outcome.allocations is not None
            check_allocation(spec, outcome.allocations[0], by_id, used, bandwidth)
            state.add(claim_key(raw), outcome.allocations[0])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(devices=inventories(rich=True), specs=claim_specs(rich=True))
def test_allocations_are_sound(devices: list[Dev], specs: list[ClaimSpec]) -> None:
    run_sequence(devices, specs, complete=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(devices=inventories(rich=False), specs=claim_specs(rich=False))
def test_allocator_finds_an_allocation_whenever_one_exists(
    devices: list[Dev], specs: list[ClaimSpec]
) -> None:
    run_sequence(devices, specs, complete=True)


def test_brute_force_agrees_on_a_known_case() -> None:
    devices = [
        Dev("n0", "d0", "n0", "a", 0, False, False),
        Dev("n1", "d0", "n1", "a", 1, False, False),
    ]
    spec = ClaimSpec("c", [Req("r", 2, None, False)], None)
    assert not brute_force(spec, devices, set())
    run_sequence(devices, [spec], complete=True, record=False)
    spec = ClaimSpec("c", [Req("r", 1, "a", False), Req("s", 1, None, False)], "distinct")
    assert not brute_force(spec, devices, set())  # different numa needs different nodes


class EveryNode(Allocator):
    """The allocator without :class:`~dradriver.allocator.freenodes.FreeNodes`: it tries
    every node after the attempt without one."""

    def _worth_trying(self, claims, state, infos, by_name, found_nothing):  # type: ignore[no-untyped-def]
        return infos


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(devices=inventories(rich=True), specs=claim_specs(rich=True))
def test_skipping_nodes_without_a_free_device_changes_no_answer(
    devices: list[Dev], specs: list[ClaimSpec]
) -> None:
    """Admin access, shared devices, firstAvailable, constraints: the allocator that skips
    the nodes whose own devices are all taken answers exactly as the one trying them all."""
    fast = Allocator(SliceInventory(to_slices(devices), [device_class()]))
    every = EveryNode(SliceInventory(to_slices(devices), [device_class()]))
    nodes = list(NODES)
    states = (AllocatedState(), AllocatedState())
    for spec in specs:
        raw = to_claim(spec)
        got = fast.allocate([raw], states[0], nodes=nodes)
        want = every.allocate([raw], states[1], nodes=nodes)
        assert (got.ok, _no_share_ids(got.allocations), got.node) == (
            want.ok,
            _no_share_ids(want.allocations),
            want.node,
        )
        assert set(got.nodes_tried) <= set(want.nodes_tried)
        if got.ok:
            assert got.allocations is not None and want.allocations is not None
            states[0].add(claim_key(raw), got.allocations[0])
            states[1].add(claim_key(raw), want.allocations[0])


def _no_share_ids(allocations: list[dict[str, Any]] | None) -> list[Any] | None:
    """The allocations with each result's random shareID left out."""
    if allocations is None:
        return None
    return [
        [
            {k: v for k, v in r.items() if k != "shareID"}
            for r in (a.get("devices") or {}).get("results") or []
        ]
        for a in allocations
    ]
