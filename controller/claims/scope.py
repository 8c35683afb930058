"""Which claims are this controller's to allocate, fence and finalize: its driver's.

Invariants (pure: resource.k8s.io/v1 JSON in, no I/O):

* A claim is ours (:func:`claim_scope`) only when it has at least one request and every
  request names one of our drivers' DeviceClasses: ``exactly.deviceClassName``, and for a
  ``firstAvailable`` request each subrequest's. One request of another class makes the
  whole claim not ours (an allocation is all or nothing).
* A DeviceClass is ours (:func:`class_driver`) when one of its selectors pins one of our
  drivers: its CEL is ``device.driver == "<driver>"`` or a top-level ``&&`` with that
  term (:func:`dradriver.cel.pins.pinned_driver`). A class's selectors must all hold, so
  every device such a class selects is ours, whatever its other selectors, its name or
  the attribute domains it reads; a class of another vendor cannot pass for ours, and a
  class that selects by anything else (names, attributes alone, ``||``) is not ours.
  NetworkDevicePools publish their devices under our driver name, so a class for them
  pins it like any other.
* Our drivers (:class:`Drivers`) are the controller's ``--driver-name`` and, only when
  given, ``--allocation-driver`` names (``*.suffix`` matches any name ending in
  ``.suffix``; test harnesses give each test a driver of its own this way).
* :func:`allocated_by_us` tells a claim that was ours (our finalizer, every result of its
  allocation from our drivers) from one we never touched: the first keeps its allocation
  and is deallocated on deletion even if its class changed since.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.api.wellknown import ALLOCATION_ANNOTATION, FINALIZER, IMMEDIATE
from dradriver.cel.pins import pinned_driver
from dradriver.k8s.objects import Obj, allocation_of, finalizers

ClassLookup = Callable[[str], Obj | None]
"""A DeviceClass by name (None: it does not exist)."""

REASON = "NotThisDriver"
"""The reason of the Warning event on a claim the controller leaves alone."""


@dataclass(frozen=True)
class Drivers:
    """The drivers whose classes make a claim ours: ``own`` and the ``extra`` patterns."""

    own: str
    extra: tuple[str, ...] = ()

    def covers(self, driver: str) -> bool:
        if driver == self.own:
            return True
        for pattern in self.extra:
            if pattern.startswith("*."):
                if driver.endswith(pattern[1:]) and len(driver) > len(pattern) - 1:
                    return True
            elif driver == pattern:
                return True
        return False

    def describe(self) -> str:
        return " or ".join([self.own, *self.extra])


@dataclass(frozen=True)
class Scope:
    """Whether a claim is ours; if not, ``why`` names the request and class, and the fix."""

    ours: bool
    why: str = ""


def class_driver(cls: Mapping[str, Any]) -> str | None:
    """The driver one of the class's selectors pins, or None."""
    for selector in (cls.get("spec") or {}).get("selectors") or []:
        expression = (selector.get("cel") or {}).get("expression")
        if isinstance(expression, str):
            driver = pinned_driver(expression)
            if driver is not None:
                return driver
    return None


def _class_names(request: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(request or request/subrequest name, class name) of one request."""
    name = str(request.get("name", ""))
    subs = request.get("firstAvailable")
    if subs:
        return [(f"{name}/{s.get('name', '')}", str(s.get("deviceClassName") or "")) for s in subs]
    exactly = request.get("exactly") or {}
    return [(name, str(exactly.get("deviceClassName") or ""))]


def _fix(drivers: Drivers) -> str:
    return (
        f"dradriver-controller allocates only claims whose every request names a "
        f'DeviceClass of {drivers.describe()} (a selector device.driver == "{drivers.own}"), '
        f"so it leaves this claim alone: remove the annotation {ALLOCATION_ANNOTATION}: "
        f"{IMMEDIATE} (kube-scheduler allocates the claim for a pod that uses it) or name "
        f"such a class"
    )


def claim_scope(claim: Mapping[str, Any], drivers: Drivers, lookup: ClassLookup) -> Scope:
    """Whether every request of ``claim`` names one of our drivers' classes."""
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    if not requests:
        return Scope(False, f"the claim has no requests; {_fix(drivers)}")
    for request in requests:
        for where, class_name in _class_names(request):
            if not class_name:
                return Scope(False, f'request "{where}" names no DeviceClass; {_fix(drivers)}')
            cls = lookup(class_name)
            if cls is None:
                return Scope(
                    False,
                    f'request "{where}" names DeviceClass "{class_name}", which does not '
                    f"exist (looked at again when it is created); {_fix(drivers)}",
                )
            driver = class_driver(cls)
            if driver is None or not drivers.covers(driver):
                pins = f'it pins driver "{driver}"' if driver else "it pins no driver"
                return Scope(
                    False,
                    f'request "{where}" names DeviceClass "{class_name}", which is not a '
                    f"class of {drivers.describe()} ({pins}); {_fix(drivers)}",
                )
    return Scope(True)


def foreign_results(allocation: Mapping[str, Any], drivers: Drivers) -> list[str]:
    """The results of ``allocation`` (``driver/pool/device``) of a driver not ours."""
    return [
        f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}"
        for r in (allocation.get("devices") or {}).get("results") or []
        if not drivers.covers(str(r.get("driver", "")))
    ]


def allocated_by_us(claim: Obj, drivers: Drivers) -> bool:
    """Whether ``claim`` carries our finalizer and an allocation of our drivers' devices
    only (one we made, or could have: its class may have changed since)."""
    allocation = allocation_of(claim)
    return (
        FINALIZER in finalizers(claim)
        and allocation is not None
        and not foreign_results(allocation, drivers)
    )
