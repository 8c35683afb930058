"""The controller's scope on the real cluster: with a second driver's ResourceSlices and
DeviceClass in the cluster, its annotated immediate claims are left alone (no allocation,
no finalizer from the controller or the chart's admission policy, one NotThisDriver
event each) while ours are allocated (issue 21, finding 1: 16 such claims took all 16 of
the other driver's devices).

Our class pins the controller's own driver (``dradriver.dev``) and an attribute only this
test's slice has, so no other test's devices are involved. The controller runs as in
tests/cluster/test_controller_allocation.py (the manifests' RBAC, this namespace only).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from functools import partial

import pytest

from bench.fault_scope import all_nodes_slice
from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness import finalizerpolicy
from devtools.harness.controller import namespaced_controller
from dradriver.api.wellknown import ALLOCATION_ANNOTATION, FINALIZER, IMMEDIATE, STATUS_ANNOTATION
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for

R = RESOURCE_V1
OURS = "dradriver.dev"
OTHER_DEVICES = 16
OUR_DEVICES = 2
DEADLINE = 60
REASON = "NotThisDriver"


class TwoDrivers:
    """Another vendor's driver (16 devices, a class pinning it) and ours (2 devices of
    dradriver.dev with this run's attribute, a class selecting exactly those)."""

    def __init__(self, api: AdminAPI, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        run = uuid.uuid4().hex[:8]
        self.run = run
        self.other = f"gpu-{run}.other-vendor.example.com"
        self.other_class = f"other-{run}"
        self.our_class = f"scope-{run}"

    def __enter__(self) -> TwoDrivers:
        classes = path_for(R, "deviceclasses")
        selector = f'device.driver == "{self.other}"'
        self.api.create(
            classes,
            {
                "metadata": {"name": self.other_class},
                "spec": {"selectors": [{"cel": {"expression": selector}}]},
            },
        )
        ours = f'device.driver == "{OURS}" && device.attributes["{OURS}"].run == "{self.run}"'
        self.api.create(
            classes,
            {
                "metadata": {"name": self.our_class},
                "spec": {"selectors": [{"cel": {"expression": ours}}]},
            },
        )
        slices = path_for(R, "resourceslices")
        gpus = [{"name": f"gpu-{i}"} for i in range(OTHER_DEVICES)]
        self.api.create(slices, all_nodes_slice(self.other_class, self.other, gpus))
        devs = [
            {"name": f"dev-{i}", "attributes": {"run": {"string": self.run}}}
            for i in range(OUR_DEVICES)
        ]
        self.api.create(slices, all_nodes_slice(self.our_class, OURS, devs))
        return self

    def __exit__(self, *exc: object) -> None:
        for name in (self.other_class, self.our_class):
            self.api.delete(path_for(R, "resourceslices", name=name))
            self.api.delete(path_for(R, "deviceclasses", name=name))

    def claim(self, name: str, class_name: str) -> Obj:
        return self.api.create(
            path_for(R, "resourceclaims", self.namespace),
            {
                "metadata": {"name": name, "annotations": {ALLOCATION_ANNOTATION: IMMEDIATE}},
                "spec": {
                    "devices": {
                        "requests": [{"name": "g", "exactly": {"deviceClassName": class_name}}]
                    }
                },
            },
        )

    def get(self, name: str) -> Obj:
        return self.api.get(path_for(R, "resourceclaims", self.namespace, name))

    def allocated(self, name: str) -> bool:
        return bool((self.get(name).get("status") or {}).get("allocation"))

    def events(self, name: str) -> list[Obj]:
        return [
            e
            for e in self.api.items(
                path_for("v1", "events", self.namespace),
                fieldSelector=f"involvedObject.name={name},involvedObject.kind=ResourceClaim",
            )
            if e.get("reason") == REASON
        ]

    def delete_claims(self) -> None:
        ns = self.namespace
        for claim in self.api.items(path_for(R, "resourceclaims", ns)):
            self.api.delete(path_for(R, "resourceclaims", ns, claim["metadata"]["name"]))
        wait_until(
            "claims gone", lambda: not self.api.items(path_for(R, "resourceclaims", ns)), DEADLINE
        )


@pytest.fixture
def drivers(api: AdminAPI, namespace: str) -> Iterator[TwoDrivers]:
    with TwoDrivers(api, namespace) as rig:
        yield rig


def test_claims_of_another_drivers_class_are_left_alone_while_ours_are_allocated(
    api: AdminAPI, local_cluster: LocalCluster, namespace: str, drivers: TwoDrivers
) -> None:
    policy = contextlib.ExitStack()
    served = finalizerpolicy.served(api)
    if served:  # the chart's policy as installed on 1.36+, knowing our class
        policy.enter_context(finalizerpolicy.installed(api, namespace, classes=[drivers.our_class]))
    with policy, namespaced_controller(api, local_cluster, namespace, "scope", DEADLINE):
        try:
            theirs = [f"theirs-{i:02d}" for i in range(OTHER_DEVICES)]
            for name in theirs:
                created = drivers.claim(name, drivers.other_class)
                # The policy does not mark another driver's claim as it is created.
                assert FINALIZER not in (created["metadata"].get("finalizers") or [])
            mine = [drivers.claim(f"mine-{i}", drivers.our_class) for i in range(OUR_DEVICES)]
            if served:
                assert all(FINALIZER in c["metadata"]["finalizers"] for c in mine)
            for claim in mine:
                name = claim["metadata"]["name"]
                wait_until(f"{name} allocated", partial(drivers.allocated, name), DEADLINE)
            for name in theirs:
                wait_until(f"{name} told", partial(drivers.events, name), DEADLINE)
            taken = [n for n in theirs if drivers.allocated(n)]
            assert taken == []  # was all 16 before the scope rule
            for name in theirs:
                meta = drivers.get(name)["metadata"]
                assert FINALIZER not in (meta.get("finalizers") or []), name
                assert STATUS_ANNOTATION not in (meta.get("annotations") or {}), name
                [event] = drivers.events(name)
                assert event["type"] == "Warning"
                message = event["message"]
                assert (
                    f'DeviceClass "{drivers.other_class}"' in message and drivers.other in message
                )
            # A change of their class looks at them again: still nothing, no second event.
            api.merge_patch(
                path_for(R, "deviceclasses", name=drivers.other_class),
                {"metadata": {"labels": {"touched": "yes"}}},
            )
            drivers.api.delete(path_for(R, "resourceclaims", namespace, "mine-0"))
            drivers.claim("mine-late", drivers.our_class)
            wait_until("mine-late allocated", lambda: drivers.allocated("mine-late"), DEADLINE)
            assert all(len(drivers.events(n)) == 1 for n in theirs)
            assert not [n for n in theirs if drivers.allocated(n)]
        finally:
            drivers.delete_claims()  # while the controller runs: our finalizers go
