"""Our allocator against the real kube-scheduler, on the same ResourceSlices and claims.

A unique driver name gets node-local, partitionable, shareable and network pools and one
DeviceClass. Claims are then used by pods one after the other; before each pod is created
our allocator predicts, from the objects read back from the API server (slices, class,
node, the allocations the scheduler made so far), whether the claim can be allocated and
which devices it gets. The real scheduler must agree: same devices when it allocates (the
pools here leave first-fit no freedom), Unschedulable when we say it cannot be done.

No kubelet plugin serves the driver, so the pods never start (prepare fails): only the
scheduler's allocation matters. Everything is in the test's namespace and its slices.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from dradriver.allocator import AllocatedState, Allocator, SliceInventory, explain, summarize
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for

R = RESOURCE_V1
NODE = "node-1"
DEADLINE = 60


class Scenario:
    def __init__(self, name: str, requests: list[Obj], constraints: list[Obj] | None = None):
        self.name = name
        self.requests = requests
        self.constraints = constraints or []


class Rig:
    """The driver's slices and class on the cluster, and helpers for claims and pods."""

    def __init__(self, api: AdminAPI, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.id = uuid.uuid4().hex[:8]
        self.driver = f"alloc-{self.id}.test.dradriver.dev"
        self.cls = f"alloc-{self.id}"
        self.slice_names: list[str] = []

    # --- inventory ----------------------------------------------------------------------

    def attr(self, **values: Any) -> Obj:
        out: Obj = {}
        for key, value in values.items():
            if isinstance(value, bool):
                out[key] = {"bool": value}
            elif isinstance(value, int):
                out[key] = {"int": value}
            elif key == "driverVersion":
                out[key] = {"version": value}
            else:
                out[key] = {"string": value}
        return out

    def slices(self) -> list[Obj]:
        d = self.driver
        gpus = [
            {"name": "gpu-0", "attributes": self.attr(model="a100", numa=0, driverVersion="1.2.0")},
            {"name": "gpu-1", "attributes": self.attr(model="a100", numa=1, driverVersion="1.3.0")},
            {"name": "gpu-2", "attributes": self.attr(model="t4", numa=1, driverVersion="1.3.0")},
            {"name": "gpu-3", "attributes": self.attr(model="l4", numa=0, driverVersion="1.3.0")},
            {
                "name": "gpu-4",
                "attributes": self.attr(model="v100", numa=0, driverVersion="1.0.0"),
                "taints": [{"key": f"{d}/broken", "value": "ecc", "effect": "NoSchedule"}],
            },
        ]
        parts = [
            {
                "name": name,
                "attributes": self.attr(model="part"),
                "consumesCounters": [
                    {"counterSet": "card", "counters": {"memory": {"value": memory}}}
                ],
            }
            for name, memory in (("whole", "32Gi"), ("half-a", "16Gi"), ("half-b", "16Gi"))
        ]
        nic = {
            "name": "nic",
            "attributes": self.attr(model="nic"),
            "allowMultipleAllocations": True,
            "capacity": {
                "bandwidth": {
                    "value": "10G",
                    "requestPolicy": {
                        "default": "1G",
                        "validRange": {"min": "1G", "step": "1G"},
                    },
                }
            },
        }

        def slice_(suffix: str, pool: str, count: int, **spec: Any) -> Obj:
            name = f"{self.id}-{suffix}"
            self.slice_names.append(name)
            return {
                "metadata": {"name": name},
                "spec": {
                    "driver": d,
                    "pool": {"name": pool, "generation": 1, "resourceSliceCount": count},
                    **spec,
                },
            }

        hostname = {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}
                    ]
                }
            ]
        }
        return [
            slice_("a-gpus", "gpus", 1, nodeName=NODE, devices=gpus),
            slice_("b-parts", "parts", 2, nodeName=NODE, devices=parts),
            slice_(
                "c-counters",
                "parts",
                2,
                nodeName=NODE,
                sharedCounters=[{"name": "card", "counters": {"memory": {"value": "32Gi"}}}],
            ),
            slice_("d-nic", "nic", 1, nodeSelector=hostname, devices=[nic]),
            slice_(
                "e-fabric",
                "fabric",
                1,
                allNodes=True,
                devices=[{"name": "fabric-0", "attributes": self.attr(model="net")}],
            ),
        ]

    def device_class(self) -> Obj:
        return {
            "metadata": {"name": self.cls},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{self.driver}"'}}]},
        }

    def create(self) -> None:
        self.api.create(path_for(R, "deviceclasses"), self.device_class())
        for obj in self.slices():
            self.api.create(path_for(R, "resourceslices"), obj)

    def delete(self) -> None:
        for name in self.slice_names:
            self.api.delete(path_for(R, "resourceslices", name=name))
        self.api.delete(path_for(R, "deviceclasses", name=self.cls))

    # --- what our allocator sees --------------------------------------------------------

    def our_view(self) -> tuple[Allocator, AllocatedState, Obj]:
        slices = self.api.items(
            path_for(R, "resourceslices"), fieldSelector=f"spec.driver={self.driver}"
        )
        assert {s["metadata"]["name"] for s in slices} == set(self.slice_names), (
            "slices vanished (a kubelet restart deletes its node's slices)"
        )
        classes = [self.api.get(path_for(R, "deviceclasses", name=self.cls))]
        claims = self.api.items(path_for(R, "resourceclaims", self.namespace))
        node = self.api.get(path_for("v1", "nodes", name=NODE))
        return Allocator(SliceInventory(slices, classes)), AllocatedState.from_claims(claims), node

    # --- claims and pods ----------------------------------------------------------------

    def exactly(self, selectors: list[str] = (), **fields: Any) -> Obj:  # type: ignore[assignment]
        spec: Obj = {"deviceClassName": self.cls, **fields}
        if selectors:
            spec["selectors"] = [{"cel": {"expression": s}} for s in selectors]
        return spec

    def model(self, name: str) -> str:
        return f'device.attributes["{self.driver}"].model == "{name}"'

    def claim_object(self, scenario: Scenario) -> Obj:
        devices: Obj = {"requests": scenario.requests}
        if scenario.constraints:
            devices["constraints"] = scenario.constraints
        return {
            "metadata": {"name": scenario.name, "namespace": self.namespace},
            "spec": {"devices": devices},
        }

    def run_pod(self, scenario: Scenario) -> tuple[str, Obj | str]:
        """Create the claim and a pod using it; the scheduler's allocation or refusal."""
        ns = self.namespace
        self.api.create(path_for(R, "resourceclaims", ns), self.claim_object(scenario))
        self.api.create(
            path_for("v1", "pods", ns),
            {
                "metadata": {"name": scenario.name},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "c", "resourceClaimName": scenario.name}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "c"}]},
                        }
                    ],
                },
            },
        )

        def decided() -> tuple[str, Obj | str] | None:
            claim = self.api.get(path_for(R, "resourceclaims", ns, scenario.name))
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation:
                return "allocated", allocation
            pod = self.api.get(path_for("v1", "pods", ns, scenario.name))
            for cond in (pod.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    reason = str(cond.get("reason", ""))
                    verdict = "unschedulable" if reason == "Unschedulable" else "error"
                    return verdict, f"{reason}: {cond.get('message', '')}"
            return None

        return wait_until(f"the scheduler to decide on {scenario.name}", decided, DEADLINE)

    def remove_pod(self, name: str) -> None:
        ns = self.namespace
        try:
            self.api.request("DELETE", path_for("v1", "pods", ns, name), {"gracePeriodSeconds": 0})
        except KubeAPIError as e:
            if e.status != 404:
                raise
        self.api.delete(path_for(R, "resourceclaims", ns, name))
        wait_until(
            f"claim {name} gone",
            lambda: self.api.get_or_none(path_for(R, "resourceclaims", ns, name)) is None,
            DEADLINE,
        )


@pytest.fixture
def rig(api: AdminAPI, namespace: str, local_cluster: LocalCluster) -> Iterator[Rig]:
    # Admin access needs the namespace label.
    api.merge_patch(
        path_for("v1", "namespaces", name=namespace),
        {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
    )
    rig = Rig(api, namespace)
    rig.create()
    try:
        yield rig
    finally:
        for pod in api.items(path_for("v1", "pods", namespace)):
            with contextlib.suppress(KubeAPIError):
                api.request(
                    "DELETE",
                    path_for("v1", "pods", namespace, pod["metadata"]["name"]),
                    {"gracePeriodSeconds": 0},
                )
        rig.delete()


def devices_of(allocation: Obj) -> list[tuple[str, str, str]]:
    return [(r["request"], r["pool"], r["device"]) for r in allocation["devices"]["results"]]


def check(rig: Rig, scenario: Scenario, expect_ok: bool, why: str = "") -> Obj | None:
    """Our prediction, then the scheduler's decision; ``why`` must be in our explanation."""
    allocator, state, node = rig.our_view()
    claim = rig.claim_object(scenario)
    ours = allocator.allocate([claim], state, node=node)
    assert ours.error is None, ours.error
    assert ours.ok == expect_ok, f"{scenario.name}: our allocator says ok={ours.ok}"
    verdict, detail = rig.run_pod(scenario)
    if not ours.ok:
        assert verdict == "unschedulable", f"{scenario.name}: the scheduler allocated {detail}"
        rows = explain(allocator, claim, state, node=node, drivers=[rig.driver])
        assert why in summarize(rows), (scenario.name, summarize(rows))
        rig.remove_pod(scenario.name)
        return None
    assert verdict == "allocated", f"{scenario.name}: scheduler says {detail}"
    assert isinstance(detail, dict) and ours.allocations is not None
    theirs, mine = detail, ours.allocations[0]
    assert devices_of(mine) == devices_of(theirs), scenario.name
    assert mine.get("nodeSelector") == theirs.get("nodeSelector"), scenario.name
    for a, b in zip(mine["devices"]["results"], theirs["devices"]["results"], strict=True):
        assert a.get("consumedCapacity") == b.get("consumedCapacity"), scenario.name
        assert bool(a.get("adminAccess")) == bool(b.get("adminAccess")), scenario.name
        assert a.get("tolerations") == b.get("tolerations"), scenario.name
        assert ("shareID" in a) == ("shareID" in b), scenario.name
    return theirs


def test_allocator_agrees_with_the_scheduler(rig: Rig) -> None:
    d = rig.driver
    ex = rig.exactly
    numa = f"{d}/numa"
    # Backtracking: gpu-0 (a100, numa 0) has no t4 on its NUMA node; gpu-1 is the answer.
    check(
        rig,
        Scenario(
            "numa-pair",
            [
                {"name": "gpu", "exactly": ex([rig.model("a100")])},
                {"name": "t4", "exactly": ex([rig.model("t4")])},
            ],
            [{"matchAttribute": numa}],
        ),
        True,
    )
    # The other a100 with a newer driver than 1.2.0 is taken now; gpu-0's is not newer.
    newer = f'device.attributes["{d}"].driverVersion.isGreaterThan(semver("1.2.0"))'
    check(
        rig,
        Scenario("newer-a100", [{"name": "g", "exactly": ex([rig.model("a100"), newer])}]),
        False,
        f"allocated to other claims ({rig.namespace}/numa-pair)",
    )
    check(rig, Scenario("any-a100", [{"name": "g", "exactly": ex([rig.model("a100")])}]), True)
    # firstAvailable falls back to the l4.
    check(
        rig,
        Scenario(
            "fallback",
            [
                {
                    "name": "g",
                    "firstAvailable": [
                        {"name": "h100", **ex([rig.model("h100")])},
                        {"name": "l4", **ex([rig.model("l4")])},
                    ],
                }
            ],
        ),
        True,
    )
    # All mode: the t4 is taken, so "all t4" cannot be had.
    check(
        rig,
        Scenario("all-t4", [{"name": "g", "exactly": ex([rig.model("t4")], allocationMode="All")}]),
        False,
        "asks for all matching devices; 1 of them are unavailable",
    )
    # Tainted device: only with a toleration.
    check(
        rig,
        Scenario("v100", [{"name": "g", "exactly": ex([rig.model("v100")])}]),
        False,
        f"untolerated taint {d}/broken=ecc:NoSchedule",
    )
    toleration = {"key": f"{d}/broken", "operator": "Exists", "effect": "NoSchedule"}
    check(
        rig,
        Scenario(
            "v100-tolerated",
            [{"name": "g", "exactly": ex([rig.model("v100")], tolerations=[toleration])}],
        ),
        True,
    )
    # Admin access to a device another claim holds.
    check(
        rig,
        Scenario("admin", [{"name": "g", "exactly": ex([rig.model("l4")], adminAccess=True)}]),
        True,
    )
    # Counters: two halves fit the card, then nothing is left.
    check(
        rig, Scenario("halves", [{"name": "p", "exactly": ex([rig.model("part")], count=2)}]), True
    )
    check(
        rig,
        Scenario("one-more-part", [{"name": "p", "exactly": ex([rig.model("part")])}]),
        False,
        "not enough counter memory in counter set card",
    )
    # Consumable capacity: 2500M rounds up to 3G; 3 + 3 + 3 of 10G, then 5G does not fit.
    for i in range(3):
        check(
            rig,
            Scenario(
                f"nic-{i}",
                [
                    {
                        "name": "n",
                        "exactly": ex(
                            [rig.model("nic")], capacity={"requests": {"bandwidth": "2500M"}}
                        ),
                    }
                ],
            ),
            True,
        )
    check(
        rig,
        Scenario(
            "nic-big",
            [
                {
                    "name": "n",
                    "exactly": ex([rig.model("nic")], capacity={"requests": {"bandwidth": "5G"}}),
                }
            ],
        ),
        False,
        "not enough bandwidth: needs 5G, 1G of 10G free",
    )
    # A network device reachable from all nodes: no node selector.
    check(rig, Scenario("fabric", [{"name": "f", "exactly": ex([rig.model("net")])}]), True)
    # More devices than exist.
    check(
        rig,
        Scenario("too-many", [{"name": "g", "exactly": ex(count=20)}]),
        False,
        "needs 20 device(s)",
    )


def test_cel_runtime_errors_abort_like_the_scheduler(rig: Rig) -> None:
    # gpu-0 has no "cores" attribute: the scheduler stops with a CEL runtime error instead
    # of skipping the device. Our allocator does that with abort_on_cel_error=True; by
    # default it skips the device and reports the error in the explanation.
    cores = f'device.attributes["{rig.driver}"].cores > 2'
    scenario = Scenario("cores", [{"name": "g", "exactly": rig.exactly([cores])}])
    allocator, state, node = rig.our_view()
    strict = Allocator(allocator.inventory, abort_on_cel_error=True)
    claim = rig.claim_object(scenario)
    ours = strict.allocate([claim], state, node=node)
    assert ours.error is not None and "CEL runtime error: no such key: cores" in ours.error
    lenient = allocator.allocate([claim], state, node=node)
    assert lenient.unsatisfiable
    rows = explain(allocator, claim, state, node=node, drivers=[rig.driver])
    assert any("failed: no such key: cores" in r.reason for r in rows)
    verdict, detail = rig.run_pod(scenario)
    assert verdict == "error" and isinstance(detail, str), detail
    assert "CEL runtime error" in detail and "no such key: cores" in detail, detail


def test_capacity_named_with_or_without_the_driver_domain(rig: Rig, cluster_release: str) -> None:
    """From 1.38, ``bandwidth`` and ``<driver>/bandwidth`` are one capacity: shares add up
    whichever spelling each claim uses, the status spells it as the slice does, and a
    request naming it both ways is an error. Before 1.38 the scheduler matched the slice's
    exact spelling only, which our allocator (1.38 rules) does not follow: there the test
    checks that fact and stops."""
    d = rig.driver
    name = f"{rig.id}-f-vnic"
    rig.slice_names.append(name)
    vnic = {
        "name": "vnic",
        "attributes": rig.attr(model="vnic"),
        "allowMultipleAllocations": True,
        "capacity": {f"{d}/bandwidth": {"value": "4G"}},  # spelled out in the slice
    }
    spec = {"driver": d, "pool": {"name": "vnic", "generation": 1, "resourceSliceCount": 1}}
    rig.api.create(
        path_for(R, "resourceslices"),
        {"metadata": {"name": name}, "spec": {**spec, "nodeName": NODE, "devices": [vnic]}},
    )

    def share(claim: str, model: str, *spellings: str) -> Scenario:
        capacity = {"requests": {s: "3G" for s in spellings}}
        return Scenario(
            claim, [{"name": "n", "exactly": rig.exactly([rig.model(model)], capacity=capacity)}]
        )

    minor = int(cluster_release.lstrip("v").split(".")[1])
    if minor < 38:
        verdict, detail = rig.run_pod(share("spelled-out", "nic", f"{d}/bandwidth"))
        assert verdict == "unschedulable", f"{cluster_release}: {detail}"
        pytest.skip(f"{cluster_release} matches capacity requests by the slice's spelling only")
    # The nic's slice says "bandwidth" (10G, steps of 1G): 3G + 3G + 3G, either spelling.
    check(rig, share("nic-q0", "nic", f"{d}/bandwidth"), True)
    check(rig, share("nic-b1", "nic", "bandwidth"), True)
    check(rig, share("nic-q2", "nic", f"{d}/bandwidth"), True)
    check(rig, share("nic-b3", "nic", "bandwidth"), False, "not enough bandwidth: needs 3G, 1G")
    # The vnic's slice spells the domain out: so does the status (check() compares it).
    theirs = check(rig, share("vnic-b0", "vnic", "bandwidth"), True)
    assert theirs is not None
    assert theirs["devices"]["results"][0]["consumedCapacity"] == {f"{d}/bandwidth": "3G"}
    check(rig, share("vnic-q1", "vnic", f"{d}/bandwidth"), False, f"not enough {d}/bandwidth")
    # Both spellings in one request: an error for the scheduler and for us.
    both = share("both", "vnic", "bandwidth", f"{d}/bandwidth")
    allocator, state, node = rig.our_view()
    ours = allocator.allocate([rig.claim_object(both)], state, node=node)
    assert ours.error is not None and "requested both as 'bandwidth' and as" in ours.error
    verdict, detail = rig.run_pod(both)
    assert verdict == "error" and isinstance(detail, str), detail
    assert "requested both as" in detail, detail
