"""Claims of another driver's class, as the ClaimReconciler meets them (controller/claims/
foreign.py): left alone with one Warning event, never allocated, fenced or finalized.
Real allocation worker, the fake apiserver (the claims informer fed by its writes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from controller.claims import scope
from controller.claims.context import ClaimContext, ClaimSources
from controller.claims.reconciler import ClaimReconciler
from controller.claims.scheduler import SchedulerActivity
from controller.claims.worker import AllocationWorker
from dradriver.api.wellknown import ALLOCATION_ANNOTATION, FINALIZER, STATUS_ANNOTATION
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import path_for
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer
from tests.unit.controller.claims.test_worker import NODES, claim_path, run
from tests.unit.dradriver.allocator.builders import claim as bare_claim
from tests.unit.dradriver.allocator.builders import device, device_class, node_slice
from tests.unit.dradriver.allocator.builders import request as bare_request

OURS = "dradriver.dev"
OTHER = "gpu.other-vendor.example.com"
OTHER_DEVICES = 16


@pytest.fixture
def worker() -> Iterator[AllocationWorker]:
    """One per test: a worker keeps the inventory by generation, which each rig counts
    from 1."""
    own = AllocationWorker()
    yield own
    run(own.close())


class Rig:
    """Our driver's class and 2 devices, another vendor's class and 16 devices, node-1."""

    def __init__(self, worker: AllocationWorker) -> None:
        self.api = FakeAPIServer()
        self.claims = FakeInformer()
        self.api.feed("resourceclaims", self.claims)
        self.classes = FakeInformer(
            device_class("ours", [f'device.driver == "{OURS}"']),
            device_class("gpu", [f'device.driver == "{OTHER}"']),
        )
        slices = [
            node_slice("node-1", [device(f"dev-{i}") for i in range(2)], driver=OURS),
            node_slice(
                "node-1",
                [device(f"gpu-{i}") for i in range(OTHER_DEVICES)],
                driver=OTHER,
                pool="gpus",
            ),
        ]
        self.enqueued: list[str] = []
        self.rec = ClaimReconciler(
            ClaimContext.create(
                cast(Any, self.api),
                OURS,
                cast(Any, self.claims),
                scheduler=SchedulerActivity(None, removal_quiet=0),
                enqueue=self.enqueued.append,
            ),
            ClaimSources(
                cast(Any, FakeInformer()),
                cast(Any, FakeInformer(*slices)),
                cast(Any, self.classes),
                cast(Any, FakeInformer(*NODES)),
            ),
            worker=worker,
        )

    def create(self, name: str, class_name: str, finalizer: bool = False) -> None:
        obj = bare_claim(name, bare_request("r", cls=class_name))
        obj["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: "Immediate"}
        if finalizer:
            obj["metadata"]["finalizers"] = [FINALIZER]
        self.api.put(claim_path(name), obj)

    def stored(self, name: str) -> Obj:
        obj = self.api.stored(claim_path(name))
        assert obj is not None
        return obj

    def claim_writes(self, name: str) -> list[str]:
        return [w.method for w in self.api.history if w.path.startswith(claim_path(name))]

    def events(self) -> list[tuple[str, str, str]]:
        prefix = path_for("v1", "events", "ns") + "/"
        return [
            (o["involvedObject"]["name"], o["reason"], o["message"])
            for path, o in sorted(self.api.objects.items())
            if path.startswith(prefix)
        ]


def test_claims_of_another_drivers_class_take_none_of_its_devices(
    worker: AllocationWorker,
) -> None:
    """The finding: 16 annotated claims of another vendor's class, no pod. Before the scope
    rule all 16 of its devices were allocated; now none, one event each, and ours still
    gets its device."""

    async def scenario() -> None:
        rig = Rig(worker)
        names = [f"other-{i:02d}" for i in range(OTHER_DEVICES)]
        for name in names:
            rig.create(name, "gpu")
        rig.create("mine", "ours")
        for name in [*names, "mine"]:
            await rig.rec(f"ns/{name}")  # returns: no RequeueAfter, no error
        taken = [n for n in names if (rig.stored(n).get("status") or {}).get("allocation")]
        assert taken == []
        for name in names:
            stored = rig.stored(name)
            assert FINALIZER not in (stored["metadata"].get("finalizers") or [])
            assert STATUS_ANNOTATION not in stored["metadata"]["annotations"]
            assert rig.claim_writes(name) == []
        [result] = rig.stored("mine")["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == OURS
        events = rig.events()
        warned = sorted(n for n, reason, _ in events if reason == scope.REASON)
        assert warned == names
        message = next(m for n, r, m in events if n == "other-00" and r == scope.REASON)
        assert 'request "r" names DeviceClass "gpu"' in message and OTHER in message
        # Looked at again (a class changed): still nothing, and no second event.
        assert sorted(rig.rec.class_keys({})) == [f"ns/{n}" for n in names]
        for name in names:
            await rig.rec(f"ns/{name}")
        assert rig.events() == events

    run(scenario())


def test_our_finalizer_on_another_drivers_claim_is_removed(worker: AllocationWorker) -> None:
    """Put there by an admission policy that matched too much, or before its class changed:
    the claim must not wait for us on deletion."""

    async def scenario() -> None:
        rig = Rig(worker)
        rig.create("other", "gpu", finalizer=True)
        await rig.rec("ns/other")
        stored = rig.stored("other")
        assert stored["metadata"]["finalizers"] == []
        assert not (stored.get("status") or {}).get("allocation")
        assert [r for _, r, _ in rig.events()] == [scope.REASON]

    run(scenario())


def test_a_claim_we_allocated_keeps_its_devices_when_its_class_stops_being_ours(
    worker: AllocationWorker,
) -> None:
    async def scenario() -> None:
        rig = Rig(worker)
        rig.create("mine", "ours")
        await rig.rec("ns/mine")
        allocated = rig.stored("mine")
        assert (
            allocated["status"]["allocation"] and FINALIZER in allocated["metadata"]["finalizers"]
        )
        rig.classes.apply(device_class("ours", [f'device.driver == "{OTHER}"']))
        writes = len(rig.api.history)
        await rig.rec("ns/mine")
        assert len(rig.api.history) == writes  # kept as it is
        # Deleted: deallocated and its finalizer removed, as for any claim of ours.
        await rig.api.delete(claim_path("mine"))
        await rig.rec("ns/mine")
        assert rig.api.stored(claim_path("mine")) is None

    run(scenario())


def test_a_class_that_becomes_ours_lets_a_waiting_claim_be_allocated(
    worker: AllocationWorker,
) -> None:
    async def scenario() -> None:
        rig = Rig(worker)
        rig.create("later", "fabric")  # the class does not exist yet
        await rig.rec("ns/later")
        assert "does not exist" in rig.events()[0][2]
        assert list(rig.rec.class_keys({})) == ["ns/later"]
        rig.classes.apply(device_class("fabric", [f'device.driver == "{OURS}"']))
        await rig.rec("ns/later")
        assert rig.stored("later")["status"]["allocation"]
        assert list(rig.rec.class_keys({})) == []

    run(scenario())


@pytest.mark.parametrize(("driver", "fenced"), [(OTHER, False), (OURS, True)])
def test_devices_of_other_drivers_are_never_fenced(
    worker: AllocationWorker, driver: str, fenced: bool
) -> None:
    """Claim b lets go of a device claim a still holds: a fence is due for our driver's
    device only."""
    rig = Rig(worker)
    result = {"request": "r", "driver": driver, "pool": "p", "device": "d-0"}
    holder = bare_claim("a", bare_request("r", cls="gpu"))
    holder["status"] = {"allocation": {"devices": {"results": [result]}}}
    second = {**holder, "metadata": {**holder["metadata"], "name": "b"}}
    rig.api.put(claim_path("a"), holder)
    rig.api.put(claim_path("b"), second)
    rig.claims.remove(rig.stored("b"))
    assert any("dradriver-fence-" in k for k in rig.enqueued) == fenced
