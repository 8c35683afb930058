"""The network-pool reconciler's decisions: slices, attach failures, deletion.

The reconciler runs against the in-memory apiserver (tests/fakes), which feeds the
pools, claims and slices caches as watches would, with the simulated attach backend.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from controller.networkpools.attach import AttachError, AttachRequest, SimulatedAttach
from controller.networkpools.reconciler import NetworkPoolReconciler
from dradriver.api import networkpool as net
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import RequeueAfter
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer

DRIVER = "dradriver.dev"
POOL = "fab"
POOL_PATH = path_for(f"{DRIVER}/{net.VERSION}", net.PLURAL, None, POOL)
SLICES = path_for(RESOURCE_V1, "resourceslices")
CLAIM_PATH = path_for(RESOURCE_V1, "resourceclaims", "ns", "c")


def on_node(node: str) -> Obj:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


class World:
    def __init__(self) -> None:
        self.api = FakeAPIServer()
        self.pools, self.claims, self.slices = FakeInformer(), FakeInformer(), FakeInformer()
        self.api.feed(net.PLURAL, self.pools)
        self.api.feed("resourceclaims", self.claims)
        self.api.feed("resourceslices", self.slices)
        self.reconciler = NetworkPoolReconciler(
            cast(Any, self.api),
            DRIVER,
            cast(Any, self.pools),
            cast(Any, self.claims),
            cast(Any, self.slices),
            is_leader=lambda: True,
        )

    def create_pool(self, spec: Obj) -> None:
        self.api.put(
            POOL_PATH,
            {
                "apiVersion": f"{DRIVER}/{net.VERSION}",
                "kind": net.KIND,
                "metadata": {"name": POOL},
                "spec": spec,
            },
        )

    def allocate(self, device: str, node: str) -> None:
        """A claim the scheduler allocated ``device`` to, bound to ``node``."""
        result = {"request": "nic", "driver": DRIVER, "pool": net.pool_name(POOL), "device": device}
        self.api.put(
            CLAIM_PATH,
            {
                "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid"},
                "spec": {"devices": {"requests": [{"name": "nic"}]}},
                "status": {
                    "allocation": {"devices": {"results": [result]}, "nodeSelector": on_node(node)}
                },
            },
        )

    def reconcile(self) -> str:
        """One pass; the reason it asked to look again ("" if it did not)."""
        try:
            asyncio.run(self.reconciler(POOL))
        except RequeueAfter as e:
            return str(e)
        return ""

    def pool(self) -> Obj | None:
        return self.api.stored(POOL_PATH)

    def slice_objects(self) -> dict[str, Obj]:
        return {
            p.rsplit("/", 1)[1]: o
            for p, o in self.api.objects.items()
            if p.startswith(SLICES + "/")
        }

    def slice_writes(self, mark: int = 0) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.api.writes[mark:] if p.startswith(SLICES)]

    def backend(self) -> SimulatedAttach:
        obj = self.pool()
        assert obj is not None
        backend = self.reconciler.backend(POOL, net.parse_spec(obj["spec"]))
        assert isinstance(backend, SimulatedAttach)
        return backend


def simulated(*fail: str) -> Obj:
    return {"backend": "simulated", "simulated": {"latencySeconds": 0, "failDevices": list(fail)}}


@pytest.mark.parametrize(
    ("pool_selector", "device_selector", "selection"),
    [
        (None, None, {"allNodes": True}),
        (on_node("node-2"), None, {"nodeSelector": on_node("node-2")}),
        (on_node("node-2"), on_node("node-1"), {"perDeviceNodeSelection": True}),
    ],
    ids=["all-nodes", "pool-selector", "per-device"],
)
def test_a_pool_is_published_with_its_node_selection(
    pool_selector: Obj | None, device_selector: Obj | None, selection: Obj
) -> None:
    world = World()
    devices: list[Obj] = [{"name": "nic-0"}, {"name": "nic-1"}]
    if device_selector is not None:
        devices[0]["nodeSelector"] = device_selector
    spec: Obj = {"attach": simulated(), "devices": devices}
    if pool_selector is not None:
        spec["nodeSelector"] = pool_selector
    world.create_pool(spec)
    assert world.reconcile() == ""

    [slice_] = world.slice_objects().values()
    body = slice_["spec"]
    placement = {
        k: body[k]
        for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
        if k in body
    }
    assert placement == selection
    assert body["pool"] == {"name": "network/fab", "generation": 1, "resourceSliceCount": 1}
    if "perDeviceNodeSelection" in selection:
        nic0, nic1 = body["devices"]
        assert nic0["nodeSelector"] == device_selector
        assert nic1["nodeSelector"] == pool_selector  # the pool's, spelled out per device
    assert all(d["bindsToNode"] for d in body["devices"])
    pool = world.pool()
    assert pool is not None
    assert slice_["metadata"]["ownerReferences"] == [
        {
            "apiVersion": f"{DRIVER}/{net.VERSION}",
            "kind": net.KIND,
            "name": POOL,
            "uid": pool["metadata"]["uid"],
            "controller": True,
        }
    ]
    assert slice_["metadata"]["labels"] == {f"{DRIVER}/network-pool": POOL}
    assert net.FINALIZER in pool["metadata"]["finalizers"]
    [published] = pool["status"]["conditions"]
    assert (published["type"], published["status"]) == ("Published", "True")
    # Level-based: a second pass with nothing changed writes no slice.
    mark = len(world.api.writes)
    world.reconcile()
    assert world.slice_writes(mark) == []


def test_an_attach_failure_taints_the_device_rewriting_one_slice() -> None:
    world = World()
    devices = [{"name": f"nic-{i:03d}"} for i in range(100)]  # slices of 64 and 36
    world.create_pool({"attach": simulated("nic-070"), "devices": devices})
    world.reconcile()
    assert len(world.slice_objects()) == 2
    mark = len(world.api.writes)

    world.allocate("nic-070", "node-2")
    reason = world.reconcile()
    assert "attach nic-070 to node-2" in reason

    [(method, path)] = world.slice_writes(mark)
    assert method == "PUT"
    rewritten = world.slice_objects()[path.rsplit("/", 1)[1]]
    tainted = [d for d in rewritten["spec"]["devices"] if d.get("taints")]
    assert [d["name"] for d in tainted] == ["nic-070"]
    assert tainted[0]["taints"] == [net.attach_failed_taint(DRIVER)]
    assert {s["spec"]["pool"]["generation"] for s in world.slice_objects().values()} == {1}
    claim = world.api.stored(CLAIM_PATH)
    assert claim is not None
    entry = net.device_status(claim, DRIVER, "network/fab", "nic-070")
    assert net.condition_true(entry, net.attach_failed_condition(DRIVER))


def test_a_dropped_taint_is_reported_in_the_published_condition() -> None:
    world = World()

    def gate_off(obj: Obj) -> None:  # DRADeviceTaints off: the apiserver drops taints
        for d in obj.get("spec", {}).get("devices") or []:
            d.pop("taints", None)

    world.api.on_write(SLICES, gate_off)
    world.create_pool({"attach": simulated("nic-0"), "devices": [{"name": "nic-0"}]})
    world.reconcile()
    world.allocate("nic-0", "node-1")
    world.reconcile()
    pool = world.pool()
    assert pool is not None
    [published] = pool["status"]["conditions"]
    assert "DRADeviceTaints" in published["message"]


def test_deleting_a_pool_waits_for_its_devices_to_be_detached() -> None:
    world = World()
    world.create_pool({"attach": simulated(), "devices": [{"name": "nic-0"}]})
    world.allocate("nic-0", "node-1")
    assert world.reconcile() == ""
    backend = world.backend()
    assert backend.attached == {(POOL, "nic-0"): "node-1"}

    asyncio.run(world.api.delete(POOL_PATH))
    held = world.pool()
    assert held is not None and "deletionTimestamp" in held["metadata"]  # the finalizer

    # The simulated backend cannot fail a detach: this stands in for a fabric that refuses.
    async def refuse(request: AttachRequest, handle: str) -> None:
        raise AttachError("switch unreachable")

    real_detach = backend.detach
    backend.detach = refuse  # type: ignore[method-assign]
    assert "detach nic-0 from node-1: switch unreachable" in world.reconcile()
    still = world.pool()
    assert still is not None and net.FINALIZER in still["metadata"]["finalizers"]
    assert len(still["status"]["attachments"]) == 1
    assert world.slice_objects()

    backend.detach = real_detach  # type: ignore[method-assign]
    assert world.reconcile() == ""
    assert backend.attached == {}
    assert world.pool() is None  # the finalizer was the last thing holding it
    # The pool is no longer desired: its slices go (not only later by the garbage collector).
    world.reconcile()
    assert world.slice_objects() == {}


def test_a_spec_change_republishes_every_slice_at_the_pools_generation() -> None:
    # The pool generation follows the object's: every slice must carry the new one, or
    # the scheduler would take the slices left at the old one for outdated.
    world = World()
    devices: list[Obj] = [{"name": f"nic-{i:03d}"} for i in range(100)]
    world.create_pool({"attach": simulated(), "devices": devices})
    world.reconcile()
    mark = len(world.api.writes)
    devices[0] = {"name": "nic-000", "attributes": {"speed": {"int": 400}}}
    asyncio.run(world.api.merge_patch(POOL_PATH, {"spec": {"devices": devices}}))
    world.reconcile()
    assert sorted(m for m, _ in world.slice_writes(mark)) == ["PUT", "PUT"]
    assert {s["spec"]["pool"]["generation"] for s in world.slice_objects().values()} == {2}
