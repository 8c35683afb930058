"""Removal waves (controller/claims/scheduler.py): once the scheduler is quiet, every ready
claim lets go of its devices, not one per quiet period; the conditions that keep a removal
from meeting a scheduling cycle still hold at every removal of the wave."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from controller.claims.context import ClaimContext, ClaimSources
from controller.claims.reconciler import ClaimReconciler
from controller.claims.scheduler import SchedulerActivity
from dradriver.api.wellknown import FINALIZER
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import RequeueAfter
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer

QUIET = 60.0  # long enough that only a wave lets a second removal through in a test


def pod_with_claims(name: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "spec": {"resourceClaims": [{"name": "r", "resourceClaimName": "c"}]},
    }


def test_a_wave_lets_every_removal_through_while_it_is_open() -> None:
    activity = SchedulerActivity(None, removal_quiet=QUIET, removal_window=5.0)
    assert activity.quiet() == (True, "")  # nothing freed yet: the wave opens
    for _ in range(10):
        activity.removal_seen()
        assert activity.quiet() == (True, "")


def test_after_the_window_the_next_wave_waits_for_the_quiet_period() -> None:
    activity = SchedulerActivity(None, removal_quiet=QUIET, removal_window=5.0)
    assert activity.quiet()[0]
    activity.removal_seen()
    activity.wave_opened -= 5.0  # the window has passed
    quiet, why = activity.quiet()
    assert not quiet and "freed" in why


def test_pod_activity_closes_the_wave() -> None:
    pods = FakeInformer()
    activity = SchedulerActivity(
        cast(Any, pods), quiet_period=0.3, removal_quiet=QUIET, removal_window=5.0
    )
    assert activity.quiet()[0]
    activity.removal_seen()
    pods.apply(pod_with_claims("p"))  # the scheduler has a pod to look at
    pods.apply({**pod_with_claims("p"), "spec": {**pod_with_claims("p")["spec"], "nodeName": "n"}})
    assert not activity.quiet()[0]  # busy: a pod with claims changed just now
    activity.last_pod_activity -= 1.0  # past the pod quiet period, the wave stays closed
    quiet, why = activity.quiet()
    assert not quiet and "freed" in why


def test_a_claim_allocated_just_now_waits_even_in_a_wave() -> None:
    activity = SchedulerActivity(None, removal_quiet=QUIET, removal_window=5.0)
    assert activity.quiet(time.monotonic() - 2 * QUIET)[0]
    quiet, why = activity.quiet(time.monotonic())
    assert not quiet and "allocated" in why


def deleted_claim(name: str, device: str) -> Obj:
    result = {"request": "r", "driver": "d", "pool": "p", "device": device}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": "1",
            "finalizers": [FINALIZER],
            "deletionTimestamp": "2026-12-01T00:00:00Z",
        },
        "spec": {},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def claim_path(name: str) -> str:
    return path_for(RESOURCE_V1, "resourceclaims", "ns", name)


def test_deleted_claims_are_all_deallocated_in_one_wave() -> None:
    """Twenty deleted claims of ours, allocated long ago: all are cleared and released one
    after the other, although each removal is within the quiet period of the last."""
    api = FakeAPIServer()
    claims = FakeInformer()
    rec = ClaimReconciler(
        ClaimContext.create(
            cast(Any, api),
            "dradriver.dev",
            cast(Any, claims),
            scheduler=SchedulerActivity(None, removal_quiet=QUIET),
            allocation_drivers=["d"],
        ),
        ClaimSources(*(cast(Any, FakeInformer()) for _ in range(4))),
    )
    names = [f"c-{i}" for i in range(20)]
    for i, name in enumerate(names):
        claims.apply(api.put(claim_path(name), deleted_claim(name, f"dev-{i}")))
        rec.holdings.seen_at[f"ns/{name}"] -= 2 * QUIET  # allocated long ago
    for name in names:
        asyncio.run(rec(f"ns/{name}"))
    assert rec.stats.deallocated == len(names)
    for name in names:
        stored = api.stored(claim_path(name))
        assert stored is None or not (stored.get("status") or {}).get("allocation")


def test_a_claim_allocated_just_now_is_not_cleared_in_the_wave() -> None:
    api = FakeAPIServer()
    claims = FakeInformer()
    rec = ClaimReconciler(
        ClaimContext.create(
            cast(Any, api),
            "dradriver.dev",
            cast(Any, claims),
            scheduler=SchedulerActivity(None, removal_quiet=QUIET),
            allocation_drivers=["d"],
        ),
        ClaimSources(*(cast(Any, FakeInformer()) for _ in range(4))),
    )
    claims.apply(api.put(claim_path("old"), deleted_claim("old", "dev-0")))
    rec.holdings.seen_at["ns/old"] -= 2 * QUIET
    claims.apply(api.put(claim_path("new"), deleted_claim("new", "dev-1")))  # seen just now
    asyncio.run(rec("ns/old"))
    with pytest.raises(RequeueAfter, match="allocated"):
        asyncio.run(rec("ns/new"))
    assert rec.stats.deallocated == 1


def test_a_claim_with_only_our_finalizer_is_freed_by_its_deletion_in_one_write() -> None:
    """Removing the last finalizer deletes the claim, which the scheduler applies as the
    removal; a claim with another finalizer is cleared first (it is not deleted yet)."""
    api = FakeAPIServer()
    claims = FakeInformer()
    rec = ClaimReconciler(
        ClaimContext.create(
            cast(Any, api),
            "dradriver.dev",
            cast(Any, claims),
            scheduler=SchedulerActivity(None, removal_quiet=0),
            allocation_drivers=["d"],
        ),
        ClaimSources(*(cast(Any, FakeInformer()) for _ in range(4))),
    )
    claims.apply(api.put(claim_path("only"), deleted_claim("only", "dev-0")))
    shared = deleted_claim("shared", "dev-1")
    shared["metadata"]["finalizers"] = ["example.com/other", FINALIZER]
    claims.apply(api.put(claim_path("shared"), shared))
    before = len(api.history)
    asyncio.run(rec("ns/only"))
    assert [(w.method, w.path) for w in api.history[before:]] == [("PATCH", claim_path("only"))]
    assert api.stored(claim_path("only")) is None
    before = len(api.history)
    asyncio.run(rec("ns/shared"))
    writes = [(w.method, w.path) for w in api.history[before:]]
    assert writes == [
        ("PATCH", claim_path("shared") + "/status"),
        ("PATCH", claim_path("shared")),
    ]
    stored = api.stored(claim_path("shared"))
    assert stored is not None and not stored["status"].get("allocation")
    assert stored["metadata"]["finalizers"] == ["example.com/other"]
    assert rec.stats.deallocated == 2
