"""Device-plugin shim logic: configuration, topology-aware choice, hold reconciliation."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dradriver.devices.config import parse_config
from dradriver.devices.configyaml import DriverConfigError
from dradriver.devices.model import Device
from dradriver.devices.topology import (
    Topology,
    device_topology,
    natural_key,
    preferred_allocation,
)
from dradriver.host.state.schema import DeviceRef, PluginHold
from kubeletplugin.legacy.podresources import Assignment, ReconcilePlan, plan_reconcile
from tests.stepcount import python_calls

DRIVER = "dradriver.dev"
RES = "dradriver.dev/mock"


# ----- configuration ---------------------------------------------------------------------


def test_device_plugin_section_defaults_and_example() -> None:
    config = parse_config(
        """
devicePlugin:
  enabled: true
  mode: shared
  resources:
    - resourceName: dradriver.dev/mock
      devices: {names: ["dev-*"], attributes: {model: a100}}
  preStart: {command: [/bin/fpga-load]}
  preferredAllocation: false
"""
    ).device_plugin
    assert config.enabled and config.mode == "shared"
    assert config.hide_from_dra == "taint" and not config.preferred_allocation
    assert config.pre_start_timeout == 28  # the default 30 s hook timeout, capped
    dev = Device(name="dev-0", attributes={"model": "a100"})
    other = Device(name="dev-1", attributes={"model": "h100"})
    assert config.resource_of(dev, DRIVER) == RES
    assert config.resource_of(other, DRIVER) is None
    assert parse_config("{}").device_plugin.enabled is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("devicePlugin: {enabled: true}", "serves no resource"),
        ("devicePlugin: {resources: [{resourceName: mock}]}", "needs a domain"),
        ("devicePlugin: {resources: [{resourceName: kubernetes.io/gpu}]}", "reserved"),
        ("devicePlugin: {resources: [{resourceName: a.io/b_}]}", "not a valid extended"),
        (
            "devicePlugin: {resources: [{resourceName: a.io/x}, {resourceName: a.io/x}]}",
            "resources[1].resourceName: 'a.io/x' is also used by resources[0]",
        ),
        ("devicePlugin: {mode: both}", "devicePlugin.mode"),
        (
            "devicePlugin: {preStart: {command: [x], timeoutSeconds: 29}}",
            "the kubelet gives PreStartContainer 30 s",
        ),
        ("devicePlugin: {resources: [{resourceName: a.io/x, devices: {nmes: [a]}}]}", "unknown"),
    ],
)
def test_device_plugin_section_errors_name_the_field(text: str, message: str) -> None:
    with pytest.raises(DriverConfigError) as err:
        parse_config(text, "cfg.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("cfg.yaml: devicePlugin")


def test_overlapping_selectors_are_reported() -> None:
    config = parse_config(
        """
devicePlugin:
  resources:
    - {resourceName: a.io/x, devices: {names: ["dev-*"]}}
    - {resourceName: a.io/y, devices: {names: [dev-1]}}
"""
    ).device_plugin
    devices = [Device(name="dev-0"), Device(name="dev-1")]
    assert config.overlaps(devices, DRIVER) == ["dev-1 (a.io/x, a.io/y)"]


# ----- topology ----------------------------------------------------------------------


def topo(*spec: tuple[str, int | None, str | None]) -> dict[str, Topology]:
    return {name: Topology(numa, root) for name, numa, root in spec}


TWO_NODES = topo(
    ("g0", 0, "r0"),
    ("g1", 0, "r0"),
    ("g2", 0, "r1"),
    ("g3", 1, "r2"),
    ("g4", 1, "r2"),
    ("g5", 1, "r3"),
    ("g6", 1, "r3"),
)


def test_topology_comes_from_the_standard_attributes() -> None:
    device = Device(
        name="d",
        attributes={
            "resource.kubernetes.io/numaNode": 1,
            "resource.kubernetes.io/pcieRoot": "pci0000:00",
        },
    )
    assert device_topology(device, DRIVER) == Topology(1, "pci0000:00")
    assert device_topology(Device(name="e"), DRIVER) == Topology()


def test_the_driver_own_numa_node_from_older_configuration_still_counts() -> None:
    legacy = Device(name="d", attributes={"numaNode": 1})
    assert device_topology(legacy, DRIVER) == Topology(1, None)
    both = Device(name="d", attributes={"numaNode": 1, "resource.kubernetes.io/numaNode": 0})
    assert device_topology(both, DRIVER) == Topology(0, None)  # the standard one wins


def test_natural_order() -> None:
    assert sorted(["dev-10", "dev-2", "dev-1"], key=natural_key) == ["dev-1", "dev-2", "dev-10"]


@pytest.mark.parametrize(
    ("available", "must", "size", "expected"),
    [
        # One device: the tightest PCIe root (r1 has one device left).
        (list(TWO_NODES), [], 1, ["g2"]),
        # Two: a whole root, the first of the tightest fitting ones.
        (list(TWO_NODES), [], 2, ["g0", "g1"]),
        # Three: fits one NUMA node only; node 0 is tighter, whole roots first.
        (list(TWO_NODES), [], 3, ["g0", "g1", "g2"]),
        # Four: node 1 holds four.
        (list(TWO_NODES), [], 4, ["g3", "g4", "g5", "g6"]),
        # Must-include pulls its root and NUMA neighbours in.
        (list(TWO_NODES), ["g5"], 3, ["g5", "g6", "g3"]),
        # Must-include is honoured even across nodes; size too.
        (list(TWO_NODES), ["g0", "g6"], 2, ["g0", "g6"]),
        # Not enough on one node: span as few as possible.
        (list(TWO_NODES), [], 6, ["g3", "g4", "g5", "g6", "g0", "g1"]),
        # Fewer available than asked: all of them.
        (["g0", "g3"], [], 3, ["g0", "g3"]),
    ],
)
def test_preferred_allocation(
    available: list[str], must: list[str], size: int, expected: list[str]
) -> None:
    assert preferred_allocation(available, must, size, TWO_NODES) == expected


def test_preferred_allocation_avoids_devices_the_other_api_holds() -> None:
    # Without g0, root r0 is down to one device: a whole free root (r2) is better.
    assert preferred_allocation(list(TWO_NODES), [], 2, TWO_NODES, avoid={"g0"}) == ["g3", "g4"]
    assert preferred_allocation(["g0", "g1", "g2"], [], 1, TWO_NODES, avoid={"g2"}) == ["g0"]
    assert preferred_allocation(["g0"], [], 1, TWO_NODES, avoid={"g0"}) == ["g0"]


def test_preferred_allocation_without_topology_is_name_order() -> None:
    assert preferred_allocation(["dev-10", "dev-2", "dev-1"], [], 2, {}) == ["dev-1", "dev-2"]


def reference_preferred_allocation(
    available: list[str],
    must_include: list[str],
    size: int,
    topology: dict[str, Topology],
    avoid: set[str],
) -> list[str]:
    """The rules written plainly (quadratic): every pick looks at every device."""

    def root(d: str) -> str | None:
        return topology.get(d, Topology()).pcie_root

    def numa(d: str) -> int | None:
        return topology.get(d, Topology()).numa

    def groups(devices: list[str], key: Callable[[str], object]) -> list[list[str]]:
        out: dict[object, list[str]] = {}
        for d in devices:
            if key(d) is not None:
                out.setdefault(key(d), []).append(d)
        return list(out.values())

    def largest_root_first(group: list[str]) -> str:
        roots = groups(group, root)
        return max(roots, key=len)[0] if roots else group[0]

    def start_block(pool: list[str], need: int) -> str:
        fitting = [g for g in groups(pool, root) if len(g) >= need]
        if fitting:
            return min(fitting, key=len)[0]
        by_numa = groups(pool, numa)
        fitting = [g for g in by_numa if len(g) >= need]
        if fitting:
            return largest_root_first(min(fitting, key=len))
        if by_numa:
            return largest_root_first(max(by_numa, key=len))
        return largest_root_first(pool)

    chosen = list(dict.fromkeys(must_include))
    pool = sorted(set(available) - set(chosen), key=natural_key)
    while len(chosen) < size and pool:
        need = size - len(chosen)
        usable = [d for d in pool if d not in avoid] or pool
        roots = {root(c) for c in chosen} - {None}
        numas = {numa(c) for c in chosen} - {None}
        same_root = [d for d in usable if root(d) in roots]
        same_numa = [d for d in usable if numa(d) in numas]
        if same_root:
            pick = same_root[0]
        elif same_numa:
            pick = start_block(same_numa, need)
        else:
            pick = start_block(usable, need)
        chosen.append(pick)
        pool.remove(pick)
    return chosen


@st.composite
def allocation_requests(
    draw: st.DrawFn,
) -> tuple[list[str], list[str], int, dict[str, Topology], set[str]]:
    names = [f"d{i}" for i in range(draw(st.integers(1, 24)))]
    topology = {
        d: Topology(
            numa=draw(st.one_of(st.none(), st.integers(0, 3))),
            pcie_root=draw(st.one_of(st.none(), st.sampled_from(["r0", "r1", "r2", "r3", "r4"]))),
        )
        for d in names
    }
    available = draw(st.lists(st.sampled_from(names), unique=True))
    must = draw(st.lists(st.sampled_from(names), max_size=3))
    avoid = set(draw(st.lists(st.sampled_from(names))))
    return available, must, draw(st.integers(0, 26)), topology, avoid


@settings(max_examples=400, deadline=None, derandomize=True)
@given(allocation_requests())
def test_preferred_allocation_makes_the_choices_the_plain_rules_make(
    request: tuple[list[str], list[str], int, dict[str, Topology], set[str]],
) -> None:
    available, must, size, topology, avoid = request
    assert preferred_allocation(available, must, size, topology, avoid) == (
        reference_preferred_allocation(available, must, size, topology, avoid)
    )


@pytest.mark.parametrize("topology", ["none", "8x8"])
def test_preferred_allocation_costs_near_linear_steps(topology: str) -> None:
    def request(n: int) -> Callable[[], object]:
        names = [f"dev-{i}" for i in range(n)]
        topo = (
            {d: Topology(numa=i % 8, pcie_root=f"r{i % 64}") for i, d in enumerate(names)}
            if topology == "8x8"
            else {}
        )
        return lambda: preferred_allocation(names, names[:2], n // 2, topo, avoid=names[-10:])

    small, large = python_calls(request(1500)), python_calls(request(6000))
    # 4x the devices: ~4x the steps (the quadratic rules take ~16x).
    assert large < 6 * small, (small, large)


# ----- hold reconciliation -------------------------------------------------------------


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def hold(alloc: str, *devices: str, age: float = 0, resource: str = RES) -> PluginHold:
    return PluginHold(
        resource=resource,
        pod_uid=alloc,
        container="unknown",
        devices=[DeviceRef(pool="node-1", device=d) for d in devices],
        state="allocated",
        updated=(NOW - timedelta(seconds=age)).isoformat(),
    )


def use(pod: str, *devices: str, resource: str = RES) -> Assignment:
    return Assignment("ns", pod, "main", resource, frozenset(devices))


def plan(
    holds: list[PluginHold],
    uses: list[Assignment],
    *,
    seen: dict[str, Assignment] | None = None,
    in_flight: set[str] | None = None,
    may_release: bool = True,
) -> ReconcilePlan:
    return plan_reconcile(
        holds,
        uses,
        pool="node-1",
        resources=[RES],
        seen=seen or {},
        in_flight=in_flight or set(),
        may_release=may_release,
        grace=60.0,
        now=NOW.timestamp(),
    )


def test_a_listed_hold_is_live() -> None:
    result = plan([hold("a", "d0")], [use("p", "d0")])
    assert result.live == {"a": use("p", "d0")}
    assert result.release == [] and result.adopt == []


def test_a_seen_hold_no_longer_listed_is_released() -> None:
    result = plan([hold("a", "d0")], [], seen={"a": use("p", "d0")})
    [release] = result.release
    assert release.kind == "pod-ended" and "pod ns/p container main" in release.reason


def test_an_unseen_hold_waits_for_the_grace_period() -> None:
    assert plan([hold("a", "d0", age=10)], []).release == []
    [release] = plan([hold("a", "d0", age=61)], []).release
    assert release.kind == "never-seen"


def test_nothing_is_released_while_settling_or_in_flight() -> None:
    seen = {"a": use("p", "d0")}
    assert plan([hold("a", "d0")], [], seen=seen, may_release=False).release == []
    assert plan([hold("a", "d0")], [], seen=seen, in_flight={"a"}).release == []


def test_uncovered_devices_in_use_are_adopted_only_for_our_resources() -> None:
    result = plan(
        [hold("a", "d0")],
        [use("p", "d0", "d1"), use("q", "x0", resource="other.io/gpu")],
    )
    assert result.adopt == [use("p", "d1")]
