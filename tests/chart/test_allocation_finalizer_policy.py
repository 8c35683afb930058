"""The chart's allocation-finalizer MutatingAdmissionPolicy, rendered by helm and evaluated
by the policy fake (tests/fakes/policies.py) without a cluster: it marks an immediate claim
only when every request names one of the driver's classes the chart knows
(tests/cluster/test_controller_scope.py runs it on the real apiserver)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.api.wellknown import ALLOCATION_ANNOTATION, FINALIZER, IMMEDIATE
from dradriver.k8s.objects import Obj
from tests.chart.test_chart import MAP_API, one, render
from tests.fakes.admission import Decision
from tests.fakes.policies import admission_request, decide, mutate

DRIVER = "dradriver.dev"
OTHER = "gpu.other-vendor.example.com"


def policy(helm: Path, *sets: str) -> Obj:
    args = [a for s in sets for a in ("--set", s)]
    return one(render(helm, "--api-versions", MAP_API, *args), "MutatingAdmissionPolicy")


def claim(*requests: Obj, immediate: bool = True, finalizers: list[str] | None = None) -> Obj:
    meta: Obj = {"name": "c", "namespace": "ns"}
    if immediate:
        meta["annotations"] = {ALLOCATION_ANNOTATION: IMMEDIATE}
    if finalizers is not None:
        meta["finalizers"] = finalizers
    return {"metadata": meta, "spec": {"devices": {"requests": list(requests)}}}


def exactly(class_name: str, name: str = "r") -> Obj:
    return {"name": name, "exactly": {"deviceClassName": class_name}}


def first_available(*classes: str) -> Obj:
    subs = [{"name": f"s{i}", "deviceClassName": c} for i, c in enumerate(classes)]
    return {"name": "f", "firstAvailable": subs}


def created(policy: Obj, obj: Obj) -> Obj | None:
    return mutate(policy, admission_request("CREATE", obj))


@pytest.mark.parametrize(
    "requests",
    [
        [exactly(DRIVER)],
        [exactly(f"{DRIVER}-mock-extended-resource")],
        [exactly(DRIVER, "a"), first_available(DRIVER, f"{DRIVER}-mock-extended-resource")],
    ],
)
def test_claims_of_the_drivers_classes_get_the_finalizer(helm: Path, requests: list[Obj]) -> None:
    marked = created(policy(helm), claim(*requests))
    assert marked is not None and marked["metadata"]["finalizers"] == [FINALIZER]
    after_others = created(policy(helm), claim(*requests, finalizers=["example.com/keep"]))
    assert after_others is not None
    assert after_others["metadata"]["finalizers"] == ["example.com/keep", FINALIZER]


@pytest.mark.parametrize(
    "obj",
    [
        claim(exactly(OTHER)),  # the finding: another vendor's class
        claim(exactly(DRIVER, "a"), exactly(OTHER, "b")),  # one request is enough
        claim(first_available(DRIVER, OTHER)),  # one subrequest too
        claim(exactly("fabric-a")),  # a class the chart does not know
        claim(),  # no request names any class
        claim({"name": "r", "exactly": {}}),
        claim(exactly(DRIVER), immediate=False),
        claim(exactly(DRIVER), finalizers=[FINALIZER]),
    ],
)
def test_other_claims_are_left_as_they_are(helm: Path, obj: Obj) -> None:
    assert decide(policy(helm), admission_request("CREATE", obj)) is Decision.SKIP
    assert created(policy(helm), obj) is None


def test_without_the_class_condition_another_drivers_claim_would_be_marked(helm: Path) -> None:
    """What the condition prevents (so the test above cannot pass by accident)."""
    unguarded = policy(helm)
    unguarded["spec"]["matchConditions"] = [
        c
        for c in unguarded["spec"]["matchConditions"]
        if c["name"] != "names-only-this-drivers-classes"
    ]
    assert created(unguarded, claim(exactly(OTHER))) is not None


def test_classes_named_in_the_values_are_marked_too(helm: Path) -> None:
    listed = policy(helm, "controller.allocationDeviceClasses={fabric-a,fabric-b}")
    marked = created(listed, claim(exactly("fabric-a"), first_available("fabric-b", DRIVER)))
    assert marked is not None and marked["metadata"]["finalizers"] == [FINALIZER]
    assert created(listed, claim(exactly(OTHER))) is None


def test_the_classes_follow_the_driver_name(helm: Path) -> None:
    renamed = policy(helm, "driverName=gpu.example.org")
    assert created(renamed, claim(exactly("gpu.example.org"))) is not None
    assert created(renamed, claim(exactly(DRIVER))) is None
