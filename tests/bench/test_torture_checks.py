"""The torture bench's API checker (bench/torture_checks.py): a device in two claims'
allocations is one double from the version that made it to the version that undid it;
shared (adminAccess) results and claims on other devices are none."""

from __future__ import annotations

from typing import Any, cast

from bench.torture_checks import DoubleChecker, pod_claim_names
from dradriver.k8s.objects import Obj
from tests.fakes.informer import FakeInformer


def claim(name: str, *devices: str, admin: bool = False) -> Obj:
    results = [
        {"request": "r", "driver": "d", "pool": "p", "device": d, "adminAccess": admin}
        for d in devices
    ]
    status = {"allocation": {"devices": {"results": results}}} if devices else {}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}"}, "status": status}


def checked() -> tuple[DoubleChecker, FakeInformer]:
    informer = FakeInformer()
    checker = DoubleChecker()
    checker.attach(cast(Any, informer))
    return checker, informer


def test_a_device_in_two_allocations_is_one_double_until_one_lets_go() -> None:
    checker, informer = checked()
    informer.apply(claim("a", "dev-0"))
    informer.apply(claim("b", "dev-1"))
    assert checker.doubles == []
    informer.apply(claim("c", "dev-0"))
    assert len(checker.doubles) == 1 and checker.doubles[0].ended is None
    assert checker.doubles[0].device == ("d", "p", "dev-0")
    informer.apply(claim("c"))  # cleared
    assert checker.doubles[0].ended is not None and not checker.open
    informer.apply(claim("b", "dev-0"))  # another pair: another double
    informer.remove(claim("a"))
    assert len(checker.doubles) == 2 and not checker.open
    assert checker.longest() >= 0


def test_shared_results_are_no_double() -> None:
    checker, informer = checked()
    informer.apply(claim("a", "dev-0", admin=True))
    informer.apply(claim("b", "dev-0"))
    assert checker.doubles == []


def test_a_pod_uses_its_named_and_its_generated_claims() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "x", "resourceClaimName": "mine"},
                {"name": "y", "resourceClaimTemplateName": "t"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "y", "resourceClaimName": "pod-y-abc"}]},
    }
    assert pod_claim_names(pod) == ["mine", "pod-y-abc"]
    del pod["status"]
    assert pod_claim_names(pod) == []  # not generated yet: nothing to prepare
