"""Fence claims: the pure rules of controller/claims/fence_rules.py, and the fence
lifecycle (controller/claims/fence_lifecycle.py) and conflict hold (conflicts.py) as the
ClaimReconciler runs them against the fake apiserver (resourceVersions ordered like etcd's)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest

from controller.claims import fence_rules as fence
from controller.claims.context import ClaimContext, ClaimSettings, ClaimSources
from controller.claims.reconciler import ClaimReconciler
from controller.claims.scheduler import SchedulerActivity
from dradriver.allocator import AllocatedState, DeviceID
from dradriver.api.wellknown import (
    ALLOCATION_ANNOTATION,
    CONFLICT_ANNOTATION,
    FINALIZER,
    STATUS_ANNOTATION,
)
from dradriver.k8s.objects import Obj, revision
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import RequeueAfter
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer

D: DeviceID = ("gpu.example.com", "node-1", "dev-0")
E: DeviceID = ("gpu.example.com", "node-1", "dev-1")
FNS = "dradriver"
SELECTOR = {
    "nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
    ]
}


def allocation(*devices: DeviceID, **extra: Any) -> Obj:
    results = [{"request": "r", "driver": d[0], "pool": d[1], "device": d[2]} for d in devices]
    return {"devices": {"results": results}, "nodeSelector": SELECTOR, **extra}


def claim(name: str, *devices: DeviceID, ours: bool = False, rv: int = 1) -> Obj:
    meta: Obj = {"name": name, "namespace": "ns", "resourceVersion": str(rv)}
    if ours:
        meta["finalizers"] = [FINALIZER]
    status = {"allocation": allocation(*devices)} if devices else {}
    return {"metadata": meta, "spec": {}, "status": status}


def is_fence_key(key: str) -> bool:
    return fence.is_fence_key(FNS, key)


# --- pure parts --------------------------------------------------------------------------


def test_fence_names_are_stable_per_device_and_valid() -> None:
    name = fence.fence_name(D)
    assert name == fence.fence_name(D) != fence.fence_name(E)
    assert name.startswith("dradriver-fence-") and len(name) <= 63
    assert fence.fence_key(FNS, D) == f"{FNS}/{name}"
    assert fence.is_fence_key(FNS, fence.fence_key(FNS, D))
    assert not fence.is_fence_key("other", f"other/{name}".replace("other/", "x/"))
    assert not fence.is_fence_key(FNS, f"{FNS}/my-claim")


def test_new_fence_and_its_allocation() -> None:
    body = fence.new_fence(FNS, [D], "ns/b")
    meta = body["metadata"]
    assert meta["name"] == fence.fence_name(D) and meta["namespace"] == FNS
    assert meta["labels"] == {fence.FENCE_LABEL: "true"}
    assert meta["annotations"][fence.HOLDER_ANNOTATION] == "ns/b"
    assert json.loads(meta["annotations"][fence.DEVICES_ANNOTATION]) == [list(D)]
    assert body["spec"]["devices"]["requests"] == [
        {
            "name": "fence",
            "exactly": {
                "deviceClassName": fence.DEVICE_CLASS,
                "allocationMode": "ExactCount",
                "count": 1,
            },
        }
    ]
    assert fence.is_fence(body) and fence.fence_devices(body) == [D]
    two = fence.new_fence(FNS, [E, D, D], "ns/b")
    assert two["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    assert two["metadata"]["name"] not in (fence.fence_name(D), fence.fence_name(E))
    with pytest.raises(ValueError):
        fence.new_fence(FNS, [], "ns/b")

    result = fence.fence_allocation([D], SELECTOR, "2026-01-01T00:00:00Z")
    assert result == {
        "devices": {
            "results": [{"request": "fence", "driver": D[0], "pool": D[1], "device": D[2]}]
        },
        "nodeSelector": SELECTOR,
        "allocationTimestamp": "2026-01-01T00:00:00Z",
    }
    assert "nodeSelector" not in fence.fence_allocation([D], None, "t")


def test_fence_devices_fall_back_to_the_allocation() -> None:
    body = fence.new_fence(FNS, [D], "ns/b")
    del body["metadata"]["annotations"][fence.DEVICES_ANNOTATION]
    assert fence.fence_devices(body) == []
    body["status"] = {"allocation": fence.fence_allocation([D], None, "t")}
    assert fence.fence_devices(body) == [D]
    body["metadata"]["annotations"][fence.DEVICES_ANNOTATION] = "not json"
    assert fence.fence_devices(body) == [D]
    assert not fence.is_fence(claim("c")) and not fence.is_fence(None)


def test_only_exclusive_devices_count() -> None:
    shared = allocation(D)
    shared["devices"]["results"].append(
        {"request": "r", "driver": E[0], "pool": E[1], "device": E[2], "shareID": "s"}
    )
    shared["devices"]["results"].append(
        {"request": "r", "driver": "x", "pool": "p", "device": "d", "adminAccess": True}
    )
    assert fence.exclusive(shared) == [D]
    assert fence.exclusive(None) == []


def test_removed_devices_is_set_to_nil_or_deletion() -> None:
    allocated, empty = claim("c", D), claim("c")
    assert fence.removed_devices(allocated, empty) == [D]
    assert fence.removed_devices(allocated, None) == [D]  # deleted
    assert fence.removed_devices(None, allocated) == []  # added
    assert fence.removed_devices(empty, allocated) == []
    assert fence.removed_devices(allocated, allocated) == []
    assert fence.removed_devices(empty, None) == []


def test_real_holders_leave_fences_out() -> None:
    state = AllocatedState()
    state.add("ns/b", allocation(D))
    state.add(fence.fence_key(FNS, D), allocation(D))
    assert fence.real_holders(D, state, is_fence_key) == ["ns/b"]
    assert fence.real_holders(E, state, is_fence_key) == []


def stored_fence(rv: int, allocated: bool = True, deleting: bool = False) -> Obj:
    body = fence.new_fence(FNS, [D], "ns/b")
    body["metadata"]["resourceVersion"] = str(rv)
    if deleting:
        body["metadata"]["deletionTimestamp"] = "now"
    if allocated:
        body["status"] = {"allocation": fence.fence_allocation([D], None, "t")}
    return body


@pytest.mark.parametrize(
    ("fence_obj", "holders", "mark", "action"),
    [
        (None, [], 0, fence.Action.NONE),
        (None, [], 7, fence.Action.NONE),  # nobody holds it: the scheduler forgetting is right
        (None, ["ns/b"], 0, fence.Action.NONE),  # no removal seen: the set is right
        (None, ["ns/b"], 7, fence.Action.CREATE),
        (stored_fence(5), [], 0, fence.Action.DELETE),
        (stored_fence(5), [], 9, fence.Action.DELETE),
        (stored_fence(5, allocated=False), [], 0, fence.Action.DELETE),
        (stored_fence(5, allocated=False), ["ns/b"], 0, fence.Action.ALLOCATE),
        (stored_fence(5), ["ns/c"], 0, fence.Action.NONE),  # another claim took it: kept
        (stored_fence(9), ["ns/b"], 7, fence.Action.NONE),  # allocated after the removal
        (stored_fence(5), ["ns/b"], 7, fence.Action.PULSE),  # allocated before it
        (stored_fence(5, deleting=True), ["ns/b"], 7, fence.Action.NONE),
    ],
)
def test_decide(fence_obj: Obj | None, holders: list[str], mark: int, action: fence.Action) -> None:
    assert fence.decide(fence_obj, holders, mark).action is action


def test_marks() -> None:
    marks = fence.Marks()
    assert marks.get(D) == 0 and D not in marks
    marks.mark(D, 10)
    marks.mark(D, 4)
    assert marks.get(D) == 10 and len(marks) == 1
    marks.satisfied(D, 9)
    assert D in marks
    marks.satisfied(D, 11)
    assert D not in marks
    marks.mark(D, 3)
    marks.forget(D)
    assert D not in marks


# --- the reconciler's fence writes ---------------------------------------------------------


def claim_writes(api: FakeAPIServer, since: int = 0) -> list[tuple[str, str]]:
    """The writes to ResourceClaims after the first ``since`` writes, as (what, key).

    ``what`` is create, allocate or clear (``status.allocation`` written or cleared),
    patch (metadata) or delete; writes of Events are left out.
    """
    out: list[tuple[str, str]] = []
    for write in api.history[since:]:
        _, sep, rest = write.path.partition("/resourceclaims")
        if not sep:
            continue
        namespace = write.path.split("/namespaces/")[1].split("/")[0]
        body = write.body if isinstance(write.body, dict) else {}
        name = rest.strip("/").split("/")[0] or body["metadata"]["name"]
        if write.method == "POST":
            what = "create"
        elif write.method == "DELETE":
            what = "delete"
        elif rest.endswith("/status"):
            what = "allocate" if (body.get("status") or {}).get("allocation") else "clear"
        else:
            what = "patch"
        out.append((what, f"{namespace}/{name}"))
    return out


def path_of(key: str) -> str:
    namespace, _, name = key.partition("/")
    return path_for(RESOURCE_V1, "resourceclaims", namespace, name)


class Rig:
    """A ClaimReconciler over the fake apiserver, with the claims informer played by hand."""

    def __init__(self, namespaces: tuple[str, ...] = (), removal_quiet: float = 2.0) -> None:
        self.api = FakeAPIServer()
        self.claims = FakeInformer()
        other = FakeInformer()
        self.enqueued: list[str] = []
        context = ClaimContext.create(
            cast(Any, self.api),
            "dradriver.dev",
            cast(Any, self.claims),
            scheduler=SchedulerActivity(None, removal_quiet=removal_quiet),
            enqueue=self.enqueued.append,
            namespaces=namespaces,
            allocation_drivers=[D[0]],
        )
        self.rec = ClaimReconciler(
            context,
            ClaimSources(
                cast(Any, other),
                cast(Any, FakeInformer()),
                cast(Any, FakeInformer()),
                cast(Any, other),
            ),
            ClaimSettings(fence_namespace=FNS),
        )

    def store(self, obj: Obj) -> Obj:
        """Written to the API server and seen by the informer."""
        meta = obj["metadata"]
        written = self.api.put(path_of(f"{meta['namespace']}/{meta['name']}"), obj)
        self.claims.apply(written)
        return written

    def drop(self, key: str) -> None:
        """Deleted from the API server (by someone else; the informer has not seen it)."""
        asyncio.run(self.api.delete(path_of(key)))

    def sync(self, key: str) -> None:
        """The informer catches up with the API server for ``key``."""
        obj = self.api.stored(path_of(key))
        if obj is not None:
            self.claims.apply(obj)
        elif key in self.claims.cache:
            self.claims.remove(self.claims.cache[key], self.api.resource_version)

    def fence(self) -> Obj | None:
        return self.api.stored(path_of(fence.fence_key(FNS, D)))


def test_conflict_holds_our_claim_and_the_device_is_fenced_when_the_other_goes() -> None:
    rig = Rig(removal_quiet=0)  # no scheduler to wait for in this test
    mine = claim("a", D, ours=True)
    mine["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: "Immediate"}
    ours = rig.store(mine)
    rig.store(claim("b", D))  # the scheduler's claim took D too
    assert "ns/a" in rig.enqueued  # the conflict re-enqueues our claim

    # Held, not cleared: clearing while ns/b holds D would make the scheduler forget D.
    with pytest.raises(RequeueAfter):
        asyncio.run(rig.rec.conflicts.check("ns/a", ours, ours["status"]["allocation"]))
    assert claim_writes(rig.api) == [("patch", "ns/a")]
    held = rig.api.stored(path_of("ns/a"))
    assert held is not None
    assert "ns/b" in held["metadata"]["annotations"][CONFLICT_ANNOTATION]
    assert held["status"]["allocation"] == ours["status"]["allocation"]
    assert rig.rec.stats.held == 1 and rig.rec.stats.yielded == 0
    rig.sync("ns/a")

    # The scheduler's claim goes while ours still holds D: D is fenced for the scheduler.
    rig.drop("ns/b")
    rig.sync("ns/b")
    fk = fence.fence_key(FNS, D)
    assert fk in rig.enqueued
    before = len(rig.api.history)
    asyncio.run(rig.rec(fk))
    assert claim_writes(rig.api, before) == [("create", fk), ("allocate", fk)]
    fence_obj = rig.fence()
    assert fence_obj is not None and fence.allocated(fence_obj)
    assert fence_obj["metadata"]["annotations"][fence.HOLDER_ANNOTATION] == "ns/a"
    rig.sync(fk)

    # Ours is now the only real holder: given back (marker first), then allocated again;
    # the fence goes with the last real holder.
    before = len(rig.api.history)
    with pytest.raises(RequeueAfter):
        asyncio.run(rig.rec("ns/a"))
    assert claim_writes(rig.api, before) == [("patch", "ns/a"), ("clear", "ns/a")]
    assert fk in rig.enqueued and rig.rec.stats.yielded == 1
    rig.sync("ns/a")
    asyncio.run(rig.rec(fk))
    assert rig.fence() is None and rig.rec.stats.fences_deleted == 1


def test_a_held_claim_a_pod_reserved_stays_held_then_keeps_its_device() -> None:
    """The scheduler reserved our held claim for a pod that names it (it does not read our
    annotation): the node refuses to prepare it while the other claim holds the device.
    It is neither released nor cleared then (a clear is a removal while the device is
    shared); once the device is ours alone, the hold is lifted and the pod can use it."""
    rig = Rig(removal_quiet=0)
    rig.store(claim("b", D))
    a = claim("a", D, ours=True)
    a["metadata"]["annotations"] = {
        CONFLICT_ANNOTATION: "gpu.example.com/node-1/dev-0 also allocated to claim ns/b",
        STATUS_ANNOTATION: "held unused",
        ALLOCATION_ANNOTATION: "Immediate",
    }
    a["status"]["reservedFor"] = [{"resource": "pods", "name": "user", "uid": "pod-uid"}]
    rig.store(a)
    before = len(rig.api.history)
    with pytest.raises(RequeueAfter, match="in use"):
        asyncio.run(rig.rec("ns/a"))
    assert claim_writes(rig.api, before) == []  # still held, still allocated

    rig.drop("ns/b")
    rig.sync("ns/b")
    before = len(rig.api.history)
    asyncio.run(rig.rec("ns/a"))
    assert claim_writes(rig.api, before) == [("patch", "ns/a")]  # no clear
    lifted = rig.api.stored(path_of("ns/a"))
    assert lifted is not None
    annotations = lifted["metadata"].get("annotations") or {}
    assert CONFLICT_ANNOTATION not in annotations and STATUS_ANNOTATION not in annotations
    assert lifted["status"]["allocation"] == a["status"]["allocation"]
    assert rig.rec.stats.yielded == 0


def test_a_held_claim_waits_for_a_quiet_scheduler() -> None:
    rig = Rig(removal_quiet=60.0)
    rig.store(claim("b", D))
    rig.drop("ns/b")
    rig.sync("ns/b")  # a removal just now
    a = claim("a", D, ours=True)
    a["metadata"]["annotations"] = {CONFLICT_ANNOTATION: "x", ALLOCATION_ANNOTATION: "Immediate"}
    rig.store(a)
    before = len(rig.api.history)
    with pytest.raises(RequeueAfter, match="quiet"):
        asyncio.run(rig.rec("ns/a"))
    assert rig.api.history[before:] == []


def test_fence_is_kept_while_another_claim_holds_the_device() -> None:
    rig = Rig()
    rig.store(claim("b", D))
    rig.store(stored_fence(0))
    fk = fence.fence_key(FNS, D)
    rig.drop("ns/b")
    rig.sync("ns/b")
    rig.store(claim("c", D))  # took D before the fence was reconciled
    asyncio.run(rig.rec(fk))
    assert rig.fence() is not None and rig.rec.stats.fences_deleted == 0


def test_our_claim_with_only_a_fence_on_its_device_keeps_it() -> None:
    rig = Rig()
    rig.store(stored_fence(0))
    rig.store(claim("a", D, ours=True))
    before = len(rig.api.history)
    asyncio.run(rig.rec.conflicts.check("ns/a", rig.claims.cache["ns/a"], allocation(D)))
    assert rig.api.history[before:] == [] and rig.rec.stats.yielded == 0


def test_a_removal_after_the_fence_pulses_it() -> None:
    """Two real holders left after an older fence: one goes, so the fence is re-added."""
    rig = Rig()
    fenced = rig.store(stored_fence(0))
    rig.store(claim("b", D))
    rig.store(claim("c", D))
    rig.drop("ns/c")
    rig.sync("ns/c")  # removal at a resourceVersion after the fence's allocation
    fk = fence.fence_key(FNS, D)
    assert fk in rig.enqueued
    before = len(rig.api.history)
    asyncio.run(rig.rec(fk))
    assert claim_writes(rig.api, before) == [("clear", fk), ("allocate", fk)]
    now = rig.fence()
    assert now is not None and revision(now) > revision(fenced)
    rig.sync(fk)
    before = len(rig.api.history)
    asyncio.run(rig.rec(fk))  # level-based: done
    assert rig.api.history[before:] == []


def test_a_deleted_fence_comes_back_while_the_device_is_held() -> None:
    rig = Rig()
    rig.store(claim("b", D))
    rig.store(stored_fence(0))
    fk = fence.fence_key(FNS, D)
    rig.drop(fk)  # e.g. our own delete racing with a new holder, or kubectl
    rig.sync(fk)
    assert fk in rig.enqueued
    asyncio.run(rig.rec(fk))
    recreated = rig.fence()
    assert recreated is not None and fence.allocated(recreated)


def test_restart_finds_a_stale_fence_and_deletes_it() -> None:
    rig = Rig()
    rig.store(stored_fence(0))  # no claim holds D any more
    asyncio.run(rig.rec(fence.fence_key(FNS, D)))
    assert rig.fence() is None


def test_restart_allocates_a_pending_fence_while_the_device_is_held() -> None:
    rig = Rig()
    rig.store(claim("b", D))
    rig.store(stored_fence(0, allocated=False))  # created, then the controller died
    asyncio.run(rig.rec(fence.fence_key(FNS, D)))
    fenced = rig.fence()
    assert fenced is not None and fence.allocated(fenced)


def test_a_claim_named_like_a_fence_but_unlabelled_is_left_alone() -> None:
    rig = Rig()
    impostor = claim("x")
    impostor["metadata"].update({"namespace": FNS, "name": fence.fence_name(D)})
    rig.store(impostor)
    before = len(rig.api.history)
    asyncio.run(rig.rec(fence.fence_key(FNS, D)))
    assert rig.api.history[before:] == []


def test_out_of_scope_holders_are_left_to_their_controller() -> None:
    """With --allocation-namespace, only fences guarding claims there are managed."""
    rig = Rig(namespaces=("elsewhere",))
    ours = rig.store(claim("a", D, ours=True))
    rig.store(claim("b", D))
    before = len(rig.api.history)
    with pytest.raises(RequeueAfter):
        asyncio.run(rig.rec.conflicts.check("ns/a", ours, ours["status"]["allocation"]))
    assert claim_writes(rig.api, before) == [("patch", "ns/a")]  # held; no fence for ns/b
    rig.sync("ns/a")
    rig.drop("ns/b")
    rig.sync("ns/b")
    assert fence.fence_key(FNS, D) not in rig.enqueued
    assert rig.fence() is None
