"""Which claims are the controller's (controller/claims/scope.py) and which driver a class
selector pins (dradriver/cel/pins.py): pure, no cluster."""

from __future__ import annotations

import pytest

from controller.claims import scope
from controller.claims.scope import Drivers, claim_scope, class_driver
from dradriver.api.wellknown import FINALIZER
from dradriver.cel.pins import pinned_driver
from dradriver.k8s.objects import Obj

OURS = "dradriver.dev"
OTHER = "gpu.other-vendor.example.com"
DRIVERS = Drivers(OURS)


def cls(name: str, *expressions: str) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }


CLASSES = {
    c["metadata"]["name"]: c
    for c in (
        cls(
            OURS,
            f'device.driver == "{OURS}" && !("extendedResource" in device.attributes["{OURS}"])',
        ),
        cls(
            "fabric-a", f'device.driver == "{OURS}"', 'device.attributes["dradriver.dev"].k == "a"'
        ),
        cls("gpu", f'device.driver == "{OTHER}"'),
        # Named like ours, pins another driver: the name does not count.
        cls(f"{OURS}-lookalike", f'device.driver == "{OTHER}"'),
        cls("or-true", f'device.driver == "{OURS}" || true'),
        cls("attribute-only", 'device.attributes["dradriver.dev"].model == "m"'),
        cls("everything"),
    )
}


def lookup(name: str) -> Obj | None:
    return CLASSES.get(name)


def claim(*requests: Obj) -> Obj:
    return {
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": list(requests)}},
    }


def exactly(name: str, class_name: str) -> Obj:
    return {"name": name, "exactly": {"deviceClassName": class_name}}


def first_available(name: str, *classes: str) -> Obj:
    return {
        "name": name,
        "firstAvailable": [{"name": f"s{i}", "deviceClassName": c} for i, c in enumerate(classes)],
    }


@pytest.mark.parametrize(
    ("expression", "driver"),
    [
        (f'device.driver == "{OURS}"', OURS),
        (f'"{OURS}" == device.driver', OURS),
        (f'device["driver"] == "{OURS}"', OURS),
        (f'(device.driver == "{OURS}") && device.attributes["{OURS}"].x == 1 && true', OURS),
        (f'true && (1 == 1 && device.driver == "{OURS}")', OURS),
        (f'device.driver == "{OURS}" || true', None),
        (f'!(device.driver == "{OURS}")', None),
        (f'device.driver != "{OTHER}"', None),
        (f'device.driver == "{OURS}" ? true : true', None),
        (f'[1].all(device, device.driver == "{OURS}")', None),
        (f'device.driver == "{OURS}" && device.driver == "{OTHER}"', None),  # matches nothing
        (f'device.driver.startsWith("{OURS}")', None),
        ('device.attributes["dradriver.dev"].model == "m"', None),
        ("this is not CEL", None),
    ],
)
def test_a_selector_pins_a_driver_only_as_a_top_level_conjunct(
    expression: str, driver: str | None
) -> None:
    assert pinned_driver(expression) == driver


def test_a_class_is_the_drivers_when_any_of_its_selectors_pins_it() -> None:
    assert class_driver(CLASSES["fabric-a"]) == OURS
    assert (
        class_driver(cls("x", 'device.attributes["a"].b == 1', f'device.driver == "{OURS}"'))
        == OURS
    )
    assert class_driver(CLASSES[f"{OURS}-lookalike"]) == OTHER
    assert class_driver(CLASSES["everything"]) is None
    assert class_driver({"metadata": {"name": "odd"}, "spec": {"selectors": [{"cel": {}}]}}) is None


def test_every_request_and_subrequest_naming_our_classes_is_ours() -> None:
    verdict = claim_scope(
        claim(exactly("a", OURS), first_available("b", "fabric-a", OURS)), DRIVERS, lookup
    )
    assert verdict == scope.Scope(True)


@pytest.mark.parametrize(
    ("requests", "where", "class_name", "detail"),
    [
        ([exactly("g", "gpu")], "g", "gpu", f'it pins driver "{OTHER}"'),
        ([exactly("a", OURS), exactly("g", "gpu")], "g", "gpu", "pins driver"),
        ([first_available("b", OURS, "gpu")], "b/s1", "gpu", "pins driver"),
        ([exactly("l", f"{OURS}-lookalike")], "l", f"{OURS}-lookalike", "pins driver"),
        ([exactly("o", "or-true")], "o", "or-true", "it pins no driver"),
        ([exactly("m", "attribute-only")], "m", "attribute-only", "it pins no driver"),
        ([exactly("e", "everything")], "e", "everything", "it pins no driver"),
        ([exactly("x", "missing")], "x", "missing", "does not exist"),
    ],
)
def test_one_request_of_another_class_makes_the_claim_not_ours(
    requests: list[Obj], where: str, class_name: str, detail: str
) -> None:
    verdict = claim_scope(claim(*requests), DRIVERS, lookup)
    assert not verdict.ours
    assert f'request "{where}" names' in verdict.why and f'"{class_name}"' in verdict.why
    assert detail in verdict.why
    # What to do is said too.
    assert "remove the annotation dradriver.dev/allocation: Immediate" in verdict.why


def test_a_claim_without_requests_or_class_names_is_not_ours() -> None:
    assert "no requests" in claim_scope(claim(), DRIVERS, lookup).why
    nameless = claim({"name": "r", "exactly": {}})
    assert 'request "r" names no DeviceClass' in claim_scope(nameless, DRIVERS, lookup).why


def test_extra_drivers_match_exactly_or_under_a_suffix() -> None:
    drivers = Drivers(OURS, ("*.test.dradriver.dev", "exact.example.com"))
    assert drivers.covers(OURS) and drivers.covers("ca-1.test.dradriver.dev")
    assert drivers.covers("exact.example.com")
    assert not drivers.covers("test.dradriver.dev")  # the suffix alone is no subdomain
    assert not drivers.covers("evil-test.dradriver.dev")
    assert not drivers.covers("sub.exact.example.com") and not Drivers(OURS).covers(OTHER)


def test_foreign_results_and_a_claim_we_allocated() -> None:
    ours = {"request": "r", "driver": OURS, "pool": "p", "device": "d0"}
    theirs = {"request": "r", "driver": OTHER, "pool": "p", "device": "g0"}
    allocation = {"devices": {"results": [ours, theirs]}}
    assert scope.foreign_results(allocation, DRIVERS) == [f"{OTHER}/p/g0"]
    made: Obj = claim(exactly("a", "gpu"))
    made["metadata"]["finalizers"] = [FINALIZER]
    made["status"] = {"allocation": {"devices": {"results": [ours]}}}
    assert scope.allocated_by_us(made, DRIVERS)
    made["status"]["allocation"]["devices"]["results"].append(theirs)
    assert not scope.allocated_by_us(made, DRIVERS)
    made["metadata"]["finalizers"] = []
    made["status"]["allocation"]["devices"]["results"] = [ours]
    assert not scope.allocated_by_us(made, DRIVERS)
