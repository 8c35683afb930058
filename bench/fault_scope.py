"""Fault (f1) of :mod:`bench.faults`: immediate claims of another driver's class.

Issue 21, finding 1: 16 claims annotated ``dradriver.dev/allocation: Immediate`` whose
class pins another vendor's driver, no pod, took all 16 of that driver's devices. Here a
second driver publishes 16 devices (one ResourceSlice, every node) with a DeviceClass of
its own; as many annotated claims of that class are created, then one of ours. Once ours
is allocated and each of theirs has been answered (allocated by us, or our
``NotThisDriver`` event), the row counts what we did to theirs: devices allocated,
finalizers and status annotations put on them (all promised 0), and the events each got
(promised 1).
"""

from __future__ import annotations

import uuid

from devtools.cluster.api import AdminAPI
from devtools.cluster.wait import wait_until
from devtools.harness.controller import ControllerProcess
from dradriver.api.wellknown import ALLOCATION_ANNOTATION, FINALIZER, IMMEDIATE, STATUS_ANNOTATION
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for

R = RESOURCE_V1
OURS = "dradriver.dev"  # the suite's controller runs with the default driver name
DEVICES = 16
REASON = "NotThisDriver"  # controller/claims/scope.py (the bench imports no application)
DEADLINE = 120.0

ScopeRow = tuple[str, int, str, str, str]
"""(fault, runs, metric, value, promised): a row of bench.faults' table."""


def _class(name: str, expression: str) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def all_nodes_slice(name: str, driver: str, devices: list[Obj]) -> Obj:
    """A one-slice pool ``name`` of ``driver`` that every node reaches."""
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "allNodes": True,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _claim(name: str, class_name: str) -> Obj:
    return {
        "metadata": {"name": name, "annotations": {ALLOCATION_ANNOTATION: IMMEDIATE}},
        "spec": {
            "devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": class_name}}]}
        },
    }


def _events(api: AdminAPI, namespace: str, name: str) -> int:
    return sum(
        1
        for e in api.items(
            path_for("v1", "events", namespace),
            fieldSelector=f"involvedObject.name={name},involvedObject.kind=ResourceClaim",
        )
        if e.get("reason") == REASON
    )


def other_driver_claims(
    api: AdminAPI, namespace: str, controller: ControllerProcess
) -> list[ScopeRow]:
    """The (f1) rows; ``controller`` allocates in ``namespace`` (its process is watched)."""
    run = uuid.uuid4().hex[:6]
    other = f"gpu-{run}.other-vendor.example.com"
    other_class, our_class = f"other-{run}", f"scope-{run}"
    api.create(path_for(R, "deviceclasses"), _class(other_class, f'device.driver == "{other}"'))
    api.create(
        path_for(R, "deviceclasses"),
        _class(
            our_class, f'device.driver == "{OURS}" && device.attributes["{OURS}"].run == "{run}"'
        ),
    )
    api.create(
        path_for(R, "resourceslices"),
        all_nodes_slice(f"other-{run}", other, [{"name": f"gpu-{i}"} for i in range(DEVICES)]),
    )
    ours = [{"name": "dev-0", "attributes": {"run": {"string": run}}}]
    api.create(path_for(R, "resourceslices"), all_nodes_slice(f"scope-{run}", OURS, ours))
    names = [f"f1-{run}-{i:02d}" for i in range(DEVICES)]
    for name in names:
        api.create(path_for(R, "resourceclaims", namespace), _claim(name, other_class))
    mine = f"f1-{run}-ours"
    api.create(path_for(R, "resourceclaims", namespace), _claim(mine, our_class))

    def claim(name: str) -> Obj:
        return api.get(path_for(R, "resourceclaims", namespace, name))

    def allocated(obj: Obj) -> bool:
        return bool((obj.get("status") or {}).get("allocation"))

    watch = [controller.process] if controller.process is not None else []
    wait_until("our claim allocated", lambda: allocated(claim(mine)), DEADLINE, watch=watch)

    def answered() -> bool:
        return all(allocated(claim(n)) or _events(api, namespace, n) for n in names)

    wait_until("every claim of the other driver answered", answered, DEADLINE, watch=watch)
    got = [claim(n) for n in names]
    taken = sum(1 for c in got if allocated(c))
    marked = sum(1 for c in got if FINALIZER in (c["metadata"].get("finalizers") or []))
    annotated = sum(1 for c in got if STATUS_ANNOTATION in (c["metadata"].get("annotations") or {}))
    events = max(_events(api, namespace, n) for n in names)
    fault = f"(f1) {DEVICES} immediate claims of another driver's class"
    return [
        (fault, DEVICES, f"other driver's devices allocated by us (of {DEVICES})", str(taken), "0"),
        (fault, DEVICES, "other driver's claims given our finalizer", str(marked), "0"),
        (fault, DEVICES, "other driver's claims given our status annotation", str(annotated), "0"),
        (fault, DEVICES, f"{REASON} events per claim, most", str(events), "1"),
    ]
